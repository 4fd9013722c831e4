// Interleaved Q8_0 weights (BlockQ8_0x16): the repack the loader runs once per weight matrix,
// the activation widening (Q8_0ToAct) and the scalar twin of the interleaved matmul kernel.
// The kernel's per-row order is scalar VecDotQ8_0's: per block the exact integer dot, then
// sumf += float(sumi) * (d_w * d_a) in block order, so every ISA's interleaved kernel gives the
// scalar vec_dot's bits.
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

void RepackQ8_0x16(const void* src, size_t row_bytes, int64_t k, void* dst) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* out = static_cast<BlockQ8_0x16*>(dst);
  for (int64_t i = 0; i < k / kQK; ++i) {
    for (int r = 0; r < kRows; ++r) {
      const auto* b = reinterpret_cast<const BlockQ8_0*>(s + r * row_bytes) + i;
      out[i].d[r] = b->d;
      for (int c = 0; c < kQK / kChunk; ++c) {
        uint32_t v;  // 4 codes, each offset by 128 (the sign bit flipped)
        std::memcpy(&v, b->qs + kChunk * c, sizeof(v));
        v ^= 0x80808080u;
        std::memcpy(out[i].qs + kRows * kChunk * c + kChunk * r, &v, sizeof(v));
      }
    }
  }
}

// Row r's exact integer dot with one activation block: sum((u - 128) q) = sum(u q) - 128 sum(q).
inline int32_t BlockDot(const BlockQ8_0x16& w, int r, const BlockQ8_0Act& a) {
  int32_t sumi = -128 * a.sum;
  for (int j = 0; j < kQK; ++j) {
    const int c = j / kChunk, e = j % kChunk;
    sumi += static_cast<int32_t>(w.qs[kRows * kChunk * c + kChunk * r + e]) * a.qs[j];
  }
  return sumi;
}

void GemmQ8_0x16(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
                 float* out, size_t out_stride) {
  const auto* w = static_cast<const BlockQ8_0x16*>(group);
  const int64_t nb = k / kQK;
  for (int t = 0; t < n_act; ++t) {
    const auto* a =
        reinterpret_cast<const BlockQ8_0Act*>(static_cast<const char*>(act) + t * act_row_bytes);
    for (int r = 0; r < kRows; ++r) {
      float sumf = 0.0f;
      for (int64_t i = 0; i < nb; ++i) {
        sumf += static_cast<float>(BlockDot(w[i], r, a[i])) * (Fp16ToF32(w[i].d[r]) * a[i].d);
      }
      out[t * out_stride + r] = sumf;
    }
  }
}

}  // namespace

void RegisterScalarInterleaved(KernelTable& table) {
  TypeKernels& q8 = table[static_cast<int>(GgmlType::kQ8_0)];
  q8.interleave_rows = kRows;
  q8.repack = RepackQ8_0x16;
  q8.gemm_interleaved = GemmQ8_0x16;
}

}  // namespace quant_internal
}  // namespace lamina
