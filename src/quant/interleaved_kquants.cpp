// Interleaved Q4_K, Q5_K, Q6_K and IQ4_XS weights (BlockQ4_Kx16, BlockQ5_Kx16, BlockQ6_Kx16,
// BlockIQ4_XSx16): the repack the loader runs once per weight matrix and the scalar twins of their
// matmul kernels, which read Q8_K activation rows. The canonical per-row order, the same for every
// ISA and batch size: per super-block the exact integer sums (Q4_K and Q5_K: sumi = sum_j sc_j *
// dot_j over the eight 32-value groups and summ = sum_j mn_j * (bsums[2j] + bsums[2j + 1]); Q6_K:
// sumi = sum_g sc_g * (dot_g - 32 bsums[g]) over the sixteen 16-value groups; IQ4_XS: sumi =
// sum_j (ls_j - 32) * dot_j, dot_j over the levels, GGML's reference order), then in super-block
// order sumf += float(sumi) * (d_w * d_a) and, Q4_K / Q5_K, sumf -= float(summ) * (dmin_w * d_a).
#include <cstring>
#include <type_traits>

#include "quant/kernel_registry.h"
#include "util/fp16.h"

namespace lamina::quant_internal {
namespace {

constexpr int kRows = kQ8_0x16Rows;
constexpr int kChunk = 4;  // bytes of a row per 4-byte lane

// Copies n bytes of one row (n a multiple of 4) into the group's lane layout: byte j of row r
// lands at dst[64 * (j / 4) + 4 * r + j % 4].
inline void ScatterRow(const uint8_t* src, int n, int r, uint8_t* dst) {
  for (int c = 0; c < n / kChunk; ++c) {
    std::memcpy(dst + kRows * kChunk * c + kChunk * r, src + kChunk * c, kChunk);
  }
}
// The inverse for one byte: byte j of row r.
inline uint8_t LaneByte(const uint8_t* p, int r, int j) {
  return p[kRows * kChunk * (j / kChunk) + kChunk * r + j % kChunk];
}

// Q4_K (Src BlockQ4_K, Dst BlockQ4_Kx16) and Q5_K (with qh).
template <class Src, class Dst>
void RepackQ45K(const void* src, size_t row_bytes, int64_t k, void* dst) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* out = static_cast<Dst*>(dst);
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    for (int r = 0; r < kRows; ++r) {
      const auto* b = reinterpret_cast<const Src*>(s + r * row_bytes) + i;
      out[i].d[r] = b->d;
      out[i].dmin[r] = b->dmin;
      ScatterRow(b->scales, kKScaleSize, r, out[i].scales);
      if constexpr (std::is_same_v<Src, BlockQ5_K>) ScatterRow(b->qh, kQK_K / 8, r, out[i].qh);
      ScatterRow(b->qs, kQK_K / 2, r, out[i].qs);
    }
  }
}

void RepackQ6K(const void* src, size_t row_bytes, int64_t k, void* dst) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* out = static_cast<BlockQ6_Kx16*>(dst);
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    for (int r = 0; r < kRows; ++r) {
      const auto* b = reinterpret_cast<const BlockQ6_K*>(s + r * row_bytes) + i;
      out[i].d[r] = b->d;
      for (int g = 0; g < kQK_K / 16; ++g) out[i].scales[kRows * g + r] = b->scales[g];
      ScatterRow(b->ql, kQK_K / 2, r, out[i].ql);
      ScatterRow(b->qh, kQK_K / 4, r, out[i].qh);
    }
  }
}

// Row r's 6-bit scale and min of 32-value group j (Q4_K's packing of the 12 bytes).
template <class Block>
inline void ScaleMinQ4K(const Block& w, int r, int j, int* sc, int* mn) {
  auto q = [&](int x) { return LaneByte(w.scales, r, x); };
  if (j < 4) {
    *sc = q(j) & 63;
    *mn = q(j + 4) & 63;
  } else {
    *sc = (q(j + 4) & 0xF) | ((q(j - 4) >> 6) << 4);
    *mn = (q(j + 4) >> 4) | ((q(j) >> 6) << 4);
  }
}

// Element e (< 256) of row r: its 4-bit code (Q5_K: with the fifth bit, 5 bits).
template <class Block>
inline int CodeQ45K(const Block& w, int r, int e) {
  const uint8_t v = LaneByte(w.qs, r, 32 * (e / 64) + e % 32);
  int code = (e % 64) < 32 ? v & 0xF : v >> 4;
  if constexpr (std::is_same_v<Block, BlockQ5_Kx16>) {
    code |= ((LaneByte(w.qh, r, e % 32) >> (e / 32)) & 1) << 4;
  }
  return code;
}

// Element e of row r: its unsigned 6-bit code u (the value is d * sc * (u - 32)).
inline int CodeQ6K(const BlockQ6_Kx16& w, int r, int e) {
  const int half = e / 128, quarter = (e % 128) / 32, l = e % 32;
  const uint8_t lb = LaneByte(w.ql, r, 64 * half + 32 * (quarter % 2) + l);
  const int low = quarter < 2 ? lb & 0xF : lb >> 4;
  const int high = (LaneByte(w.qh, r, 32 * half + l) >> (2 * quarter)) & 3;
  return low | (high << 4);
}

template <class Block>
float DotQ45K(const Block* w, int r, const BlockQ8_K* a, int64_t nb) {
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t sumi = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      ScaleMinQ4K(w[i], r, j, &sc, &mn);
      int32_t dot = 0;
      for (int e = 32 * j; e < 32 * j + 32; ++e) dot += CodeQ45K(w[i], r, e) * a[i].qs[e];
      sumi += sc * dot;
      summ += mn * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
    }
    sumf += static_cast<float>(sumi) * (Fp16ToF32(w[i].d[r]) * a[i].d);
    sumf -= static_cast<float>(summ) * (Fp16ToF32(w[i].dmin[r]) * a[i].d);
  }
  return sumf;
}

float DotQ6K(const BlockQ6_Kx16* w, int r, const BlockQ8_K* a, int64_t nb) {
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t sumi = 0;
    for (int g = 0; g < kQK_K / 16; ++g) {
      int32_t dot = -32 * a[i].bsums[g];
      for (int e = 16 * g; e < 16 * g + 16; ++e) dot += CodeQ6K(w[i], r, e) * a[i].qs[e];
      sumi += w[i].scales[kRows * g + r] * dot;
    }
    sumf += static_cast<float>(sumi) * (Fp16ToF32(w[i].d[r]) * a[i].d);
  }
  return sumf;
}

// IQ4_XS: rows' d, scales_h, scales_l lanes and qs in the group's layout (BlockIQ4_XSx16).
void RepackIQ4XS(const void* src, size_t row_bytes, int64_t k, void* dst) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* out = static_cast<BlockIQ4_XSx16*>(dst);
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    for (int r = 0; r < kRows; ++r) {
      const auto* b = reinterpret_cast<const BlockIQ4_XS*>(s + r * row_bytes) + i;
      out[i].d[r] = b->d;
      out[i].scales_h[r] = b->scales_h;
      ScatterRow(b->scales_l, kQK_K / 64, r, out[i].scales_l);
      ScatterRow(b->qs, kQK_K / 2, r, out[i].qs);
    }
  }
}

// Row r's signed scale of 32-value group j: the 6-bit ls - 32.
inline int ScaleIQ4XS(const BlockIQ4_XSx16& w, int r, int j) {
  uint32_t lo;
  std::memcpy(&lo, w.scales_l + kChunk * r, sizeof(lo));
  const int ls =
      static_cast<int>(((lo >> (4 * j)) & 0xF) | (((w.scales_h[r] >> (2 * j)) & 3) << 4));
  return ls - 32;
}

// Element e (< 256) of row r: its level.
inline int LevelIQ4XS(const BlockIQ4_XSx16& w, int r, int e) {
  const uint8_t v = LaneByte(w.qs, r, 16 * (e / 32) + e % 16);
  return kIq4NlLevels[(e % 32) < 16 ? v & 0xF : v >> 4];
}

float DotIQ4XS(const BlockIQ4_XSx16* w, int r, const BlockQ8_K* a, int64_t nb) {
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t sumi = 0;
    for (int j = 0; j < 8; ++j) {
      int32_t dot = 0;
      for (int e = 32 * j; e < 32 * j + 32; ++e) dot += LevelIQ4XS(w[i], r, e) * a[i].qs[e];
      sumi += ScaleIQ4XS(w[i], r, j) * dot;
    }
    sumf += static_cast<float>(sumi) * (Fp16ToF32(w[i].d[r]) * a[i].d);
  }
  return sumf;
}

template <class Block, float (*kDot)(const Block*, int, const BlockQ8_K*, int64_t)>
void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  const auto* w = static_cast<const Block*>(group);
  for (int t = 0; t < n_act; ++t) {
    const auto* a =
        reinterpret_cast<const BlockQ8_K*>(static_cast<const char*>(act) + t * act_row_bytes);
    for (int r = 0; r < kRows; ++r) out[t * out_stride + r] = kDot(w, r, a, k / kQK_K);
  }
}

}  // namespace

void RegisterScalarInterleavedK(KernelTable& table) {
  TypeKernels& q4 = table[static_cast<int>(GgmlType::kQ4_K)];
  q4.interleave_rows = kRows;
  q4.repack = RepackQ45K<BlockQ4_K, BlockQ4_Kx16>;
  q4.gemm_interleaved = Gemm<BlockQ4_Kx16, DotQ45K<BlockQ4_Kx16>>;
  TypeKernels& q5 = table[static_cast<int>(GgmlType::kQ5_K)];
  q5.interleave_rows = kRows;
  q5.repack = RepackQ45K<BlockQ5_K, BlockQ5_Kx16>;
  q5.gemm_interleaved = Gemm<BlockQ5_Kx16, DotQ45K<BlockQ5_Kx16>>;
  TypeKernels& q6 = table[static_cast<int>(GgmlType::kQ6_K)];
  q6.interleave_rows = kRows;
  q6.repack = RepackQ6K;
  q6.gemm_interleaved = Gemm<BlockQ6_Kx16, DotQ6K>;
  TypeKernels& xs = table[static_cast<int>(GgmlType::kIQ4_XS)];
  xs.interleave_rows = kRows;
  xs.repack = RepackIQ4XS;
  xs.gemm_interleaved = Gemm<BlockIQ4_XSx16, DotIQ4XS>;
}

}  // namespace lamina::quant_internal
