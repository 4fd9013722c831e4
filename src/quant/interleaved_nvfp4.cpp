// Interleaved NVFP4 weights (BlockNVFP4x16): the repack the loader runs once per weight matrix and
// the scalar twin of the interleaved matmul kernels. The per-row order is the one-row dot's
// (lowbit_common.inc): eight f32 lanes per row, lane l taking, for every 32-value group in order,
// (sub-block scale * d_a) * float(integer dot of the group's values 4l..4l+3 with their codes),
// then the lanes added as LowBitLaneSum, so every ISA's interleaved kernel gives the scalar
// vec_dot's bits.
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

// Lane l of group g reads chunk 4g + 2 (l / 4) + l % 2 of the block, its low nibbles for
// l % 4 < 2, else its high nibbles (BlockNVFP4x16's layout).
inline int LaneDot(const BlockNVFP4x16& w, int r, int g, int l, const BlockQ8_0Act& a) {
  const int c = 4 * g + 2 * (l / 4) + l % 2;
  const int shift = l % 4 < 2 ? 0 : 4;
  int isum = 0;
  for (int e = 0; e < 4; ++e) {
    isum += kMxfp4Levels[(w.qs[64 * c + 4 * r + e] >> shift) & 0xF] * a.qs[4 * l + e];
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
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // [8 lanes]
      for (int64_t i = 0; i < k / kQKNvfp4; ++i) {
        for (int g = 0; g < 2; ++g) {
          const BlockQ8_0Act& y = a[2 * i + g];
          for (int l = 0; l < 8; ++l) {
            const float scale = kUe4m3Half.v[w[i].d[kRows * (2 * g + l / 4) + r]] * y.d;
            acc[l] += scale * static_cast<float>(LaneDot(w[i], r, g, l, y));
          }
        }
      }
      out[t * out_stride + r] = LowBitLaneSum(acc);
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
