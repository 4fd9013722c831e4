// Kernel table per weight type: dequantize, quantize (reference), and the fused dot product
// against activations quantized the way GGML's CPU path does (vec_dot_type). SIMD variants
// (AVX2, AVX-512) are chosen once at runtime; each has a scalar twin with the same signature.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/types.h"
#include "util/cpu_features.h"

namespace lamina {

// y[0..k) = dequantized x; k a multiple of the block size.
using DequantizeRowFn = void (*)(const void* x, float* y, int64_t k);
// Quantizes k floats into blocks of the type (for activations: the GGML CPU rounding).
using QuantizeRowFn = void (*)(const float* x, void* y, int64_t k);
// *s = dot(w_row, act_row) for k elements; w in the weight type, act in vec_dot_type.
using VecDotFn = void (*)(int64_t k, float* s, const void* w_row, const void* act_row);
// out[j] = dot(w_row, act_j) for j < n_act (1..kMaxMultiDot); act_j at act + j * act_row_bytes.
// Lets a matrix-matrix kernel decode a weight row once for several activation rows.
using VecDotMultiFn = void (*)(int64_t k, const void* w_row, const void* act, size_t act_row_bytes,
                               int n_act, float* out);
constexpr int kMaxMultiDot = 8;
// out[j * out_stride + i] = dot(w_i, act_j) for i < n_rows (1..kMaxTileRows), j < n_act
// (1..kMaxMultiDot); w_i at w + i * w_row_bytes. Register-blocks several weight rows against
// several activation rows, so each loaded activation block serves every row of the tile and
// each decoded weight block every token. Every output is bit-identical to vec_dot on its pair.
using VecDotTileFn = void (*)(int64_t k, const void* w, size_t w_row_bytes, int n_rows,
                              const void* act, size_t act_row_bytes, int n_act, float* out,
                              size_t out_stride);
constexpr int kMaxTileRows = 8;  // kernels may block fewer rows per register tile
// The most tokens a vec_dot_tile call may take (TypeKernels::tile_max_tokens; kMaxMultiDot
// unless a kernel says more).
constexpr int kMaxTileTokens = 12;

// Interleaved weights (a layout the matmul repacks a weight type into at load: Q8_0, Q4_0,
// IQ4_NL, MXFP4, NVFP4, Q4_K, Q5_K, Q6_K and IQ4_XS as BlockQ8_0x16, BlockQ4_0x16,
// BlockIQ4_NLx16, BlockMXFP4x16, BlockNVFP4x16, BlockQ4_Kx16, BlockQ5_Kx16, BlockQ6_Kx16 and
// BlockIQ4_XSx16; Q5_0 as BlockQ5_0x16). RepackFn:
// rows [0, interleave_rows) of k values, row r at src + r * row_bytes, into one group of
// interleaved blocks at dst (the same number of bytes).
constexpr int kMaxInterleaveRows = 16;
using RepackFn = void (*)(const void* src, size_t row_bytes, int64_t k, void* dst);
// out[t * out_stride + r] = dot(row r of the group, act_t) for r < interleave_rows and
// t < n_act (1..TypeKernels::gemm_max_tokens); act_t (a row of BlockQ8_0Act for Q8_0 vec_dot_type,
// of BlockQ8_K for Q8_K) at act + t * act_row_bytes. Every output runs the same per-row sequence
// whatever n_act or the token's place, so a token's result never depends on its batch; for the Q8_0
// types it equals the scalar vec_dot of the row before repacking (Q5_0: the vec_dot of the same
// ISA), for Q4_K / Q5_K / Q6_K / IQ4_XS the scalar twin's canonical order
// (interleaved_kquants.cpp), within the K-quant dot bound of vec_dot.
// IQ2_XXS / IQ2_XS / IQ3_XXS / IQ3_S: the scalar vec_dot of the row before repacking.
using GemmInterleavedFn = void (*)(int64_t k, const void* group, const void* act,
                                   size_t act_row_bytes, int n_act, float* out, size_t out_stride);
// The most tokens a gemm_interleaved call may take (TypeKernels::gemm_max_tokens; kMaxMultiDot
// unless a kernel says more): prompt kernels that unpack a group once for many tokens.
constexpr int kMaxGemmTokens = 128;
// The lattice i-quants' (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ3_S) gemm_max_tokens on AVX-512: their
// kernels decode a super-block of 16 rows once per call, which costs more than the tokens' dots.
constexpr int kLatticeGemmTokens = 64;
static_assert(kLatticeGemmTokens <= kMaxGemmTokens);
// A row of BlockQ8_0 (k values) as the BlockQ8_0Act row the interleaved kernels read.
void Q8_0ToAct(const void* q8_row, void* act_row, int64_t k);

const char* IsaName(Isa isa);  // Isa: util/cpu_features.h
// The best ISA this CPU supports (detected once).
Isa DetectIsa();

struct TypeKernels {
  GgmlType type;
  GgmlType vec_dot_type;       // activation format the dot product expects
  DequantizeRowFn dequantize;  // nullptr for none (e.g. Q8_1, which is activation-only)
  QuantizeRowFn quantize;      // nullptr if lamina has no quantizer for this type
  VecDotFn vec_dot;            // nullptr for activation-only types (Q8_1, Q8_K)
  VecDotMultiFn vec_dot_multi;
  // nullptr where no ISA kernel exists: callers then run vec_dot_multi row by row (the same
  // results, since both equal vec_dot bit for bit).
  VecDotTileFn vec_dot_tile = nullptr;
  // Matmuls of fewer tokens than this skip vec_dot_tile (same results): a tile that only pays
  // when its weight rows stay in cache across many tokens.
  int tile_min_tokens = 1;
  // The most tokens one vec_dot_tile call takes (kMaxMultiDot..kMaxTileTokens): the AVX-512 float
  // tiles hold up to 12 tokens in registers, so a 9-token window widens each f16 weight vector
  // once rather than once per tile of 5 and of 4.
  int tile_max_tokens = kMaxMultiDot;
  // When set, the matmul prepares activations with this (into vec_dot_type's layout) instead
  // of GetKernels(vec_dot_type).quantize. F16 weights: activations rounded to f16 as GGML does,
  // kept as f32 so that no kernel widens them again per weight row (the products are the same).
  QuantizeRowFn quantize_act = nullptr;
  // Interleaved layout (see RepackFn): rows per group, 0 when the type has none at this ISA.
  // Activations are quantized to vec_dot_type as for vec_dot, then Q8_0 rows widened (Q8_0ToAct).
  int interleave_rows = 0;
  RepackFn repack = nullptr;
  GemmInterleavedFn gemm_interleaved = nullptr;
  // The most tokens one gemm_interleaved call takes (kMaxMultiDot..kMaxGemmTokens): the AVX-512
  // K-quant kernels (Q4_K, Q5_K, Q6_K) and the AVX2 wide kernels (Q4_K, Q5_K, Q6_K, IQ4_XS in
  // interleaved_kquants_wide_avx2.cpp; Q8_0, Q4_0, IQ4_NL, MXFP4 and Q5_0 in interleaved_avx2.cpp)
  // unpack each group's codes and scales once per call, from kAvx2WideMinTokens tokens on AVX2,
  // and run every token of it from that copy, and the lattice i-quant kernels decode each group
  // once per call (64 tokens, kLatticeGemmTokens), so the matmul hands them many tokens at a time.
  int gemm_max_tokens = kMaxMultiDot;
};

// Kernels for `type` at the best ISA of this CPU.
const TypeKernels& GetKernels(GgmlType type);
// Kernels for `type` at a given ISA (tests and benchmarks); entries an ISA lacks fall back to
// the scalar ones. Asking for an ISA the CPU lacks is a broken invariant.
const TypeKernels& GetKernels(GgmlType type, Isa isa);
// True when lamina can run matmuls with weights of this type.
bool IsSupportedWeightType(GgmlType type);

}  // namespace lamina
