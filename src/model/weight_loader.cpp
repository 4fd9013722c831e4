// WeightLoader: tensors resolved by name with shape and type checks.
#include "model/weight_loader.h"

#include <string>

#include "gguf/ggml_types.h"
#include "util/mapped_file.h"

namespace lamina {

namespace {
// A tensor whose type lamina cannot compute: named as GGML names it (I8, ...), with
// the types lamina computes, so the user knows which file to fetch instead.
std::string UnsupportedType(const std::string& path, const std::string& tensor, GgmlType type) {
  std::string computed;
  for (uint32_t id = 0; id < 64; ++id) {
    if (IsKnownGgmlType(id) && IsSupportedWeightType(static_cast<GgmlType>(id))) {
      computed += (computed.empty() ? "" : ", ") + gguf::GgmlTypeNameOf(id);
    }
  }
  return path + ": tensor " + tensor + " has type " +
         gguf::GgmlTypeNameOf(static_cast<uint32_t>(type)) +
         ", which lamina cannot compute yet (it computes " + computed + ")";
}

// NVFP4 checkpoints converted from ModelOpt carry a second-level per-tensor scale beside the
// matrix ("blk.0.ffn_up.scale" for "blk.0.ffn_up.weight"), which llama.cpp multiplies into the
// matmul's output. lamina does not apply it, so such a file is refused rather than run wrong.
std::string UnappliedNvfp4Scale(const gguf::File& file, const std::string& tensor, GgmlType type) {
  const std::string suffix = ".weight";
  if (type != GgmlType::kNVFP4 || tensor.size() <= suffix.size() ||
      tensor.compare(tensor.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return "";
  }
  const std::string scale = tensor.substr(0, tensor.size() - suffix.size()) + ".scale";
  if (file.FindTensor(scale) == nullptr) return "";
  return file.path() + ": tensor " + tensor + " is NVFP4 with a per-tensor scale " + scale +
         ", which lamina does not apply yet";
}
}  // namespace

const gguf::TensorInfo* WeightLoader::Find(const std::string& name, bool required) {
  const gguf::TensorInfo* t = file_.FindTensor(name);
  if (t == nullptr && required) Fail(file_.path() + ": missing tensor " + name);
  return t;
}

void WeightLoader::Fail(const std::string& message) {
  if (status_.ok()) status_ = Error{message};
}

void WeightLoader::Interleave(std::vector<WeightMatrix>& mats, size_t tensor_bytes) {
  if (interleaved_ == nullptr || mats.empty() || !CanInterleave(mats[0])) return;
  const uint8_t* src = mats[0].data;
  const size_t mat_bytes = static_cast<size_t>(mats[0].rows) * mats[0].row_bytes;
  // [n_mat][rows / interleave groups][interleave * row_bytes]: the tensor's bytes, repacked.
  WeightBuffer buf = NewWeightBuffer(mat_bytes * mats.size());
  for (size_t m = 0; m < mats.size(); ++m)
    mats[m] = InterleaveInto(mats[m], buf.get() + m * mat_bytes);
  ReleaseMappedPages(src, tensor_bytes);
  interleaved_->push_back(std::move(buf));
}

WeightMatrix WeightLoader::Matrix(const std::string& name, int64_t cols, int64_t rows,
                                  bool required, WeightUse use) {
  WeightMatrix w;
  const gguf::TensorInfo* t = Find(name, required);
  if (t == nullptr) return w;
  if (t->n_dims > 2 || t->ne[0] != cols || t->ne[1] != rows) {
    Fail(file_.path() + ": tensor " + name + " has shape [" + std::to_string(t->ne[0]) + ", " +
         std::to_string(t->ne[1]) + "], expected [" + std::to_string(cols) + ", " +
         std::to_string(rows) + "]");
    return w;
  }
  if (!IsSupportedWeightType(t->type)) {
    Fail(UnsupportedType(file_.path(), name, t->type));
    return w;
  }
  if (const std::string why = UnappliedNvfp4Scale(file_, name, t->type); !why.empty()) {
    Fail(why);
    return w;
  }
  w.type = t->type;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = RowSize(t->type, cols);
  w.data = t->data;
  n_params_ += static_cast<uint64_t>(rows * cols);
  n_bytes_ += t->n_bytes;
  if (use == WeightUse::kMatMul) {
    std::vector<WeightMatrix> one = {w};
    Interleave(one, t->n_bytes);
    return one[0];
  }
  return w;
}

std::vector<WeightMatrix> WeightLoader::Stacked(const std::string& name, int64_t cols, int64_t rows,
                                                int64_t n_mat, bool required) {
  std::vector<WeightMatrix> out;
  const gguf::TensorInfo* t = Find(name, required);
  if (t == nullptr) return out;
  if (t->n_dims > 3 || t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n_mat) {
    Fail(file_.path() + ": tensor " + name + " has shape [" + std::to_string(t->ne[0]) + ", " +
         std::to_string(t->ne[1]) + ", " + std::to_string(t->ne[2]) + "], expected [" +
         std::to_string(cols) + ", " + std::to_string(rows) + ", " + std::to_string(n_mat) + "]");
    return out;
  }
  if (!IsSupportedWeightType(t->type)) {
    Fail(UnsupportedType(file_.path(), name, t->type));
    return out;
  }
  if (const std::string why = UnappliedNvfp4Scale(file_, name, t->type); !why.empty()) {
    Fail(why);
    return out;
  }
  const size_t row_bytes = RowSize(t->type, cols);
  out.resize(n_mat);
  for (int64_t m = 0; m < n_mat; ++m) {
    WeightMatrix& w = out[m];
    w.type = t->type;
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = row_bytes;
    w.data = t->data + static_cast<size_t>(m * rows) * row_bytes;
  }
  n_params_ += static_cast<uint64_t>(rows * cols * n_mat);
  n_bytes_ += t->n_bytes;
  Interleave(out, t->n_bytes);
  return out;
}

std::vector<float> WeightLoader::Vector(const std::string& name, int64_t n, bool required) {
  std::vector<float> out;
  const gguf::TensorInfo* t = Find(name, required);
  if (t == nullptr) return out;
  if (static_cast<int64_t>(t->n_elements) != n || t->ne[0] != n) {
    Fail(file_.path() + ": tensor " + name + " has " + std::to_string(t->n_elements) +
         " elements, expected " + std::to_string(n));
    return out;
  }
  if (!IsKnownGgmlType(static_cast<uint32_t>(t->type)) ||
      GetKernels(t->type).dequantize == nullptr) {
    Fail(UnsupportedType(file_.path(), name, t->type));
    return out;
  }
  out.resize(n);
  GetKernels(t->type).dequantize(t->data, out.data(), n);
  n_params_ += static_cast<uint64_t>(n);
  n_bytes_ += t->n_bytes;
  return out;
}

std::vector<float> WeightLoader::Table(const std::string& name, int64_t n, int64_t count,
                                       bool required) {
  std::vector<float> out;
  const gguf::TensorInfo* t = Find(name, required);
  if (t == nullptr) return out;
  if (t->n_dims > 2 || t->ne[0] != n || t->ne[1] != count) {
    Fail(file_.path() + ": tensor " + name + " has shape [" + std::to_string(t->ne[0]) + ", " +
         std::to_string(t->ne[1]) + "], expected [" + std::to_string(n) + ", " +
         std::to_string(count) + "]");
    return out;
  }
  if (!IsKnownGgmlType(static_cast<uint32_t>(t->type)) ||
      GetKernels(t->type).dequantize == nullptr) {
    Fail(UnsupportedType(file_.path(), name, t->type));
    return out;
  }
  const size_t row_bytes = RowSize(t->type, n);
  out.resize(static_cast<size_t>(n * count));
  for (int64_t r = 0; r < count; ++r) {
    GetKernels(t->type).dequantize(t->data + static_cast<size_t>(r) * row_bytes,
                                   out.data() + static_cast<size_t>(r * n), n);
  }
  n_params_ += static_cast<uint64_t>(n * count);
  n_bytes_ += t->n_bytes;
  return out;
}

}  // namespace lamina
