// AVX2 kernels for interleaved Q8_0, Q4_0, IQ4_NL and MXFP4 weights (BlockQ8_0x16, ...): the 16-row
// group as two halves of 8 rows, one 256-bit lane per row. Per 4-element chunk one 32-byte load
// of a half's codes (Q8_0: made signed again, w = u - 128, and split into |w| and sign; Q4_0:
// the nibbles, unsigned) serves every token, whose 4 codes are
// broadcast to all lanes and multiplied by maddubs and madd: exact int32 block dots per row. Then
// per block and token: convert, (d_w * d_a), multiply and add, lane by lane as the scalar twin (no
// FMA), so every output is the scalar vec_dot's bits.
#include <immintrin.h>

#include <cstring>

#include "quant/kernel_registry.h"

namespace lamina::quant_internal {
namespace {

constexpr int kRows = kQ8_0x16Rows;
constexpr int kTokens = 4;  // tokens per register block: 4 float + 4 int accumulators

inline __m256i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm256_set1_epi32(v);
}

// Rows [8h, 8h + 8)'s fp16 scales as f32.
inline __m256 Fp16Scales(const fp16_t* d) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d)));
}

// Rows [8h, 8h + 8) of chunk c, as the two maddubs operands: x unsigned, and the token's codes
// q with the sign of the weight folded in (Q8_0: x = |w|, q * sign(w)), so maddubs(x, q') sums
// w * q in pairs without saturating; Q4_0 codes are unsigned already (u = w + 8, corrected by
// the -8 * sum(q) start value).
struct Q8_0x16 {
  using Block = BlockQ8_0x16;
  static constexpr int kOffset = 0;  // the codes are made signed again here
  struct Codes {
    __m256i x, s;
    __m256i Signed(__m256i q) const { return _mm256_sign_epi8(q, s); }
  };
  static Codes Load(const Block& w, int h, int c) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs + 64 * c + 32 * h));
    const __m256i s = _mm256_xor_si256(u, _mm256_set1_epi8(static_cast<char>(0x80)));
    return {_mm256_sign_epi8(s, s), s};
  }
  static __m256 Scales(const Block& w, int h) { return Fp16Scales(w.d + 8 * h); }
};
struct Q4_0x16 {
  using Block = BlockQ4_0x16;
  static constexpr int kOffset = 8;
  struct Codes {
    __m256i x;
    __m256i Signed(__m256i q) const { return q; }
  };
  static Codes Load(const Block& w, int h, int c) {
    const __m256i v =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs + 64 * (c % 4) + 32 * h));
    return {_mm256_and_si256(c < 4 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F))};
  }
  static __m256 Scales(const Block& w, int h) { return Fp16Scales(w.d + 8 * h); }
};

// A 4-bit table type's chunk c, rows [8h, 8h + 8) (nibbles as BlockQ4_0x16's): the levels,
// signed, by an in-lane byte shuffle, then split as Q8_0's codes.
inline Q8_0x16::Codes TableCodes(const int8_t* levels, const uint8_t* qs, int h, int c) {
  const __m256i v =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 64 * (c % 4) + 32 * h));
  const __m256i nib = _mm256_and_si256(c < 4 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
  const __m256i s = _mm256_shuffle_epi8(
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(levels))), nib);
  return {_mm256_sign_epi8(s, s), s};
}

// IQ4_NL: TableCodes with its levels.
struct IQ4_NLx16 {
  using Block = BlockIQ4_NLx16;
  static constexpr int kOffset = 0;
  using Codes = Q8_0x16::Codes;
  static Codes Load(const Block& w, int h, int c) { return TableCodes(kIq4NlLevels, w.qs, h, c); }
  static __m256 Scales(const Block& w, int h) { return Fp16Scales(w.d + 8 * h); }
};

// MXFP4: the E2M1 levels the same way; the scale is E8M0ToF32Half of the row's exponent e, built
// as its f32 bits: (e - 1) << 23, or for e < 2 the subnormals 0x00200000 << e.
struct MXFP4x16 {
  using Block = BlockMXFP4x16;
  static constexpr int kOffset = 0;
  using Codes = Q8_0x16::Codes;
  static Codes Load(const Block& w, int h, int c) { return TableCodes(kMxfp4Levels, w.qs, h, c); }
  static __m256 Scales(const Block& w, int h) {
    int64_t bytes;
    std::memcpy(&bytes, w.e + 8 * h, sizeof(bytes));
    const __m256i e = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, tiny));
  }
};

// Rows [8h, 8h + 8) of one block against N tokens: acc[t] += float(dot) * (d_w * d_a[t]).
template <class L, int N>
inline void HalfBlockStep(const typename L::Block& w, int h, const BlockQ8_0Act* const* a,
                          int64_t i, __m256* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i sum[N];
  for (int t = 0; t < N; ++t) sum[t] = _mm256_set1_epi32(-L::kOffset * a[t][i].sum);
#pragma GCC unroll 8
  for (int c = 0; c < 8; ++c) {
    const typename L::Codes codes = L::Load(w, h, c);
#pragma GCC unroll 4
    for (int t = 0; t < N; ++t) {
      const __m256i q = codes.Signed(Broadcast4(a[t][i].qs + 4 * c));
      sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(codes.x, q), ones));
    }
  }
  const __m256 dw = L::Scales(w, h);
#pragma GCC unroll 4
  for (int t = 0; t < N; ++t) {
    const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(a[t][i].d));
    acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_cvtepi32_ps(sum[t]), scale));
  }
}

template <class L, int N>
void GemmHalfN(int64_t nb, const typename L::Block* w, int h, const char* act, size_t act_row_bytes,
               float* out, size_t out_stride) {
  const BlockQ8_0Act* a[N];
  __m256 acc[N];
  for (int t = 0; t < N; ++t) {
    a[t] = reinterpret_cast<const BlockQ8_0Act*>(act + t * act_row_bytes);
    acc[t] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < nb; ++i) HalfBlockStep<L, N>(w[i], h, a, i, acc);
  for (int t = 0; t < N; ++t) _mm256_storeu_ps(out + t * out_stride + 8 * h, acc[t]);
}

template <class L>
void GemmHalf(int64_t nb, const typename L::Block* w, int h, const char* a, size_t stride, int n,
              float* out, size_t out_stride) {
  switch (n) {
    case 1:
      return GemmHalfN<L, 1>(nb, w, h, a, stride, out, out_stride);
    case 2:
      return GemmHalfN<L, 2>(nb, w, h, a, stride, out, out_stride);
    case 3:
      return GemmHalfN<L, 3>(nb, w, h, a, stride, out, out_stride);
    default:
      return GemmHalfN<L, 4>(nb, w, h, a, stride, out, out_stride);
  }
}

template <class L>
void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  const auto* w = static_cast<const typename L::Block*>(group);
  const char* a = static_cast<const char*>(act);
  const int64_t nb = k / kQK;
  for (int t = 0; t < n_act; t += kTokens) {
    const int n = n_act - t < kTokens ? n_act - t : kTokens;
    for (int h = 0; h < kRows / 8; ++h) {
      GemmHalf<L>(nb, w, h, a + t * act_row_bytes, act_row_bytes, n, out + t * out_stride,
                  out_stride);
    }
  }
}

}  // namespace

void RegisterAvx2Interleaved(KernelTable& table) {
  table[static_cast<int>(GgmlType::kQ8_0)].gemm_interleaved = Gemm<Q8_0x16>;
  table[static_cast<int>(GgmlType::kQ4_0)].gemm_interleaved = Gemm<Q4_0x16>;
  table[static_cast<int>(GgmlType::kIQ4_NL)].gemm_interleaved = Gemm<IQ4_NLx16>;
  table[static_cast<int>(GgmlType::kMXFP4)].gemm_interleaved = Gemm<MXFP4x16>;
  // Q5_0 stays in plain rows here: the AVX2 row kernel's eight float lanes per row already
  // decode a block once for up to 8 tokens, and an interleaved kernel in that order would do the
  // same work (interleaved.cpp).
  TypeKernels& q5 = table[static_cast<int>(GgmlType::kQ5_0)];
  q5.interleave_rows = 0;
  q5.repack = nullptr;
  q5.gemm_interleaved = nullptr;
}

}  // namespace lamina::quant_internal
