// Internal to src/quant: each kernel file fills the entries it implements into a table indexed
// by the GgmlType value; quant.cpp builds one table per ISA (scalar first, then the ISA's
// overrides for the entries it implements) and picks the best once.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/quant.h"

namespace lamina::quant_internal {

constexpr int kTypeTableSize = 43;  // > largest GgmlType value used (Q2_0 = 42)

using KernelTable = TypeKernels[kTypeTableSize];

// Takes a type's interleaved layout out of an ISA's table (after its scalar entries were copied
// in), so its matrices stay in plain rows on that ISA.
inline void UnsetInterleaved(KernelTable& table, GgmlType type) {
  TypeKernels& e = table[static_cast<int>(type)];
  e.interleave_rows = 0;
  e.repack = nullptr;
  e.gemm_interleaved = nullptr;
  e.gemm_max_tokens = kMaxMultiDot;
}

// Scalar reference kernels (the twins). Fill every field they implement.
// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, IQ4_NL, MXFP4
void RegisterScalarLegacy(KernelTable& table);
void RegisterScalarKQuants(KernelTable& table);  // Q2_K..Q6_K, IQ4_XS, TQ1_0, TQ2_0, Q8_K
// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (iquants*.cpp)
void RegisterScalarIQuants(KernelTable& table);
// SIMD overrides: set only vec_dot / vec_dot_multi / dequantize / quantize fields they implement,
// leave the others untouched.
void RegisterAvx2Legacy(KernelTable& table);
void RegisterAvx2KQuants(KernelTable& table);
void RegisterAvx2IQuants(KernelTable& table);
void RegisterAvx512Legacy(KernelTable& table);
void RegisterAvx512KQuants(KernelTable& table);
void RegisterAvx512IQuants(KernelTable& table);
// NVFP4, Q1_0 and Q2_0 (lowbit*.cpp): the scalar file fills every field, the SIMD files
// vec_dot and vec_dot_multi.
void RegisterScalarLowBit(KernelTable& table);
void RegisterAvx2LowBit(KernelTable& table);
void RegisterAvx512LowBit(KernelTable& table);
// The interleaved layouts (interleaved*.cpp): the scalar file sets interleave_rows, repack and
// the scalar gemm_interleaved; the SIMD files replace gemm_interleaved only.
// Q5_0 keeps each ISA's vec_dot order instead of the scalar one: its SIMD vec_dot sums eight
// float lanes, and the AVX2 and AVX-512 kernels do the same; GemmQ5_0x16Lanes is their scalar
// twin.
void RegisterScalarInterleaved(KernelTable& table);
void RegisterAvx2Interleaved(KernelTable& table);
void RegisterAvx512Interleaved(KernelTable& table);
void RepackQ5_0x16(const void* src, size_t row_bytes, int64_t k, void* dst);
void GemmQ5_0x16Lanes(int64_t k, const void* group, const void* act, size_t act_row_bytes,
                      int n_act, float* out, size_t out_stride);
// The same for Q4_K, Q5_K and Q6_K (interleaved_kquants*.cpp); the AVX2 and AVX-512 ones also
// replace Q8_K's quantize (the activations these kernels read) by its bit-identical twin.
void RegisterScalarInterleavedK(KernelTable& table);
void RegisterAvx2InterleavedK(KernelTable& table);
void RegisterAvx512InterleavedK(KernelTable& table);
// The AVX2 Q4_K, Q5_K, Q6_K and IQ4_XS kernels for prompt-sized calls (kAvx2WideMinTokens to
// kMaxGemmTokens tokens; interleaved_kquants_wide_avx2.cpp): each group unpacked once per call.
constexpr int kAvx2WideMinTokens = 16;
void GemmWideAvx2Q4K(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
                     float* out, size_t out_stride);
void GemmWideAvx2Q5K(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
                     float* out, size_t out_stride);
void GemmWideAvx2Q6K(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
                     float* out, size_t out_stride);
void GemmWideAvx2IQ4XS(int64_t k, const void* group, const void* act, size_t act_row_bytes,
                       int n_act, float* out, size_t out_stride);
// The same for NVFP4 (interleaved_nvfp4*.cpp).
void RegisterScalarInterleavedNvfp4(KernelTable& table);
void RegisterAvx2InterleavedNvfp4(KernelTable& table);
void RegisterAvx512InterleavedNvfp4(KernelTable& table);
// The same for Q1_0 and Q2_0 (interleaved_lowbit*.cpp): the AVX2 registration turns their
// interleaving off (plain rows there, defined in interleaved_lowbit.cpp), the AVX-512 one sets it
// again with its kernels.
void RegisterScalarInterleavedLowBit(KernelTable& table);
void RegisterAvx2InterleavedLowBit(KernelTable& table);
void RegisterAvx512InterleavedLowBit(KernelTable& table);
// The same for IQ2_XXS, IQ2_XS, IQ3_XXS and IQ3_S (interleaved_iquants*.cpp): the AVX2 file
// turns their interleaving off (plain rows there), the AVX-512 one sets it again with its kernels.
void RegisterScalarInterleavedIq(KernelTable& table);
void RegisterAvx2InterleavedIq(KernelTable& table);
void RegisterAvx512InterleavedIq(KernelTable& table);

// vec_dot_multi for a kernel with nothing to share between activation rows (the scalar twins):
// kDot once per row.
template <VecDotFn kDot>
void VecDotEachRow(int64_t k, const void* w_row, const void* act, size_t act_row_bytes, int n_act,
                   float* out) {
  const auto* a = static_cast<const uint8_t*>(act);
  for (int j = 0; j < n_act; ++j) kDot(k, &out[j], w_row, a + j * act_row_bytes);
}

}  // namespace lamina::quant_internal
