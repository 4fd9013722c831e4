// Matrix multiplication of GGML-typed weights with f32 activations, on a thread pool.
// Activations are first quantized to the weight type's vec_dot_type (as GGML's CPU path does),
// then each weight row is decoded once per tile of up to kMaxMultiDot activation rows, so a
// prompt batch runs matrix-matrix rather than one matrix-vector product per token. Types with a
// vec_dot_tile kernel also register-block kMaxTileRows weight rows per call, so each loaded
// activation block serves several rows.
#pragma once

#include <cstddef>
#include <cstdint>
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
  const uint8_t* data = nullptr;  // [rows][row_bytes]
  bool valid() const { return data != nullptr; }
  const uint8_t* Row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
};

// Reusable activation buffer for MatMul; grows on demand (an explicit, owned scratch).
struct MatMulScratch {
  std::vector<uint8_t> act;  // [n_tokens][row bytes of cols in vec_dot_type]
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

// Dequantizes one row of w into out[0..cols).
void DequantizeRow(const WeightMatrix& w, int64_t row, float* out);

}  // namespace lamina
