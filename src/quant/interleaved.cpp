// Interleaved Q8_0, Q4_0, IQ4_NL, MXFP4 and Q5_0 weights (BlockQ8_0x16, BlockQ4_0x16,
// BlockIQ4_NLx16, BlockMXFP4x16, BlockQ5_0x16): the repack the loader runs once per weight matrix,
// the activation widening (Q8_0ToAct) and the scalar twins of the interleaved matmul kernels. The
// kernels' per-row order is scalar VecDotQ8_0's / VecDotQ4_0's / VecDotTable4's: per block the
// exact integer dot, then sumf += float(sumi) * (d_w * d_a) in block order (the two products
// commute bit for bit), so every ISA's interleaved kernel gives the scalar vec_dot's bits. Q5_0
// keeps each ISA's vec_dot order instead (its SIMD row kernels sum eight float lanes, and its
// interleaved kernels reproduce that): the scalar twin here is VecDotQ5_0's order,
// GemmQ5_0x16Lanes the SIMD one.
#include <cmath>
#include <cstring>

#include "quant/kernel_registry.h"
#include "util/fp16.h"

namespace lamina {

void Q8_0ToAct(const void* q8_row, void* act_row, int64_t k) {
  const auto* x = static_cast<const BlockQ8_0*>(q8_row);
  auto* y = static_cast<BlockQ8_0Act*>(act_row);
  for (int64_t i = 0; i < k / kQK; ++i) {
    int32_t sum = 0;
    for (int j = 0; j < kQK; ++j) sum += x[i].qs[j];
    y[i].d = Fp16ToF32(x[i].d);
    y[i].sum = sum;
    std::memcpy(y[i].qs, x[i].qs, kQK);
  }
}

namespace quant_internal {
namespace {

constexpr int kRows = kQ8_0x16Rows;
constexpr int kChunk = 4;  // elements of a row per 4-byte lane

// The two layouts: where element j of row r lies and its unsigned code u = w + kOffset.
struct Q8_0x16 {
  using Block = BlockQ8_0x16;
  using Src = BlockQ8_0;
  static constexpr int kOffset = 128;
  static int Code(const Block& b, int r, int j) {
    return b.qs[kRows * kChunk * (j / kChunk) + kChunk * r + j % kChunk];
  }
  // The row's 4 bytes of chunk c, as stored (signed codes offset by 128: the sign bit flipped).
  static uint32_t Chunk(const Src& b, int c) {
    uint32_t v;
    std::memcpy(&v, b.qs + kChunk * c, sizeof(v));
    return v ^ 0x80808080u;
  }
  static constexpr int kChunks = kQK / kChunk;
  static void SetScale(Block& out, int r, const Src& b) { out.d[r] = b.d; }
  static float Scale(const Block& b, int r) { return Fp16ToF32(b.d[r]); }
};
struct Q4_0x16 {
  using Block = BlockQ4_0x16;
  using Src = BlockQ4_0;
  static constexpr int kOffset = 8;
  // Element j of row r: Q4_0's nibble order (low nibbles the first half), in the group's layout.
  template <class B>
  static int Code(const B& b, int r, int j) {
    const int jj = j % (kQK / 2);
    const uint8_t v = b.qs[kRows * kChunk * (jj / kChunk) + kChunk * r + jj % kChunk];
    return j < kQK / 2 ? v & 0x0F : v >> 4;
  }
  template <class B>
  static uint32_t Chunk(const B& b, int c) {
    uint32_t v;
    std::memcpy(&v, b.qs + kChunk * c, sizeof(v));
    return v;
  }
  static constexpr int kChunks = kQK / 2 / kChunk;
  static void SetScale(Block& out, int r, const Src& b) { out.d[r] = b.d; }
  static float Scale(const Block& b, int r) { return Fp16ToF32(b.d[r]); }
};

// IQ4_NL: Q4_0's layout, each nibble indexing the levels; u = level + 128.
struct IQ4_NLx16 {
  using Block = BlockIQ4_NLx16;
  using Src = BlockIQ4_NL;
  static constexpr int kOffset = 128;
  static int Code(const Block& b, int r, int j) {
    return kIq4NlLevels[Q4_0x16::Code(b, r, j)] + 128;
  }
  static uint32_t Chunk(const Src& b, int c) { return Q4_0x16::Chunk(b, c); }
  static constexpr int kChunks = Q4_0x16::kChunks;
  static void SetScale(Block& out, int r, const Src& b) { out.d[r] = b.d; }
  static float Scale(const Block& b, int r) { return Fp16ToF32(b.d[r]); }
};

// MXFP4: IQ4_NL's layout with kMxfp4Levels (the doubled E2M1 values) and the E8M0 exponent,
// halved, as the scale.
struct MXFP4x16 {
  using Block = BlockMXFP4x16;
  using Src = BlockMXFP4;
  static constexpr int kOffset = 128;
  static int Code(const Block& b, int r, int j) {
    return kMxfp4Levels[Q4_0x16::Code(b, r, j)] + 128;
  }
  static uint32_t Chunk(const Src& b, int c) { return Q4_0x16::Chunk(b, c); }
  static constexpr int kChunks = Q4_0x16::kChunks;
  static void SetScale(Block& out, int r, const Src& b) { out.e[r] = b.e; }
  static float Scale(const Block& b, int r) { return E8M0ToF32Half(b.e[r]); }
};

// Q5_0: row-major fields per block (BlockQ5_0x16); u = q + 16 = nibble | fifth bit << 4.
struct Q5_0x16 {
  using Block = BlockQ5_0x16;
  static constexpr int kOffset = 16;
  static int Code(const Block& b, int r, int j) {
    const int jj = j % (kQK / 2);
    const uint8_t v = b.qs[kQK / 2 * r + jj];
    const int nib = j < kQK / 2 ? v & 0x0F : v >> 4;
    return nib | (b.qh[kQK / 8 * r + j / 8] >> (j % 8) & 1) << 4;
  }
  static float Scale(const Block& b, int r) { return Fp16ToF32(b.d[r]); }
};

template <class L>
void Repack(const void* src, size_t row_bytes, int64_t k, void* dst) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* out = static_cast<typename L::Block*>(dst);
  for (int64_t i = 0; i < k / kQK; ++i) {
    for (int r = 0; r < kRows; ++r) {
      const auto* b = reinterpret_cast<const typename L::Src*>(s + r * row_bytes) + i;
      L::SetScale(out[i], r, *b);
      for (int c = 0; c < L::kChunks; ++c) {
        const uint32_t v = L::Chunk(*b, c);
        std::memcpy(out[i].qs + kRows * kChunk * c + kChunk * r, &v, sizeof(v));
      }
    }
  }
}

// Row r's exact integer dot with one activation block: sum((u - C) q) = sum(u q) - C sum(q).
template <class L>
inline int32_t BlockDot(const typename L::Block& w, int r, const BlockQ8_0Act& a) {
  int32_t sumi = -L::kOffset * a.sum;
  for (int j = 0; j < kQK; ++j) sumi += L::Code(w, r, j) * a.qs[j];
  return sumi;
}

template <class L>
void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  const auto* w = static_cast<const typename L::Block*>(group);
  const int64_t nb = k / kQK;
  for (int t = 0; t < n_act; ++t) {
    const auto* a =
        reinterpret_cast<const BlockQ8_0Act*>(static_cast<const char*>(act) + t * act_row_bytes);
    for (int r = 0; r < kRows; ++r) {
      float sumf = 0.0f;
      for (int64_t i = 0; i < nb; ++i) {
        sumf += static_cast<float>(BlockDot<L>(w[i], r, a[i])) * (L::Scale(w[i], r) * a[i].d);
      }
      out[t * out_stride + r] = sumf;
    }
  }
}

}  // namespace

void RepackQ5_0x16(const void* src, size_t row_bytes, int64_t k, void* dst) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* out = static_cast<BlockQ5_0x16*>(dst);
  for (int64_t i = 0; i < k / kQK; ++i) {
    for (int r = 0; r < kRows; ++r) {
      const auto* b = reinterpret_cast<const BlockQ5_0*>(s + r * row_bytes) + i;
      out[i].d[r] = b->d;
      std::memcpy(out[i].qh + kQK / 8 * r, b->qh, kQK / 8);
      std::memcpy(out[i].qs + kQK / 2 * r, b->qs, kQK / 2);
    }
  }
}

// The SIMD Q5_0 vec_dot's order (legacy_quant_dot.inc, both ISAs): per row eight float lanes,
// lane c accumulating fma(float(dot of elements 4c..4c+3), d_w * d_a, lane) in block order, then
// HsumPs's tree ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), plus 0.0f.
void GemmQ5_0x16Lanes(int64_t k, const void* group, const void* act, size_t act_row_bytes,
                      int n_act, float* out, size_t out_stride) {
  const auto* w = static_cast<const BlockQ5_0x16*>(group);
  const int64_t nb = k / kQK;
  for (int t = 0; t < n_act; ++t) {
    const auto* a =
        reinterpret_cast<const BlockQ8_0Act*>(static_cast<const char*>(act) + t * act_row_bytes);
    for (int r = 0; r < kRows; ++r) {
      float lane[8] = {};
      for (int64_t i = 0; i < nb; ++i) {
        const float scale = Fp16ToF32(w[i].d[r]) * a[i].d;
        for (int c = 0; c < 8; ++c) {
          int32_t dot = 0;
          for (int e = 0; e < kChunk; ++e) {
            const int j = kChunk * c + e;
            dot += (Q5_0x16::Code(w[i], r, j) - Q5_0x16::kOffset) * a[i].qs[j];
          }
          lane[c] = std::fma(static_cast<float>(dot), scale, lane[c]);
        }
      }
      const float v0 = lane[0] + lane[4], v1 = lane[1] + lane[5];
      const float v2 = lane[2] + lane[6], v3 = lane[3] + lane[7];
      out[t * out_stride + r] = ((v0 + v2) + (v1 + v3)) + 0.0f;
    }
  }
}

void RegisterScalarInterleaved(KernelTable& table) {
  TypeKernels& q8 = table[static_cast<int>(GgmlType::kQ8_0)];
  q8.interleave_rows = kRows;
  q8.repack = Repack<Q8_0x16>;
  q8.gemm_interleaved = Gemm<Q8_0x16>;
  TypeKernels& q4 = table[static_cast<int>(GgmlType::kQ4_0)];
  q4.interleave_rows = kRows;
  q4.repack = Repack<Q4_0x16>;
  q4.gemm_interleaved = Gemm<Q4_0x16>;
  TypeKernels& nl = table[static_cast<int>(GgmlType::kIQ4_NL)];
  nl.interleave_rows = kRows;
  nl.repack = Repack<IQ4_NLx16>;
  nl.gemm_interleaved = Gemm<IQ4_NLx16>;
  TypeKernels& mx = table[static_cast<int>(GgmlType::kMXFP4)];
  mx.interleave_rows = kRows;
  mx.repack = Repack<MXFP4x16>;
  mx.gemm_interleaved = Gemm<MXFP4x16>;
  TypeKernels& q5 = table[static_cast<int>(GgmlType::kQ5_0)];
  q5.interleave_rows = kRows;
  q5.repack = RepackQ5_0x16;
  q5.gemm_interleaved = Gemm<Q5_0x16>;
}

}  // namespace quant_internal
}  // namespace lamina
