// `lamina inspect`: a GGUF file's header, metadata and tensor table, as text or one JSON object.
#include <cinttypes>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_commands.h"
#include "gguf/ggml_types.h"
#include "gguf/gguf.h"
#include "model/architectures.h"
#include "quant/quant.h"

namespace lamina::cli {

namespace {

using gguf::Value;
using gguf::ValueType;

// Arrays longer than this are summarized (tokenizer vocabularies run to 100k+ entries).
constexpr size_t kJsonArrayLimit = 16;
constexpr size_t kTextArrayPreview = 8;
constexpr size_t kTextStringLimit = 120;

// Metadata strings come from the file: escape control bytes so every entry stays on one line.
std::string EscapeForText(const std::string& s, size_t limit, bool quote = true) {
  const char* q = quote ? "\"" : "";
  std::string out = q;
  for (size_t k = 0; k < s.size(); ++k) {
    if (k == limit) {
      out += q + std::string("... (") + std::to_string(s.size()) + " bytes)";
      return out;
    }
    const auto c = static_cast<unsigned char>(s[k]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

std::string ScalarText(const Value& v) {
  switch (v.type) {
    case ValueType::kU8:
    case ValueType::kU16:
    case ValueType::kU32:
    case ValueType::kU64:
      return std::to_string(v.u);
    case ValueType::kI8:
    case ValueType::kI16:
    case ValueType::kI32:
    case ValueType::kI64:
      return std::to_string(v.i);
    case ValueType::kF32:
    case ValueType::kF64: {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.9g", v.f);
      return buf;
    }
    case ValueType::kBool:
      return v.u != 0 ? "true" : "false";
    case ValueType::kString:
      return EscapeForText(v.str, kTextStringLimit);
    case ValueType::kArray:
      break;
  }
  return "?";
}

std::string ValueText(const Value& v) {
  if (v.type != ValueType::kArray) return ScalarText(v);
  std::string out = "array<" + std::string(gguf::ValueTypeName(v.elem_type)) + ">[" +
                    std::to_string(v.array.size()) + "] [";
  const size_t shown = std::min(v.array.size(), kTextArrayPreview);
  for (size_t k = 0; k < shown; ++k) {
    if (k > 0) out += ", ";
    const Value& e = v.array[k];
    out += e.type == ValueType::kString ? EscapeForText(e.str, 40) : ValueText(e);
  }
  if (shown < v.array.size()) out += ", ...";
  return out + "]";
}

// ordered_json keeps the metadata in file order.
nlohmann::ordered_json ValueJson(const Value& v) {
  switch (v.type) {
    case ValueType::kU8:
    case ValueType::kU16:
    case ValueType::kU32:
    case ValueType::kU64:
      return v.u;
    case ValueType::kI8:
    case ValueType::kI16:
    case ValueType::kI32:
    case ValueType::kI64:
      return v.i;
    case ValueType::kF32:
    case ValueType::kF64:
      return v.f;
    case ValueType::kBool:
      return v.u != 0;
    case ValueType::kString:
      return v.str;
    case ValueType::kArray: {
      if (v.array.size() > kJsonArrayLimit) {
        return {{"type", gguf::ValueTypeName(v.elem_type)}, {"length", v.array.size()}};
      }
      nlohmann::ordered_json arr = nlohmann::ordered_json::array();
      for (const Value& e : v.array) arr.push_back(ValueJson(e));
      return arr;
    }
  }
  return nullptr;
}

std::string ShapeText(const gguf::TensorInfo& t) {
  std::string out = "[";
  for (uint32_t d = 0; d < t.n_dims; ++d) {
    if (d > 0) out += ", ";
    out += std::to_string(t.ne[d]);
  }
  return out + "]";
}

// A hybrid model's per-layer kinds from its tensor names, e.g. "DDDA DDDA" (D: Gated DeltaNet,
// recurrent; A: full attention; ?: neither); "" for models without recurrent layers.
std::string LayerPattern(const gguf::File& file) {
  Result<std::string> arch = file.GetString("general.architecture");
  if (!arch.ok()) return "";
  Result<int64_t> n = file.GetInt(*arch + ".block_count");
  if (!n.ok() || *n <= 0 || *n > 4096) return "";
  std::string out;
  bool any_recurrent = false;
  for (int64_t i = 0; i < *n; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const bool recurrent = file.FindTensor(p + "ssm_conv1d.weight") != nullptr;
    const bool attention = file.FindTensor(p + "attn_q.weight") != nullptr;
    any_recurrent |= recurrent;
    if (i > 0 && i % 4 == 0) out += ' ';
    out += recurrent ? 'D' : attention ? 'A' : '?';
  }
  return any_recurrent ? out : "";
}

// Whether lamina can run the file: the loader's own verdict (CheckModelFile, the load without
// repacking, so every refusal it makes is reported with its reason), plus, for the reader, the
// architecture and the tensor types lamina has no kernels for.
struct Support {
  std::string architecture;
  bool architecture_known = false;
  std::map<std::string, int> uncomputed_types;  // type name -> tensors of it
  Status load;                                  // CheckModelFile's
  bool runs() const { return load.ok(); }
  // The loader's reason without the path it starts with.
  std::string reason(const std::string& path) const {
    if (load.ok()) return "";
    const std::string& m = load.error().message;
    return m.starts_with(path + ": ") ? m.substr(path.size() + 2) : m;
  }
};

Support CheckSupport(const gguf::File& file) {
  Support out;
  Result<std::string> arch = file.GetString("general.architecture");
  out.architecture = arch.ok() ? *arch : "";
  for (const Architecture& a : kArchitectures) {
    if (out.architecture == a.name) out.architecture_known = true;
  }
  for (const gguf::TensorInfo& t : file.tensors()) {
    const uint32_t id = static_cast<uint32_t>(t.type);
    const bool one_row = t.n_dims <= 1;  // norms and biases are dequantized, not multiplied
    const bool computed = IsKnownGgmlType(id) && (one_row ? GetKernels(t.type).dequantize != nullptr
                                                          : IsSupportedWeightType(t.type));
    if (!computed) ++out.uncomputed_types[gguf::GgmlTypeNameOf(id)];
  }
  out.load = CheckModelFile(file.path());
  return out;
}

std::string SupportText(const Support& s, const std::string& path) {
  if (s.runs()) return "lamina can run this file (architecture " + s.architecture + ")";
  std::string text = "lamina cannot run this file: " + s.reason(path);
  if (!s.uncomputed_types.empty()) {
    std::string types;
    for (const auto& [name, n] : s.uncomputed_types) {
      types += (types.empty() ? "" : ", ") + name + " (" + std::to_string(n) + " tensor" +
               (n == 1 ? "" : "s") + ")";
    }
    text += "\n(tensor types lamina cannot compute yet: " + types + ")";
  }
  return text;
}

void PrintJson(const gguf::File& file) {
  nlohmann::ordered_json j;
  j["path"] = file.path();
  j["version"] = file.version();
  j["alignment"] = file.alignment();
  j["data_offset"] = file.data_offset();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [key, value] : file.metadata()) meta[key] = ValueJson(value);
  j["metadata"] = std::move(meta);
  if (const std::string pattern = LayerPattern(file); !pattern.empty()) {
    j["layer_pattern"] = pattern;
  }
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  uint64_t total_bytes = 0;
  uint64_t total_params = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    tensors.push_back({{"name", t.name},
                       {"type", gguf::GgmlTypeNameOf(static_cast<uint32_t>(t.type))},
                       {"ne", std::vector<int64_t>(t.ne, t.ne + t.n_dims)},
                       {"bytes", t.n_bytes},
                       {"offset", t.offset}});
    total_bytes += t.n_bytes;
    total_params += t.n_elements;
  }
  j["tensors"] = std::move(tensors);
  j["n_tensors"] = file.tensors().size();
  j["total_bytes"] = total_bytes;
  j["n_params"] = total_params;
  const Support support = CheckSupport(file);
  nlohmann::ordered_json types = nlohmann::ordered_json::object();
  for (const auto& [name, n] : support.uncomputed_types) types[name] = n;
  j["lamina"] = {{"runs", support.runs()},
                 {"reason", support.reason(file.path())},
                 {"architecture_supported", support.architecture_known},
                 {"uncomputed_types", std::move(types)},
                 {"summary", SupportText(support, file.path())}};
  // Metadata strings need not be valid UTF-8; replace bad bytes rather than throw.
  std::printf("%s\n",
              j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
}

void PrintText(const gguf::File& file) {
  std::printf("file: %s\n", file.path().c_str());
  std::printf("GGUF version: %u\n", file.version());
  std::printf("alignment: %u\n", file.alignment());
  std::printf("data offset: %" PRIu64 "\n", file.data_offset());
  std::printf("file size: %" PRIu64 "\n", file.file_size());
  std::printf("\nmetadata (%zu keys):\n", file.metadata().size());
  for (const auto& [key, value] : file.metadata()) {
    std::printf("  %-40s %-7s %s\n", EscapeForText(key, 80, /*quote=*/false).c_str(),
                gguf::ValueTypeName(value.type), ValueText(value).c_str());
  }
  if (const std::string pattern = LayerPattern(file); !pattern.empty()) {
    std::printf("\nlayer pattern (D: Gated DeltaNet, A: full attention): %s\n", pattern.c_str());
  }
  size_t name_width = 4;
  for (const gguf::TensorInfo& t : file.tensors()) name_width = std::max(name_width, t.name.size());
  name_width = std::min<size_t>(name_width, 64);
  std::printf("\ntensors (%zu):\n", file.tensors().size());
  std::printf("  %-*s  %-5s  %-24s  %12s\n", static_cast<int>(name_width), "name", "type",
              "shape (ne)", "bytes");
  uint64_t total_bytes = 0;
  uint64_t total_params = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    std::printf("  %-*s  %-5s  %-24s  %12" PRIu64 "\n", static_cast<int>(name_width),
                t.name.c_str(), gguf::GgmlTypeNameOf(static_cast<uint32_t>(t.type)).c_str(),
                ShapeText(t).c_str(), t.n_bytes);
    total_bytes += t.n_bytes;
    total_params += t.n_elements;
  }
  std::printf("\ntotal: %zu tensors, %" PRIu64 " bytes, %" PRIu64 " parameters\n",
              file.tensors().size(), total_bytes, total_params);
  std::printf("\n%s\n", SupportText(CheckSupport(file), file.path()).c_str());
}

}  // namespace

int RunInspect(const InspectOptions& options) {
  auto file = gguf::File::Open(options.model_path);
  if (!file.ok()) {
    std::fprintf(stderr, "lamina: %s\n", file.error().message.c_str());
    return kExitBadInput;
  }
  if (options.json) {
    PrintJson(**file);
  } else {
    PrintText(**file);
  }
  return kExitOk;
}

}  // namespace lamina::cli
