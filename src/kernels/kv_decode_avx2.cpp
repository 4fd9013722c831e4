// AVX2 + F16C KV row decoders (twins of the scalar ones in kv_decode.cpp). Rows whose group
// size is not a multiple of 8 (head_dim < 32 and not 16/8) fall back to the scalar decoder.
#include <immintrin.h>

#include <cstring>

#include "kernels/kv_decode.h"

namespace lamina {

namespace {
void DecodeF16(const uint8_t* row, int n_rows, int head_dim, float* out) {
  const fp16_t* h = reinterpret_cast<const fp16_t*>(row);
  const int64_t n = static_cast<int64_t>(n_rows) * head_dim;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  }
  for (; i < n; ++i) out[i] = Fp16ToF32(h[i]);
}

void DecodeInt8(const uint8_t* row, int n_rows, int head_dim, float* out) {
  const int g = KvGroupSize(head_dim);
  if (g % 8 != 0) {
    for (int r = 0; r < n_rows; ++r) {
      DecodeKvRow(KvRowFormat::kInt8, row + r * KvRowBytes(KvRowFormat::kInt8, head_dim), head_dim,
                  out + static_cast<int64_t>(r) * head_dim);
    }
    return;
  }
  // Rows are whole groups, so n_rows rows are n_rows * head_dim / g consecutive groups.
  const int64_t n_groups = static_cast<int64_t>(n_rows) * (head_dim / g);
  for (int64_t b = 0; b < n_groups; ++b) {
    const uint8_t* grp = row + b * (2 + g);
    fp16_t d16;
    std::memcpy(&d16, grp, 2);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(d16));
    const int8_t* q = reinterpret_cast<const int8_t*>(grp + 2);
    for (int i = 0; i < g; i += 8) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i));
      const __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
      _mm256_storeu_ps(out + b * g + i, _mm256_mul_ps(d, qf));
    }
  }
}

void DecodeQ4(const uint8_t* row, int n_rows, int head_dim, float* out) {
  const int g = KvGroupSize(head_dim);
  if (g % 16 != 0) {
    for (int r = 0; r < n_rows; ++r) {
      DecodeKvRow(KvRowFormat::kQ4_0, row + r * KvRowBytes(KvRowFormat::kQ4_0, head_dim), head_dim,
                  out + static_cast<int64_t>(r) * head_dim);
    }
    return;
  }
  const int64_t n_groups = static_cast<int64_t>(n_rows) * (head_dim / g);
  const int half = g / 2;
  const __m256i eight = _mm256_set1_epi32(8);
  const __m256i low_mask = _mm256_set1_epi32(0x0F);
  for (int64_t b = 0; b < n_groups; ++b) {
    const uint8_t* grp = row + b * (2 + half);
    fp16_t d16;
    std::memcpy(&d16, grp, 2);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(d16));
    const uint8_t* qs = grp + 2;
    for (int i = 0; i < half; i += 8) {
      const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + i)));
      const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(bytes, low_mask), eight);
      const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(bytes, 4), eight);
      _mm256_storeu_ps(out + b * g + i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(lo)));
      _mm256_storeu_ps(out + b * g + i + half, _mm256_mul_ps(d, _mm256_cvtepi32_ps(hi)));
    }
  }
}
}  // namespace

KvRowDecodeFn Avx2KvRowDecoder(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kF32: return nullptr;
    case KvRowFormat::kF16: return DecodeF16;
    case KvRowFormat::kInt8: return DecodeInt8;
    case KvRowFormat::kQ4_0: return DecodeQ4;
  }
  return nullptr;
}

}  // namespace lamina
