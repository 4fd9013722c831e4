// Interleaved Q1_0 and Q2_0 weights (BlockQ1_0x16, BlockQ2_0x16): the repack the loader runs once
// per weight matrix and the scalar twin of the interleaved matmul kernels. The twin unpacks each
// row of the group back into its plain blocks and runs the scalar vec_dot on it (lowbit.cpp), so
// its outputs are that vec_dot's bits by construction; the AVX-512 kernels
// (interleaved_lowbit_avx512.cpp) compute the same int32 lanes and float steps, so they give
// those bits too. AVX2 keeps plain rows (its one-row kernels in lowbit_avx2.cpp).
#include <cstring>
#include <type_traits>
#include <vector>

#include "quant/kernel_registry.h"
#include "quant/types.h"
#include "util/fp16.h"

namespace lamina::quant_internal {
namespace {

constexpr int kRows = kQ8_0x16Rows;

// Byte-level moves between row r's plain block b and the interleaved block x: f(plain,
// interleaved) for every code byte (BlockQ1_0x16's and BlockQ2_0x16's layouts in types.h).
template <typename P, typename X, typename F>
void Visit(P& b, X& x, int r, F f) {
  const int p = r / 2, h = r % 2;
  f(&b.d, &x.d[r], sizeof(fp16_t));
  if constexpr (std::is_same_v<std::remove_const_t<X>, BlockQ1_0x16>) {
    for (int g = 0; g < 4; ++g) f(&b.qs[4 * g], &x.qs[64 * g + 8 * p + 4 * h], 4);
  }
}

// Q2_0's codes move one at a time: code j of group g of row r (2 bits of plain byte 8g + j / 4)
// is position n = 32h + j of its pair, at bits 2 (n / 16) of interleaved byte n % 16.
void RepackQ2Codes(const BlockQ2_0& b, BlockQ2_0x16& x, int r) {
  const int p = r / 2, h = r % 2;
  for (int g = 0; g < 2; ++g) {
    for (int j = 0; j < 32; ++j) {
      const int code = (b.qs[8 * g + j / 4] >> (2 * (j % 4))) & 3;
      const int n = 32 * h + j;
      uint8_t& dst = x.qs[128 * g + 16 * p + n % 16];
      dst = static_cast<uint8_t>((dst & ~(3 << (2 * (n / 16)))) | (code << (2 * (n / 16))));
    }
  }
}
void UnpackQ2Codes(const BlockQ2_0x16& x, int r, BlockQ2_0& b) {
  const int p = r / 2, h = r % 2;
  std::memset(b.qs, 0, sizeof(b.qs));
  for (int g = 0; g < 2; ++g) {
    for (int j = 0; j < 32; ++j) {
      const int n = 32 * h + j;
      const int code = (x.qs[128 * g + 16 * p + n % 16] >> (2 * (n / 16))) & 3;
      b.qs[8 * g + j / 4] = static_cast<uint8_t>(b.qs[8 * g + j / 4] | (code << (2 * (j % 4))));
    }
  }
}

template <typename B, typename X, int64_t kBlock>
void Repack(const void* src, size_t row_bytes, int64_t k, void* dst) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* out = static_cast<X*>(dst);
  for (int64_t i = 0; i < k / kBlock; ++i) {
    for (int r = 0; r < kRows; ++r) {
      B b;
      std::memcpy(&b, s + r * row_bytes + i * sizeof(B), sizeof(B));
      Visit(b, out[i], r,
            [](const void* plain, void* inter, size_t n) { std::memcpy(inter, plain, n); });
      if constexpr (std::is_same_v<X, BlockQ2_0x16>) RepackQ2Codes(b, out[i], r);
    }
  }
}

// Row r of the group as its plain blocks (k values).
template <typename B, typename X, int64_t kBlock>
void Unpack(const X* group, int r, int64_t k, B* row) {
  for (int64_t i = 0; i < k / kBlock; ++i) {
    Visit(row[i], group[i], r,
          [](void* plain, const void* inter, size_t n) { std::memcpy(plain, inter, n); });
    if constexpr (std::is_same_v<X, BlockQ2_0x16>) UnpackQ2Codes(group[i], r, row[i]);
  }
}

template <typename B, typename X, int64_t kBlock, GgmlType kType>
void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  const VecDotFn dot = GetKernels(kType, Isa::kScalar).vec_dot;
  std::vector<B> row(static_cast<size_t>(k / kBlock));      // [k / kBlock blocks]
  std::vector<BlockQ8_0> q8(static_cast<size_t>(k / kQK));  // [k / 32 blocks]
  for (int t = 0; t < n_act; ++t) {
    // The token's activations back as Q8_0 (d was an fp16 widened exactly).
    const auto* a =
        reinterpret_cast<const BlockQ8_0Act*>(static_cast<const uint8_t*>(act) + t * act_row_bytes);
    for (size_t j = 0; j < q8.size(); ++j) {
      q8[j].d = F32ToFp16(a[j].d);
      std::memcpy(q8[j].qs, a[j].qs, sizeof(q8[j].qs));
    }
    for (int r = 0; r < kRows; ++r) {
      Unpack<B, X, kBlock>(static_cast<const X*>(group), r, k, row.data());
      dot(k, &out[t * out_stride + r], row.data(), q8.data());
    }
  }
}

template <typename B, typename X, int64_t kBlock, GgmlType kType>
void Set(KernelTable& table) {
  TypeKernels& e = table[static_cast<int>(kType)];
  e.interleave_rows = kRows;
  e.repack = Repack<B, X, kBlock>;
  e.gemm_interleaved = Gemm<B, X, kBlock, kType>;
  e.gemm_max_tokens = kMaxMultiDot;
}

}  // namespace

void RegisterScalarInterleavedLowBit(KernelTable& table) {
  Set<BlockQ1_0, BlockQ1_0x16, kQK1_0, GgmlType::kQ1_0>(table);
  Set<BlockQ2_0, BlockQ2_0x16, kQK2_0, GgmlType::kQ2_0>(table);
}

void RegisterAvx2InterleavedLowBit(KernelTable& table) {
  UnsetInterleaved(table, GgmlType::kQ1_0);
  UnsetInterleaved(table, GgmlType::kQ2_0);
}

}  // namespace lamina::quant_internal
