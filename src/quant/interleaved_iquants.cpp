// Interleaved lattice i-quant weights (BlockIQ2_XXSx16, BlockIQ2_XSx16, BlockIQ2_Sx16,
// BlockIQ3_XXSx16, BlockIQ3_Sx16, BlockIQ1_Sx16, BlockIQ1_Mx16): the repack the loader runs once
// per weight matrix and the scalar twin of the interleaved matmul kernels. The twin unpacks each
// row of the group back into its plain blocks and runs the scalar vec_dot on it (iquants.cpp), so
// its outputs are that vec_dot's bits by construction; the SIMD kernels compute the same exact
// integer per super-block and the same float steps, so they give those bits too
// (interleaved_iquants_avx2.cpp, interleaved_iquants_avx512.cpp).
#include "quant/interleaved_iquants.h"

#include <cstring>
#include <type_traits>
#include <vector>

#include "quant/kernel_registry.h"
#include "quant/types.h"

namespace lamina::quant_internal {
namespace {

constexpr int kRows = kQ8_0x16Rows;

// Each type's fields as (plain bytes, interleaved bytes, size) pieces of row r's super-block:
// Visit calls f(plain, interleaved, n) for every piece, so one walk serves repack (x written)
// and unpack (x const).
template <typename P, typename X, typename F>
requires std::is_same_v<std::remove_const_t<X>, BlockIQ2_XXSx16>
void Visit(P& b, X& x, int r, F f) {
  auto* q = reinterpret_cast<uint8_t*>(b.qs);  // [64 bytes]
  f(&b.d, &x.d[r], sizeof(fp16_t));
  for (int g = 0; g < kQK_K / 32; ++g) {
    for (int l = 0; l < 4; ++l) f(q + 8 * g + l, &x.grid[kRows * (4 * g + l) + r], 1);
    f(q + 8 * g + 4, &x.sw[kRows * g + r], 4);
  }
}

template <typename P, typename X, typename F>
requires std::is_same_v<std::remove_const_t<X>, BlockIQ2_XSx16>
void Visit(P& b, X& x, int r, F f) {
  f(&b.d, &x.d[r], sizeof(fp16_t));
  for (int e = 0; e < kQK_K / 8; ++e) f(&b.qs[e], &x.qs[kRows * e + r], 2);
  for (int g = 0; g < kQK_K / 32; ++g) f(&b.scales[g], &x.scales[kRows * g + r], 1);
}

template <typename P, typename X, typename F>
requires std::is_same_v<std::remove_const_t<X>, BlockIQ3_XXSx16>
void Visit(P& b, X& x, int r, F f) {
  f(&b.d, &x.d[r], sizeof(fp16_t));
  for (int p = 0; p < kQK_K / 4; ++p) f(&b.qs[p], &x.grid[kRows * p + r], 1);
  for (int g = 0; g < kQK_K / 32; ++g) f(&b.qs[kQK_K / 4 + 4 * g], &x.sw[kRows * g + r], 4);
}

template <typename P, typename X, typename F>
requires std::is_same_v<std::remove_const_t<X>, BlockIQ3_Sx16>
void Visit(P& b, X& x, int r, F f) {
  f(&b.d, &x.d[r], sizeof(fp16_t));
  for (int p = 0; p < kQK_K / 4; ++p) f(&b.qs[p], &x.grid[kRows * p + r], 1);
  for (int g = 0; g < kQK_K / 32; ++g) f(&b.qh[g], &x.qh[kRows * g + r], 1);
  for (int e = 0; e < kQK_K / 8; ++e) f(&b.signs[e], &x.signs[kRows * e + r], 1);
  f(b.scales, &x.scales[r], 4);
}

template <typename P, typename X, typename F>
requires std::is_same_v<std::remove_const_t<X>, BlockIQ2_Sx16>
void Visit(P& b, X& x, int r, F f) {
  f(&b.d, &x.d[r], sizeof(fp16_t));
  for (int e = 0; e < kQK_K / 8; ++e) {
    f(&b.qs[e], &x.grid[kRows * e + r], 1);
    f(&b.qs[kQK_K / 8 + e], &x.signs[kRows * e + r], 1);
  }
  for (int g = 0; g < kQK_K / 32; ++g) {
    f(&b.qh[g], &x.qh[kRows * g + r], 1);
    f(&b.scales[g], &x.scales[kRows * g + r], 1);
  }
}

template <typename P, typename X, typename F>
requires std::is_same_v<std::remove_const_t<X>, BlockIQ1_Sx16>
void Visit(P& b, X& x, int r, F f) {
  f(&b.d, &x.d[r], sizeof(fp16_t));
  for (int e = 0; e < kQK_K / 8; ++e) f(&b.qs[e], &x.grid[kRows * e + r], 1);
  for (int g = 0; g < kQK_K / 32; ++g) f(&b.qh[g], &x.qh[kRows * g + r], 2);
}

template <typename P, typename X, typename F>
requires std::is_same_v<std::remove_const_t<X>, BlockIQ1_Mx16>
void Visit(P& b, X& x, int r, F f) {
  for (int e = 0; e < kQK_K / 8; ++e) f(&b.qs[e], &x.grid[kRows * e + r], 1);
  for (int j = 0; j < kQK_K / 16; ++j) f(&b.qh[j], &x.qh[kRows * j + r], 1);
  for (int w = 0; w < kQK_K / 64; ++w) f(&b.scales[2 * w], &x.scales[kRows * w + r], 2);
}

template <typename B, typename X>
void Repack(const void* src, size_t row_bytes, int64_t k, void* dst) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* out = static_cast<X*>(dst);
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    for (int r = 0; r < kRows; ++r) {
      B b;
      std::memcpy(&b, s + r * row_bytes + i * sizeof(B), sizeof(B));
      Visit(b, out[i], r,
            [](const void* plain, void* inter, size_t n) { std::memcpy(inter, plain, n); });
    }
  }
}

// Row r of the group as its plain blocks (k values).
template <typename B, typename X>
void Unpack(const X* group, int r, int64_t k, B* row) {
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    Visit(row[i], group[i], r,
          [](void* plain, const void* inter, size_t n) { std::memcpy(plain, inter, n); });
  }
}

template <typename B, typename X, GgmlType kType>
void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  const VecDotFn dot = GetKernels(kType, Isa::kScalar).vec_dot;
  std::vector<B> row(static_cast<size_t>(k / kQK_K));  // [k / 256 super-blocks]
  for (int r = 0; r < kRows; ++r) {
    Unpack(static_cast<const X*>(group), r, k, row.data());
    for (int t = 0; t < n_act; ++t) {
      dot(k, &out[t * out_stride + r], row.data(),
          static_cast<const uint8_t*>(act) + t * act_row_bytes);
    }
  }
}

template <typename B, typename X, GgmlType kType>
void Set(KernelTable& table) {
  TypeKernels& e = table[static_cast<int>(kType)];
  e.interleave_rows = kRows;
  e.repack = Repack<B, X>;
  e.gemm_interleaved = Gemm<B, X, kType>;
  e.gemm_max_tokens = kLatticeGemmTokens;
}

}  // namespace

void RegisterScalarInterleavedIq(KernelTable& table) {
  Set<BlockIQ2_XXS, BlockIQ2_XXSx16, GgmlType::kIQ2_XXS>(table);
  Set<BlockIQ2_XS, BlockIQ2_XSx16, GgmlType::kIQ2_XS>(table);
  Set<BlockIQ3_XXS, BlockIQ3_XXSx16, GgmlType::kIQ3_XXS>(table);
  Set<BlockIQ3_S, BlockIQ3_Sx16, GgmlType::kIQ3_S>(table);
  Set<BlockIQ2_S, BlockIQ2_Sx16, GgmlType::kIQ2_S>(table);
  Set<BlockIQ1_S, BlockIQ1_Sx16, GgmlType::kIQ1_S>(table);
  Set<BlockIQ1_M, BlockIQ1_Mx16, GgmlType::kIQ1_M>(table);
}

}  // namespace lamina::quant_internal
