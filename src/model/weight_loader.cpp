// WeightLoader: tensors resolved by name with shape and type checks.
#include "model/weight_loader.h"

#include <cmath>
#include <cstring>
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

// The weights llama.cpp's loader reads a per-tensor scale for (its generic pass over
// "<weight minus .weight>.scale" and ".input_scale", d32676d): each layer's attention, FFN,
// shared-expert, expert, recurrent and MTP projections; the output head only when it is NVFP4.
// A scale beside any other matrix (token_embd, a router, ssm_ba, ...) makes llama.cpp refuse
// the file, and lamina too.
constexpr const char* kScaledLayerWeights[] = {
    "attn_q",         "attn_k",         "attn_v",
    "attn_output",    "attn_qkv",       "attn_gate",
    "ffn_gate",       "ffn_down",       "ffn_up",
    "ffn_gate_shexp", "ffn_down_shexp", "ffn_up_shexp",
    "ffn_gate_exps",  "ffn_down_exps",  "ffn_up_exps",
    "ssm_in",         "ssm_out",        "ssm_alpha",
    "ssm_beta",       "nextn.eh_proj",  "nextn.shared_head_head"};

// "" when `weight` (a "....weight" name) may carry a per-tensor scale, else why not.
std::string WhyNoScale(const std::string& weight, GgmlType type, WeightUse use) {
  const std::string base = weight.substr(0, weight.size() - 7);  // without ".weight"
  if (base == "output") {
    return type == GgmlType::kNVFP4
               ? ""
               : "llama.cpp reads output.scale only for an NVFP4 output.weight "
                 "(this one is " +
                     gguf::GgmlTypeNameOf(static_cast<uint32_t>(type)) + ")";
  }
  const std::string why =
      "llama.cpp applies per-tensor scales to attention, FFN, expert and "
      "recurrent projections and an NVFP4 output head only";
  if (use != WeightUse::kMatMul || base.rfind("blk.", 0) != 0) return why;
  const size_t dot = base.find('.', 4);
  if (dot == std::string::npos) return why;
  const std::string role = base.substr(dot + 1);
  for (const char* r : kScaledLayerWeights) {
    if (role == r) return "";
  }
  return why;
}

// "[ne0, ne1, ...]".
std::string ShapeString(const gguf::TensorInfo& t) {
  std::string s = "[";
  for (uint32_t d = 0; d < t.n_dims; ++d) s += (d > 0 ? ", " : "") + std::to_string(t.ne[d]);
  return s + "]";
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
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

void WeightLoader::RefuseScales(const std::string& name, const std::string& why) {
  const std::string base = name.substr(0, name.size() - 7);
  for (const char* suffix : {".scale", ".input_scale"}) {
    if (file_.FindTensor(base + suffix) != nullptr) {
      Fail(file_.path() + ": tensor " + base + suffix + " is not applied: " + why);
      return;
    }
  }
}

bool WeightLoader::Scales(const std::string& name, GgmlType type, int64_t count, WeightUse use,
                          std::vector<float>* scales) {
  scales->clear();
  if (!EndsWith(name, ".weight")) return true;
  const std::string base = name.substr(0, name.size() - 7);
  for (const char* suffix : {".scale", ".input_scale"}) {
    const std::string sname = base + suffix;
    const gguf::TensorInfo* t = file_.FindTensor(sname);
    if (t == nullptr) continue;
    const std::string at = file_.path() + ": tensor " + sname + " (the per-tensor scale of " + name;
    if (const std::string why = WhyNoScale(name, type, use); !why.empty()) {
      Fail(at + ") is not applied: " + why);
      return false;
    }
    if (t->type != GgmlType::kF32 || t->n_dims != 1 || t->ne[0] != count) {
      Fail(at + ") has type " + gguf::GgmlTypeNameOf(static_cast<uint32_t>(t->type)) +
           " and shape " + ShapeString(*t) + ", expected F32 [" + std::to_string(count) + "]" +
           (count > 1 ? " (one per expert)" : ""));
      return false;
    }
    n_params_ += static_cast<uint64_t>(count);
    n_bytes_ += t->n_bytes;
    // ".input_scale" (the activations' FP4 scale for ModelOpt's own kernels) is read and checked
    // as llama.cpp does, which leaves it unused: activations here are f32 / Q8.
    if (std::string(suffix) != ".scale") continue;
    scales->resize(static_cast<size_t>(count));
    std::memcpy(scales->data(), t->data, static_cast<size_t>(count) * sizeof(float));
    for (int64_t i = 0; i < count; ++i) {
      if (!std::isfinite((*scales)[i])) {
        Fail(at + ") holds " + std::to_string((*scales)[i]) + " at index " + std::to_string(i) +
             ", expected a finite value");
        return false;
      }
    }
  }
  return true;
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
  std::vector<float> scale;  // [1] or empty
  if (!Scales(name, t->type, 1, use, &scale)) return w;
  w.type = t->type;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = RowSize(t->type, cols);
  w.data = t->data;
  if (!scale.empty()) w.scale = scale[0];
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
  std::vector<float> scales;  // [n_mat] (one per expert) or empty
  if (!Scales(name, t->type, n_mat, WeightUse::kMatMul, &scales)) return out;
  const size_t row_bytes = RowSize(t->type, cols);
  out.resize(n_mat);
  for (int64_t m = 0; m < n_mat; ++m) {
    WeightMatrix& w = out[m];
    w.type = t->type;
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = row_bytes;
    w.data = t->data + static_cast<size_t>(m * rows) * row_bytes;
    if (!scales.empty()) w.scale = scales[m];
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
