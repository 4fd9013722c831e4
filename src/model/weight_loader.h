// WeightLoader: resolves GGUF tensors by name into weight matrices and vectors, checking shape
// and type, counting parameters and bytes, and remembering the first error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace lamina {

// How a matrix is read: by the matmul alone (it may be repacked into the interleaved layout),
// or row by row too (embedding lookups, DequantizeRow: kept as the file's rows).
enum class WeightUse { kMatMul, kRows };

// Resolves tensors by name with shape and type checks; remembers the first error. A matrix's
// per-tensor scale ("<base>.scale" beside "<base>.weight", NVIDIA ModelOpt NVFP4 conversions)
// becomes its WeightMatrix::scale (one per matrix of a stack).
// With `interleaved`, every kMatMul matrix whose type has an interleaved layout at this CPU's
// ISA (CanInterleave) is repacked at load into a buffer appended there (the same bytes as the
// tensor), and the mapped pages it came from are released: weights are never held twice.
class WeightLoader {
 public:
  explicit WeightLoader(const gguf::File& file, std::vector<WeightBuffer>* interleaved = nullptr)
      : file_(file), interleaved_(interleaved) {}
  // A 2-D weight with ne = {cols, rows}; invalid (data == nullptr) when absent and !required.
  WeightMatrix Matrix(const std::string& name, int64_t cols, int64_t rows, bool required = true,
                      WeightUse use = WeightUse::kMatMul);
  // A 3-D tensor of n_mat stacked 2-D matrices (ne = {cols, rows, n_mat}), one WeightMatrix per
  // matrix pointing into the mapped data (or, interleaved, into one repacked buffer); empty
  // when absent and !required.
  std::vector<WeightMatrix> Stacked(const std::string& name, int64_t cols, int64_t rows,
                                    int64_t n_mat, bool required = true);
  // A 1-D f32 vector of n elements, dequantized into an owned copy.
  std::vector<float> Vector(const std::string& name, int64_t n, bool required = true);
  // A 2-D f32 table of `count` rows of n (ne = {n, count}, e.g. one bias per expert),
  // dequantized into an owned [count, n] copy; empty when absent and !required.
  std::vector<float> Table(const std::string& name, int64_t n, int64_t count, bool required = true);
  // Fails when the file holds a per-tensor scale ("<name minus .weight>.scale" or
  // ".input_scale") for `name`, a weight that has none here, saying `why`.
  void RefuseScales(const std::string& name, const std::string& why);
  const Status& status() const { return status_; }
  uint64_t n_params() const { return n_params_; }
  uint64_t n_bytes() const { return n_bytes_; }

 private:
  const gguf::TensorInfo* Find(const std::string& name, bool required);
  void Fail(const std::string& message);
  // The per-tensor scales of matrix `name` (llama.cpp's generic pass: "<base>.scale", F32
  // [count], one per expert of a stack, and ".input_scale", checked, counted and unused) into
  // *scales, empty when absent; false, after Fail, when one is malformed or belongs to a weight
  // llama.cpp scales nowhere.
  bool Scales(const std::string& name, GgmlType type, int64_t count, WeightUse use,
              std::vector<float>* scales);
  // Repacks the n_mat matrices of one tensor (mats[0].data on, contiguous) when they can be.
  void Interleave(std::vector<WeightMatrix>& mats, size_t tensor_bytes);
  const gguf::File& file_;
  std::vector<WeightBuffer>* interleaved_;
  Status status_;
  uint64_t n_params_ = 0;
  uint64_t n_bytes_ = 0;
};

}  // namespace lamina
