// Interleaved NVFP4 weights (BlockNVFP4x16): the repack the loader runs once per weight matrix and
// the scalar twin of the interleaved matmul kernels. The per-row order is the one-row dot's
// (lowbit_common.inc): one f32 accumulator per row, taking for every 16-value sub-block in order
// (sub-block scale * d_a) * float(integer dot of its 16 values with their codes), so every ISA's
// interleaved kernel gives the scalar vec_dot's bits.
#include <cstring>

#include "quant/kernel_registry.h"
#include "util/fp16.h"

namespace lamina::quant_internal {
namespace {

#include "quant/lowbit_common.inc"

constexpr int kRows = kQ8_0x16Rows;
constexpr int kSubs = kQKNvfp4 / kQKNvfp4Sub;  // UE4M3 scales per block

void Repack(const void* src, size_t row_bytes, int64_t k, void* dst) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* out = static_cast<BlockNVFP4x16*>(dst);
  for (int64_t i = 0; i < k / kQKNvfp4; ++i) {
    for (int r = 0; r < kRows; ++r) {
      const auto* b = reinterpret_cast<const BlockNVFP4*>(s + r * row_bytes) + i;
      for (int sb = 0; sb < kSubs; ++sb) out[i].d[kRows * sb + r] = b->d[sb];
      for (int c = 0; c < 8; ++c) std::memcpy(out[i].qs + 64 * c + 4 * r, b->qs + 4 * c, 4);
    }
  }
}

// Row r's integer dot of sub-block sb with its 16 activation codes: chunks 2 sb + h (h < 2) hold
// its elements 4h + e in their low nibbles and 8 + 4h + e in their high ones.
inline int SubDot(const BlockNVFP4x16& w, int r, int sb, const BlockQ8_0Act& a) {
  const int8_t* q = a.qs + 16 * (sb % 2);
  int isum = 0;
  for (int h = 0; h < 2; ++h) {
    for (int e = 0; e < 4; ++e) {
      const uint8_t byte = w.qs[64 * (2 * sb + h) + 4 * r + e];
      isum += kMxfp4Levels[byte & 0xF] * q[4 * h + e];
      isum += kMxfp4Levels[byte >> 4] * q[8 + 4 * h + e];
    }
  }
  return isum;
}

void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  const auto* w = static_cast<const BlockNVFP4x16*>(group);
  for (int t = 0; t < n_act; ++t) {
    const auto* a =
        reinterpret_cast<const BlockQ8_0Act*>(static_cast<const char*>(act) + t * act_row_bytes);
    for (int r = 0; r < kRows; ++r) {
      float acc = 0.0f;
      for (int64_t i = 0; i < k / kQKNvfp4; ++i) {
        for (int sb = 0; sb < kSubs; ++sb) {
          const BlockQ8_0Act& y = a[2 * i + sb / 2];
          const float scale = kUe4m3Half.v[w[i].d[kRows * sb + r]] * y.d;
          acc += scale * static_cast<float>(SubDot(w[i], r, sb, y));
        }
      }
      out[t * out_stride + r] = acc;
    }
  }
}

}  // namespace

void RegisterScalarInterleavedNvfp4(KernelTable& table) {
  TypeKernels& e = table[static_cast<int>(GgmlType::kNVFP4)];
  e.interleave_rows = kRows;
  e.repack = Repack;
  e.gemm_interleaved = Gemm;
}

}  // namespace lamina::quant_internal
