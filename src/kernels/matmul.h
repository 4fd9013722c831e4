// Matrix multiplication of GGML-typed weights with f32 activations, on a thread pool.
// Activations are first quantized to the weight type's vec_dot_type (as GGML's CPU path does),
// then each weight row is decoded once per tile of up to kMaxMultiDot activation rows (a tile
// kernel's tile_max_tokens, up to kMaxTileTokens), so a prompt batch runs matrix-matrix rather
// than one matrix-vector product per token. Types with a
// vec_dot_tile kernel also register-block kMaxTileRows weight rows per call, so each loaded
// activation block serves several rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "quant/quant.h"
#include "util/thread_pool.h"

namespace lamina {

// A 2-D weight: rows = output features, cols = input features (GGUF ne = {cols, rows}).
struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  // [rows][row_bytes], or with interleave > 0 [rows / interleave] groups of interleave rows in
  // the type's interleaved layout (TypeKernels::repack; the same bytes in all).
  const uint8_t* data = nullptr;
  int interleave = 0;  // rows per interleaved group; 0: plain rows
  // The weight is data's values times this (a per-tensor second-level scale, as NVIDIA ModelOpt
  // NVFP4 conversions carry: "<name>.scale"); MatMul multiplies each output by it, as llama.cpp
  // multiplies the matmul's result, and DequantizeRow each value.
  float scale = 1.0f;
  bool valid() const { return data != nullptr; }
  // Plain rows only (interleave == 0).
  const uint8_t* Row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
};

// Whether the matmul would run w from an interleaved copy (its type has an interleaved layout
// at this CPU's ISA and its rows fill whole groups).
bool CanInterleave(const WeightMatrix& w);
// Writes w's rows in its type's interleaved layout to dst (w.rows * w.row_bytes bytes) and
// returns w pointing there with interleave set. w must be plain and CanInterleave(w).
WeightMatrix InterleaveInto(const WeightMatrix& w, uint8_t* dst);

// Reusable activation buffer for MatMul; grows on demand (an explicit, owned scratch).
struct MatMulScratch {
  std::vector<uint8_t> act;       // [n_tokens][row bytes of cols in vec_dot_type]
  std::vector<uint8_t> act_wide;  // interleaved weights: [n_tokens][cols / 32] BlockQ8_0Act
  // F16 weights and a few tokens: each thread's own f16-rounded copy of the activations,
  // [threads][n_tokens][cols] f32 (made by the thread on its first chunk of a loop), and whether
  // thread slot s has made its copy for the current loop ([threads]).
  std::vector<uint8_t> act_per_thread;
  std::vector<uint8_t> act_ready;
};

// y[t][r] = sum_c w[r][c] * x[t][c] for t < n_tokens.
// x: [n_tokens, x_stride >= w.cols] f32; y: [n_tokens, y_stride >= w.rows] f32.
void MatMul(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t n_tokens, float* y,
            int64_t y_stride, MatMulScratch& scratch, ThreadPool& pool);

// Same, for only the output rows [row_begin, row_end) (used to run selected experts or a
// slice of the vocabulary); y columns are indexed by absolute row.
void MatMulRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride,
                MatMulScratch& scratch, ThreadPool& pool);

// One of several matmuls over the same activations: y[t][r] = sum_c w[r][c] * x[t][c],
// y: [n_tokens, y_stride >= w.rows].
struct MatMulPart {
  const WeightMatrix* w = nullptr;
  float* y = nullptr;
  int64_t y_stride = 0;
};
constexpr int kMaxMatMulParts = 4;

// MatMul of each part (1..kMaxMatMulParts, same cols) over x in one parallel region when they read
// the same activations, prepared once (plain rows of one type; interleaved rows of one
// vec_dot_type, as Q4_K and Q6_K); else one after another; every output is MatMul's bits.
// after_rows (all parts then have the same rows): called with each range [row_begin, row_end) of
// rows once every part has them for all tokens, by the thread that computed them (a per-row
// epilogue, such as the FFN's activation, inside the same region).
void MatMulMany(
    const MatMulPart* parts, int n_parts, const float* x, int64_t x_stride, int64_t n_tokens,
    MatMulScratch& scratch, ThreadPool& pool,
    const std::function<void(int64_t row_begin, int64_t row_end)>* after_rows = nullptr);

// Dequantizes one row of w (plain rows) into out[0..cols).
void DequantizeRow(const WeightMatrix& w, int64_t row, float* out);

}  // namespace lamina
