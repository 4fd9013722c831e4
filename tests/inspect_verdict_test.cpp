// `lamina inspect`'s verdict is the loader's: for every kind of refusal the loader makes on a
// structurally valid file (an architecture feature it does not read, a tensor type it cannot
// compute, a missing or misshapen tensor, a contradicting or unsupported metadata value, an
// unknown architecture), inspect says "cannot run" with the reason `lamina run` prints, and for
// the files it loads, "can run". The refused files are the repository fixtures rewritten here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/model.h"
#include "process_util.h"

namespace lamina {
namespace {

using testing_util::RunShell;

std::string Fixture(const std::string& name) {
  return std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("lamina_inspect_" + std::to_string(::getpid()) + "_" + name + ".gguf"))
      .string();
}

// One tensor to write: a copy of the source's, or a new one.
struct Tensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  std::vector<uint8_t> data;
};

// Rewrites `src` into `dst` after `edit` changed its metadata and tensors and `poke` the bytes.
using Edit =
    std::function<void(std::vector<std::pair<std::string, gguf::Value>>*, std::vector<Tensor>*)>;
using Poke = std::function<void(std::vector<uint8_t>*)>;
void Rewrite(const std::string& src, const std::string& dst, const Edit& edit, const Poke& poke) {
  Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(src);
  ASSERT_TRUE(f.ok()) << f.error().message;
  std::vector<std::pair<std::string, gguf::Value>> kv = (*f)->metadata();
  std::vector<Tensor> tensors;
  for (const gguf::TensorInfo& t : (*f)->tensors()) {
    tensors.push_back({t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                       std::vector<uint8_t>(t.data, t.data + t.n_bytes)});
  }
  edit(&kv, &tensors);
  gguf::Writer w;
  for (const auto& [key, value] : kv) w.SetValue(key, value);
  for (const Tensor& t : tensors) w.AddTensor(t.name, t.type, t.ne, t.data.data(), t.data.size());
  std::vector<uint8_t> bytes = w.Serialize();
  if (poke) poke(&bytes);
  std::ofstream(dst, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

// Sets the type id of tensor `name` in a file image (its table entry: the name, n_dims, ne[],
// type), for a GGML type the writer cannot size.
void SetTensorType(std::vector<uint8_t>* bytes, const std::string& name, uint32_t type) {
  const auto at = std::search(bytes->begin(), bytes->end(), name.begin(), name.end());
  ASSERT_NE(at, bytes->end());
  size_t pos = static_cast<size_t>(at - bytes->begin()) + name.size();
  uint32_t n_dims = 0;
  std::memcpy(&n_dims, bytes->data() + pos, 4);
  pos += 4 + 8 * static_cast<size_t>(n_dims);
  std::memcpy(bytes->data() + pos, &type, 4);
}

gguf::Value* Key(std::vector<std::pair<std::string, gguf::Value>>* kv, const std::string& key) {
  for (auto& [k, v] : *kv) {
    if (k == key) return &v;
  }
  return nullptr;
}

// An F32 tensor of zeros with shape ne.
Tensor Zeros(const std::string& name, std::vector<int64_t> ne) {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return {name, GgmlType::kF32, std::move(ne), std::vector<uint8_t>(n * sizeof(float))};
}

std::vector<Tensor>::iterator Named(std::vector<Tensor>* t, const std::string& name) {
  return std::find_if(t->begin(), t->end(), [&](const Tensor& x) { return x.name == name; });
}

struct Refusal {
  std::string name;
  std::string base;  // fixture file
  Edit edit;
  std::string expect;  // a part of the reason
  Poke poke = nullptr;
};

std::vector<Refusal> Refusals() {
  const std::string mistral3 = "synth-mistral3-d256.Q8_0.gguf";
  const std::string llama = "synth-llama-d256.IQ4_NL.gguf";
  return {
      {"mistral3_shared_expert", mistral3,
       [](auto*, std::vector<Tensor>* t) {
         t->push_back(Zeros("blk.0.ffn_gate_shexp.weight", {256, 64}));
       },
       "tensor blk.0.ffn_gate_shexp.weight is not supported for mistral3"},
      {"mistral3_partial_rope", mistral3,
       [](std::vector<std::pair<std::string, gguf::Value>>* kv, auto*) {
         gguf::Value* v = Key(kv, "mistral3.rope.dimension_count");
         v->u = 32;
         v->i = 32;
       },
       "mistral3.rope.dimension_count"},
      {"unknown_architecture", llama,
       [](std::vector<std::pair<std::string, gguf::Value>>* kv, auto*) {
         Key(kv, "general.architecture")->str = "mamba";
       },
       "unsupported architecture \"mamba\""},
      {"missing_tensor", llama,
       [](auto*, std::vector<Tensor>* t) { t->erase(Named(t, "blk.1.attn_k.weight")); },
       "missing tensor blk.1.attn_k.weight"},
      {"uncomputed_type", llama,
       [](auto*, std::vector<Tensor>* t) {
         *Named(t, "blk.0.attn_q.weight") = Zeros("blk.0.attn_q.weight", {256, 256});
       },
       "tensor blk.0.attn_q.weight has type I32, which lamina cannot compute",
       // F32 becomes I32 (GGML type 26, as many bytes), which lamina has no kernels for.
       [](std::vector<uint8_t>* b) { SetTensorType(b, "blk.0.attn_q.weight", 26); }},
      {"misshapen_tensor", llama,
       [](auto*, std::vector<Tensor>* t) {
         *Named(t, "blk.0.ffn_norm.weight") = Zeros("blk.0.ffn_norm.weight", {128});
       },
       "tensor blk.0.ffn_norm.weight has 128 elements, expected 256"},
      {"contradicting_count", llama,
       [](std::vector<std::pair<std::string, gguf::Value>>* kv, auto*) {
         gguf::Value* v = Key(kv, "llama.block_count");
         v->u = 5000000;
         v->i = 5000000;
       },
       "llama.block_count"},
      {"unsupported_rope_scaling", llama,
       [](std::vector<std::pair<std::string, gguf::Value>>* kv, auto*) {
         gguf::Value v;
         v.type = gguf::ValueType::kString;
         v.str = "spiral";
         kv->emplace_back("llama.rope.scaling.type", v);
       },
       "unsupported rope scaling type \"spiral\""},
  };
}

// The loader's message for `path` as `lamina run` prints it, without "lamina: PATH: ".
std::string RunRefusal(const std::string& path, int* code) {
  const testing_util::ProcessOutput run =
      RunShell("'" + std::string(LAMINA_BINARY) + "' run -m '" + path + "' -p hi -n 1 2>&1");
  *code = run.code;
  std::string line = run.out.substr(0, run.out.find('\n'));
  const std::string prefix = "lamina: " + path + ": ";
  return line.starts_with(prefix) ? line.substr(prefix.size()) : line;
}

TEST(InspectVerdict, EveryLoaderRefusalIsInspectsReason) {
  for (const Refusal& r : Refusals()) {
    SCOPED_TRACE(r.name);
    const std::string path = TempPath(r.name);
    Rewrite(Fixture(r.base), path, r.edit, r.poke);
    // The library: the check is the load.
    const Status check = CheckModelFile(path);
    ASSERT_FALSE(check.ok());
    Result<std::unique_ptr<Model>> load = LoadModel(path);
    ASSERT_FALSE(load.ok());
    EXPECT_EQ(check.error().message, load.error().message);
    EXPECT_NE(check.error().message.find(r.expect), std::string::npos) << check.error().message;
    // The processes: run refuses (exit 3), inspect shows the file (exit 0) and says why not.
    int code = 0;
    const std::string reason = RunRefusal(path, &code);
    EXPECT_EQ(code, 3) << reason;
    EXPECT_NE(reason.find(r.expect), std::string::npos) << reason;
    const testing_util::ProcessOutput json =
        RunShell("'" + std::string(LAMINA_BINARY) + "' inspect --json '" + path + "' 2>/dev/null");
    ASSERT_EQ(json.code, 0);
    const nlohmann::json j = nlohmann::json::parse(json.out);
    EXPECT_EQ(j["lamina"]["runs"], false);
    EXPECT_EQ(j["lamina"]["reason"], reason);
    const testing_util::ProcessOutput text =
        RunShell("'" + std::string(LAMINA_BINARY) + "' inspect '" + path + "' 2>/dev/null");
    EXPECT_NE(text.out.find("lamina cannot run this file: " + reason), std::string::npos)
        << text.out;
    std::filesystem::remove(path);
  }
}

TEST(InspectVerdict, FilesTheLoaderTakesCanRun) {
  for (const char* name : {"synth-mistral3-d256.Q8_0.gguf", "synth-llama-d256.IQ4_NL.gguf",
                           "synth-gpt-oss-d256.MXFP4_MOE.gguf", "synth-qwen35-d128.Q8_0.gguf",
                           "synth-gemma3-d256.Q8_0.gguf", "synth-phi3-d256.Q8_0.gguf"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(CheckModelFile(Fixture(name)).ok());
    const testing_util::ProcessOutput json = RunShell(
        "'" + std::string(LAMINA_BINARY) + "' inspect --json '" + Fixture(name) + "' 2>/dev/null");
    ASSERT_EQ(json.code, 0);
    const nlohmann::json j = nlohmann::json::parse(json.out);
    EXPECT_EQ(j["lamina"]["runs"], true);
    EXPECT_EQ(j["lamina"]["reason"], "");
  }
}

}  // namespace
}  // namespace lamina
