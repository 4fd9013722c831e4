// lamina-synth: writes a random-weight llama, qwen3moe or qwen3next GGUF in a real shape, for
// benchmarks (e.g. the 181M-parameter llama shape: --dim 1024 --layers 16 --heads 16 --kv-heads 4
// --ff 2816; a qwen3moe: --arch qwen3moe --experts 64 --experts-used 4 --ff-exp 256
// --head-dim 128; a qwen3next adds --ssm-k-heads, --ssm-v-heads, --ssm-head-dim and
// --attn-interval, its shared expert as wide as one expert). The tokenizer metadata is copied from
// another GGUF (--vocab-from), whose vocabulary size sets the embedding rows.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <random>

#include "gguf/gguf.h"
#include "quant/quant.h"

int main(int argc, char** argv) {
  using namespace lamina;
  CLI::App app{"Write a random-weight llama, qwen3moe or qwen3next GGUF for benchmarks"};
  int dim = 1024, layers = 16, heads = 16, kv_heads = 4, ff = 2816, ctx = 4096;
  int head_dim_opt = 0, experts = 64, experts_used = 4, ff_exp = 256;
  int ssm_k_heads = 8, ssm_v_heads = 16, ssm_head_dim = 128, attn_interval = 4;
  std::string type_name = "Q8_0", vocab_from, out_path, arch = "llama";
  uint64_t seed = 42;
  app.add_option("--dim", dim);
  app.add_option("--layers", layers);
  app.add_option("--heads", heads);
  app.add_option("--kv-heads", kv_heads);
  app.add_option("--ff", ff);
  app.add_option("--ctx", ctx);
  app.add_option("--arch", arch, "llama, qwen3moe or qwen3next")
      ->check(CLI::IsMember({"llama", "qwen3moe", "qwen3next"}));
  app.add_option("--ssm-k-heads", ssm_k_heads, "qwen3next: Gated DeltaNet query/key heads");
  app.add_option("--ssm-v-heads", ssm_v_heads, "qwen3next: Gated DeltaNet value heads");
  app.add_option("--ssm-head-dim", ssm_head_dim, "qwen3next: Gated DeltaNet head dimension");
  app.add_option("--attn-interval", attn_interval, "qwen3next: every n-th layer is attention");
  app.add_option("--head-dim", head_dim_opt, "Head dimension (0: dim / heads)");
  app.add_option("--experts", experts, "qwen3moe: experts per layer");
  app.add_option("--experts-used", experts_used, "qwen3moe: experts chosen per token");
  app.add_option("--ff-exp", ff_exp, "qwen3moe: FFN width of one expert");
  app.add_option("--type", type_name, "Weight type of the matrices: F32, F16, Q8_0, Q4_0, ...");
  app.add_option("--vocab-from", vocab_from, "GGUF to copy tokenizer.* metadata from")->required();
  app.add_option("-o,--output", out_path)->required();
  app.add_option("--seed", seed);
  CLI11_PARSE(app, argc, argv);

  GgmlType type = GgmlType::kF32;
  bool found = false;
  for (uint32_t raw = 0; raw < 32; ++raw) {
    if (IsKnownGgmlType(raw) && type_name == GgmlTypeName(static_cast<GgmlType>(raw))) {
      type = static_cast<GgmlType>(raw);
      found = true;
    }
  }
  if (!found || GetKernels(type).quantize == nullptr) {
    std::fprintf(stderr, "lamina-synth: no quantizer for type %s\n", type_name.c_str());
    return 2;
  }
  Result<std::unique_ptr<gguf::File>> vocab = gguf::File::Open(vocab_from);
  if (!vocab.ok()) {
    std::fprintf(stderr, "lamina-synth: %s\n", vocab.error().message.c_str());
    return 3;
  }
  const gguf::Value* tokens = (*vocab)->Find("tokenizer.ggml.tokens");
  if (tokens == nullptr) {
    std::fprintf(stderr, "lamina-synth: %s has no tokenizer.ggml.tokens\n", vocab_from.c_str());
    return 3;
  }
  const int n_vocab = static_cast<int>(tokens->array.size());
  const int head_dim = head_dim_opt > 0 ? head_dim_opt : dim / heads;
  const bool next = arch == "qwen3next";
  const bool moe = arch == "qwen3moe" || next;

  gguf::Writer w;
  const std::string a = arch;
  w.SetString("general.architecture", a);
  w.SetString("general.name", "lamina-synth random " + a);
  w.SetU32(a + ".embedding_length", dim);
  w.SetU32(a + ".block_count", layers);
  w.SetU32(a + ".attention.head_count", heads);
  w.SetU32(a + ".attention.head_count_kv", kv_heads);
  w.SetU32(a + ".feed_forward_length", ff);
  w.SetU32(a + ".context_length", ctx);
  w.SetU32(a + ".rope.dimension_count", next ? head_dim / 4 : head_dim);
  w.SetF32(a + ".rope.freq_base", moe ? 1e6f : 10000.0f);
  w.SetF32(a + ".attention.layer_norm_rms_epsilon", moe ? 1e-6f : 1e-5f);
  if (moe) {
    w.SetU32(a + ".attention.key_length", head_dim);
    w.SetU32(a + ".attention.value_length", head_dim);
    w.SetU32(a + ".expert_count", experts);
    w.SetU32(a + ".expert_used_count", experts_used);
    w.SetU32(a + ".expert_feed_forward_length", ff_exp);
  }
  const int ssm_inner = ssm_v_heads * ssm_head_dim;
  const int conv_channels = 2 * ssm_k_heads * ssm_head_dim + ssm_inner;
  if (next) {
    w.SetU32(a + ".expert_shared_feed_forward_length", ff_exp);
    w.SetU32(a + ".ssm.conv_kernel", 4);
    w.SetU32(a + ".ssm.state_size", ssm_head_dim);
    w.SetU32(a + ".ssm.group_count", ssm_k_heads);
    w.SetU32(a + ".ssm.time_step_rank", ssm_v_heads);
    w.SetU32(a + ".ssm.inner_size", ssm_inner);
    w.SetU32(a + ".full_attention_interval", attn_interval);
  }
  for (const auto& [key, value] : (*vocab)->metadata()) {
    if (key.rfind("tokenizer.", 0) == 0) w.SetValue(key, value);
  }

  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // A [n_mat] stack of [rows x cols] matrices (n_mat = 1: a plain 2-D weight).
  auto stacked = [&](const std::string& name, int cols, int rows, int n_mat, GgmlType t) {
    std::vector<float> row(cols);  // [cols]
    const size_t row_bytes = RowSize(t, cols);
    std::vector<uint8_t> data(row_bytes * rows * n_mat);  // [n_mat * rows][row_bytes]
    const float scale = 1.0f / std::sqrt(static_cast<float>(cols));
    for (size_t r = 0; r < static_cast<size_t>(rows) * n_mat; ++r) {
      for (float& x : row) x = normal(rng) * scale;
      GetKernels(t).quantize(row.data(), data.data() + r * row_bytes, cols);
    }
    if (n_mat == 1) {
      w.AddTensor(name, t, {cols, rows}, data.data(), data.size());
    } else {
      w.AddTensor(name, t, {cols, rows, n_mat}, data.data(), data.size());
    }
  };
  auto matrix = [&](const std::string& name, int cols, int rows, GgmlType t) {
    stacked(name, cols, rows, 1, t);
  };
  auto filled = [&](const std::string& name, int n, float value) {
    std::vector<float> v(n, value);
    w.AddTensor(name, GgmlType::kF32, {n}, v.data(), v.size() * 4);
  };
  auto ones = [&](const std::string& name, int n) { filled(name, n, 1.0f); };
  matrix("token_embd.weight", dim, n_vocab, type);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    ones(p + "attn_norm.weight", dim);
    if (next) {
      ones(p + "post_attention_norm.weight", dim);
      if ((l + 1) % attn_interval != 0) {  // Gated DeltaNet
        matrix(p + "attn_qkv.weight", dim, conv_channels, type);
        matrix(p + "attn_gate.weight", dim, ssm_inner, type);
        matrix(p + "ssm_conv1d.weight", 4, conv_channels, GgmlType::kF32);
        filled(p + "ssm_dt.bias", ssm_v_heads, 0.0f);
        filled(p + "ssm_a", ssm_v_heads, -1.0f);
        matrix(p + "ssm_ba.weight", dim, 2 * ssm_v_heads, type);
        ones(p + "ssm_norm.weight", ssm_head_dim);
        matrix(p + "ssm_out.weight", ssm_inner, dim, type);
      } else {  // gated attention: per head [q | gate]
        matrix(p + "attn_q.weight", dim, 2 * heads * head_dim, type);
        matrix(p + "attn_k.weight", dim, kv_heads * head_dim, type);
        matrix(p + "attn_v.weight", dim, kv_heads * head_dim, type);
        matrix(p + "attn_output.weight", heads * head_dim, dim, type);
        ones(p + "attn_q_norm.weight", head_dim);
        ones(p + "attn_k_norm.weight", head_dim);
      }
      matrix(p + "ffn_gate_inp.weight", dim, experts, GgmlType::kF32);
      stacked(p + "ffn_gate_exps.weight", dim, ff_exp, experts, type);
      stacked(p + "ffn_up_exps.weight", dim, ff_exp, experts, type);
      stacked(p + "ffn_down_exps.weight", ff_exp, dim, experts, type);
      matrix(p + "ffn_gate_inp_shexp.weight", dim, 1, GgmlType::kF32);
      matrix(p + "ffn_gate_shexp.weight", dim, ff_exp, type);
      matrix(p + "ffn_up_shexp.weight", dim, ff_exp, type);
      matrix(p + "ffn_down_shexp.weight", ff_exp, dim, type);
      continue;
    }
    matrix(p + "attn_q.weight", dim, heads * head_dim, type);
    matrix(p + "attn_k.weight", dim, kv_heads * head_dim, type);
    matrix(p + "attn_v.weight", dim, kv_heads * head_dim, type);
    matrix(p + "attn_output.weight", heads * head_dim, dim, type);
    ones(p + "ffn_norm.weight", dim);
    if (moe) {
      ones(p + "attn_q_norm.weight", head_dim);
      ones(p + "attn_k_norm.weight", head_dim);
      matrix(p + "ffn_gate_inp.weight", dim, experts, GgmlType::kF32);  // routers stay F32
      stacked(p + "ffn_gate_exps.weight", dim, ff_exp, experts, type);
      stacked(p + "ffn_up_exps.weight", dim, ff_exp, experts, type);
      stacked(p + "ffn_down_exps.weight", ff_exp, dim, experts, type);
      continue;
    }
    matrix(p + "ffn_gate.weight", dim, ff, type);
    matrix(p + "ffn_up.weight", dim, ff, type);
    matrix(p + "ffn_down.weight", ff, dim, type);
  }
  ones("output_norm.weight", dim);
  matrix("output.weight", dim, n_vocab, type);
  Status st = w.WriteFile(out_path);
  if (!st.ok()) {
    std::fprintf(stderr, "lamina-synth: %s\n", st.error().message.c_str());
    return 1;
  }
  std::fprintf(stderr, "lamina-synth: wrote %s\n", out_path.c_str());
  return 0;
}
