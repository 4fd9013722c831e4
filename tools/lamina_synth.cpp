// lamina-synth: writes a random-weight llama, qwen3moe, qwen3next, qwen35, qwen35moe, gemma3,
// gpt-oss, phi3, mistral3 or phimoe GGUF in a real shape,
// for benchmarks and fixtures (e.g. the 181M-parameter llama shape: --dim 1024 --layers 16 --heads
// 16 --kv-heads 4
// --ff 2816; a qwen3moe: --arch qwen3moe --experts 64 --experts-used 4 --ff-exp 256
// --head-dim 128; a qwen3next adds --ssm-k-heads, --ssm-v-heads, --ssm-head-dim and
// --attn-interval, its shared expert as wide as one expert; a gemma3 takes --swa and
// --swa-pattern, its norms drawn around 1 and its output head tied; a qwen35 or qwen35moe takes
// qwen3next's options and --rope-sections, its norms, dt biases and decay rates drawn, and
// --nextn appends that many multi-token-prediction blocks, drawn after everything else so the
// trunk's weights stay those of the file without them; a gpt-oss takes --swa, the expert
// options and --yarn-factor, with random biases and sinks; a phi3 has a fused attn_qkv and
// ffn_up, LongRoPE's short and long factors (--yarn-orig-ctx the original context, --ctx the
// extended one), --rope-dims rotated dimensions and a --swa window llama.cpp ignores; a mistral3
// takes YaRN (--yarn-factor, --yarn-orig-ctx) with a log multiplier of 1 and attention
// temperature tuning (scale 0.1, every --yarn-orig-ctx positions)), and with --moe experts
// (--experts, --experts-used, each --ff wide, as llama.cpp reads them; --no-expert-gate leaves
// ffn_gate_exps out) and with --biases random Q/K/V, attn_output and dense FFN biases; a phimoe
// is phi3's attention with Q/K/V, output and norm biases and LongRoPE factors (one per pair of
// the whole head, as llama.cpp's phimoe loader sizes them, whatever --rope-dims says), and
// experts each --ff wide; --rope-freqs adds a llama's
// or mistral3's rope_freqs.weight (Llama 3.1's per-pair frequency factors). The tokenizer metadata
// is copied from another GGUF (--vocab-from), whose vocabulary size sets the embedding rows.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <random>

#include "gguf/gguf.h"
#include "quant/quant.h"

namespace lamina {
namespace {

struct SynthOptions {
  int dim = 1024, layers = 16, heads = 16, kv_heads = 4, ff = 2816, ctx = 4096;
  int head_dim_opt = 0, experts = 64, experts_used = 4, ff_exp = 256;
  int ssm_k_heads = 8, ssm_v_heads = 16, ssm_head_dim = 128, attn_interval = 4;
  int swa = 16, swa_pattern = 2;
  std::vector<int> rope_sections = {11, 11, 10, 0};
  int nextn = 0;
  float yarn_factor = 4.0f;
  int yarn_orig_ctx = 1024;
  int rope_dims = 0;
  float embd_sd = 0.0f;
  bool rope_freqs = false;
  bool moe = false;             // mistral3: expert FFNs
  bool no_expert_gate = false;  // mistral3 --moe: no ffn_gate_exps (experts SiLU(up))
  bool biases = false;          // mistral3: Q/K/V, attn_output and dense FFN biases
  std::string type_name = "Q8_0", vocab_from, out_path, arch = "llama";
  uint64_t seed = 42;
};

void AddOptions(CLI::App* app, SynthOptions* o) {
  app->add_option("--dim", o->dim);
  app->add_option("--layers", o->layers);
  app->add_option("--heads", o->heads);
  app->add_option("--kv-heads", o->kv_heads);
  app->add_option("--ff", o->ff);
  app->add_option("--ctx", o->ctx);
  app->add_option("--arch", o->arch,
                  "llama, qwen3moe, qwen3next, qwen35, qwen35moe, gemma3, gpt-oss, phi3, mistral3 "
                  "or phimoe")
      ->check(CLI::IsMember({"llama", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "gemma3",
                             "gpt-oss", "phi3", "mistral3", "phimoe"}));
  app->add_flag("--moe", o->moe,
                "mistral3: a MoE FFN of --experts experts (--experts-used per token), each --ff "
                "wide");
  app->add_flag("--no-expert-gate", o->no_expert_gate,
                "mistral3 --moe: leave ffn_gate_exps out (llama.cpp then runs SiLU(up) experts)");
  app->add_flag("--biases", o->biases,
                "mistral3: random Q/K/V and attn_output biases, and a dense FFN's biases");
  app->add_option("--rope-dims", o->rope_dims,
                  "phi3, phimoe: rotated dimensions per head (0: all)");
  app->add_flag("--rope-freqs", o->rope_freqs,
                "llama, mistral3: a rope_freqs.weight of per-pair frequency factors (as Llama "
                "3.1 files carry), drawn 1 + 4 |N(0, 1)|");
  app->add_option("--embd-sd", o->embd_sd,
                  "Standard deviation of the token embedding (0: 1 / sqrt(dim), as every matrix)");
  app->add_option("--rope-sections", o->rope_sections, "qwen35: rope.dimension_sections (4)")
      ->expected(4);
  app->add_option("--nextn", o->nextn, "qwen35: multi-token-prediction blocks appended");
  app->add_option("--swa", o->swa, "gemma3, gpt-oss, phi3: sliding window (tokens)");
  app->add_option("--yarn-factor", o->yarn_factor,
                  "gpt-oss, mistral3: YaRN factor (0: no rope scaling)");
  app->add_option("--yarn-orig-ctx", o->yarn_orig_ctx,
                  "gpt-oss, mistral3: YaRN original context; phi3: LongRoPE's");
  app->add_option("--swa-pattern", o->swa_pattern, "gemma3: every n-th layer is global");
  app->add_option("--ssm-k-heads", o->ssm_k_heads, "qwen3next: Gated DeltaNet query/key heads");
  app->add_option("--ssm-v-heads", o->ssm_v_heads, "qwen3next: Gated DeltaNet value heads");
  app->add_option("--ssm-head-dim", o->ssm_head_dim, "qwen3next: Gated DeltaNet head dimension");
  app->add_option("--attn-interval", o->attn_interval, "qwen3next: every n-th layer is attention");
  app->add_option("--head-dim", o->head_dim_opt, "Head dimension (0: dim / heads)");
  app->add_option("--experts", o->experts, "qwen3moe: experts per layer");
  app->add_option("--experts-used", o->experts_used, "qwen3moe: experts chosen per token");
  app->add_option("--ff-exp", o->ff_exp, "qwen3moe: FFN width of one expert");
  app->add_option("--type", o->type_name, "Weight type of the matrices: F32, F16, Q8_0, Q4_0, ...");
  app->add_option("--vocab-from", o->vocab_from, "GGUF to copy tokenizer.* metadata from")
      ->required();
  app->add_option("-o,--output", o->out_path)->required();
  app->add_option("--seed", o->seed);
}

// The ggml type named `name` that has a quantizer; false when there is none.
bool FindQuantType(const std::string& name, GgmlType* type) {
  bool found = false;
  for (uint32_t raw = 0; raw < 32; ++raw) {
    if (IsKnownGgmlType(raw) && name == GgmlTypeName(static_cast<GgmlType>(raw))) {
      *type = static_cast<GgmlType>(raw);
      found = true;
    }
  }
  return found && GetKernels(*type).quantize != nullptr;
}

// The qwen3next-like hybrids: qwen3next and the qwen35 pair.
bool IsHybrid(const std::string& arch) {
  return arch == "qwen3next" || arch == "qwen35" || arch == "qwen35moe";
}
bool IsQwen35(const std::string& arch) { return arch == "qwen35" || arch == "qwen35moe"; }

// phi3's LongRoPE (the converter's attention factor for a 128k model) and its window, or
// mistral3's YaRN, log multiplier and temperature tuning (Ministral 3's values, a short
// original context so that short prompts cross it).
void SetPhi3OrMistral3Metadata(const SynthOptions& o, int head_dim, gguf::Writer* w) {
  const std::string a = o.arch;
  if (a == "phimoe" || (a == "mistral3" && o.moe)) {  // experts as llama.cpp reads them
    w->SetU32(a + ".expert_count", o.experts);
    w->SetU32(a + ".expert_used_count", o.experts_used);
  }
  if (a == "phi3" || a == "phimoe") {
    const double scale = static_cast<double>(o.ctx) / o.yarn_orig_ctx;
    w->SetU32(a + ".rope.scaling.original_context_length", o.yarn_orig_ctx);
    w->SetF32(a + ".rope.scaling.attn_factor",
              static_cast<float>(std::sqrt(1.0 + std::log(scale) / std::log(o.yarn_orig_ctx))));
    w->SetU32(a + ".attention.sliding_window", o.swa);
    return;
  }
  w->SetU32(a + ".attention.key_length", head_dim);
  w->SetU32(a + ".attention.value_length", head_dim);
  w->SetString(a + ".rope.scaling.type", "yarn");
  w->SetF32(a + ".rope.scaling.factor", o.yarn_factor);
  w->SetU32(a + ".rope.scaling.original_context_length", o.yarn_orig_ctx);
  w->SetF32(a + ".rope.scaling.yarn_beta_fast", 32.0f);
  w->SetF32(a + ".rope.scaling.yarn_beta_slow", 1.0f);
  w->SetF32(a + ".rope.scaling.yarn_log_multiplier", 1.0f);
  w->SetF32(a + ".attention.temperature_scale", 0.1f);
}

// The architecture's hyperparameters and the vocabulary file's tokenizer.* entries.
void SetMetadata(const SynthOptions& o, int head_dim, const gguf::File& vocab, gguf::Writer* w) {
  const bool next = IsHybrid(o.arch);
  const bool oss = o.arch == "gpt-oss";
  const bool moe = o.arch == "qwen3moe" || o.arch == "qwen3next" || o.arch == "qwen35moe" || oss;
  const bool gemma = o.arch == "gemma3";
  const std::string a = o.arch;
  w->SetString("general.architecture", a);
  // Not "phi3" in the name: llama.cpp then looks up Phi-3's <|endoftext|>, which the borrowed
  // vocabulary lacks.
  w->SetString("general.name", "lamina-synth random " + (a == "phi3"     ? std::string("phi 3")
                                                         : a == "phimoe" ? std::string("phi moe")
                                                                         : a));
  w->SetU32(a + ".embedding_length", o.dim);
  w->SetU32(a + ".block_count", o.layers + (IsQwen35(a) ? o.nextn : 0));
  w->SetU32(a + ".attention.head_count", o.heads);
  w->SetU32(a + ".attention.head_count_kv", o.kv_heads);
  w->SetU32(a + ".feed_forward_length", o.ff);
  w->SetU32(a + ".context_length", o.ctx);
  w->SetU32(a + ".rope.dimension_count",
            next ? head_dim / 4 : (o.rope_dims > 0 ? o.rope_dims : head_dim));
  w->SetF32(a + ".rope.freq_base", moe || next || gemma || a == "mistral3" ? 1e6f : 10000.0f);
  w->SetF32(a + ".attention.layer_norm_rms_epsilon", moe || next || gemma ? 1e-6f : 1e-5f);
  if (IsQwen35(a)) {
    w->SetI32Array(a + ".rope.dimension_sections",
                   std::vector<int32_t>(o.rope_sections.begin(), o.rope_sections.end()));
    if (!moe) w->SetU32(a + ".attention.key_length", head_dim);
    if (!moe) w->SetU32(a + ".attention.value_length", head_dim);
    if (o.nextn > 0) w->SetU32(a + ".nextn_predict_layers", o.nextn);
  }
  if (gemma) {  // the 4B model's linear RoPE scaling (global layers only)
    w->SetU32(a + ".attention.key_length", head_dim);
    w->SetU32(a + ".attention.value_length", head_dim);
    w->SetU32(a + ".attention.sliding_window", o.swa);
    w->SetU32(a + ".attention.sliding_window_pattern", o.swa_pattern);
    w->SetString(a + ".rope.scaling.type", "linear");
    w->SetF32(a + ".rope.scaling.factor", 8.0f);
  }
  if (oss) {  // the window alternates (the default pattern 2); YaRN as the real models
    w->SetU32(a + ".attention.sliding_window", o.swa);
    if (o.yarn_factor > 0.0f) {
      w->SetString(a + ".rope.scaling.type", "yarn");
      w->SetF32(a + ".rope.scaling.factor", o.yarn_factor);
      w->SetU32(a + ".rope.scaling.original_context_length", o.yarn_orig_ctx);
    }
  }
  if (a == "phi3" || a == "mistral3" || a == "phimoe") SetPhi3OrMistral3Metadata(o, head_dim, w);
  if (moe) {
    w->SetU32(a + ".attention.key_length", head_dim);
    w->SetU32(a + ".attention.value_length", head_dim);
    w->SetU32(a + ".expert_count", o.experts);
    w->SetU32(a + ".expert_used_count", o.experts_used);
    w->SetU32(a + ".expert_feed_forward_length", o.ff_exp);
  }
  if (next) {
    if (moe) w->SetU32(a + ".expert_shared_feed_forward_length", o.ff_exp);
    w->SetU32(a + ".ssm.conv_kernel", 4);
    w->SetU32(a + ".ssm.state_size", o.ssm_head_dim);
    w->SetU32(a + ".ssm.group_count", o.ssm_k_heads);
    w->SetU32(a + ".ssm.time_step_rank", o.ssm_v_heads);
    w->SetU32(a + ".ssm.inner_size", o.ssm_v_heads * o.ssm_head_dim);
    w->SetU32(a + ".full_attention_interval", o.attn_interval);
  }
  for (const auto& [key, value] : vocab.metadata()) {
    if (key.rfind("tokenizer.", 0) == 0) w->SetValue(key, value);
  }
}

// Adds tensors of random weights (normal, scaled by 1/sqrt(cols)) in a given type, and filled
// F32 vectors, to a writer; the weights come from one seeded generator, in call order.
class WeightWriter {
 public:
  WeightWriter(gguf::Writer* w, uint64_t seed) : w_(w), rng_(seed) {}

  // A [n_mat] stack of [rows x cols] matrices (n_mat = 1: a plain 2-D weight).
  // `sd`: the weights' standard deviation (0: 1 / sqrt(cols)).
  void Stacked(const std::string& name, int cols, int rows, int n_mat, GgmlType t,
               float sd = 0.0f) {
    std::vector<float> row(cols);  // [cols]
    const size_t row_bytes = RowSize(t, cols);
    std::vector<uint8_t> data(row_bytes * rows * n_mat);  // [n_mat * rows][row_bytes]
    const float scale = sd > 0.0f ? sd : 1.0f / std::sqrt(static_cast<float>(cols));
    for (size_t r = 0; r < static_cast<size_t>(rows) * n_mat; ++r) {
      for (float& x : row) x = normal_(rng_) * scale;
      GetKernels(t).quantize(row.data(), data.data() + r * row_bytes, cols);
    }
    if (n_mat == 1) {
      w_->AddTensor(name, t, {cols, rows}, data.data(), data.size());
    } else {
      w_->AddTensor(name, t, {cols, rows, n_mat}, data.data(), data.size());
    }
  }
  void Matrix(const std::string& name, int cols, int rows, GgmlType t, float sd = 0.0f) {
    Stacked(name, cols, rows, 1, t, sd);
  }
  void Filled(const std::string& name, int n, float value) {
    std::vector<float> v(n, value);
    w_->AddTensor(name, GgmlType::kF32, {n}, v.data(), v.size() * 4);
  }
  void Ones(const std::string& name, int n) { Filled(name, n, 1.0f); }
  // mean + sd * N(0, 1) per element.
  void Normal(const std::string& name, int n, float mean, float sd) {
    std::vector<float> v(n);  // [n]
    for (float& x : v) x = mean + sd * normal_(rng_);
    w_->AddTensor(name, GgmlType::kF32, {n}, v.data(), v.size() * 4);
  }
  // An F32 tensor of ne0 x ne1 values N(0, sigma^2) (ne1 = 1: a vector): biases, sinks.
  void Random(const std::string& name, int ne0, int ne1, float sigma) {
    std::vector<float> v(static_cast<size_t>(ne0) * ne1);  // [ne1, ne0]
    for (float& x : v) x = sigma * normal_(rng_);
    if (ne1 == 1) {
      w_->AddTensor(name, GgmlType::kF32, {ne0}, v.data(), v.size() * 4);
    } else {
      w_->AddTensor(name, GgmlType::kF32, {ne0, ne1}, v.data(), v.size() * 4);
    }
  }
  // mean + sd * |N(0, 1)| per element (positive factors).
  void AbsNormal(const std::string& name, int n, float mean, float sd) {
    std::vector<float> v(n);  // [n]
    for (float& x : v) x = mean + sd * std::fabs(normal_(rng_));
    w_->AddTensor(name, GgmlType::kF32, {n}, v.data(), v.size() * 4);
  }
  // A norm weight 1 + N(0, 0.2^2) per element (Gemma's 1 + w as the file stores it).
  void Norm(const std::string& name, int n) {
    std::vector<float> v(n);  // [n]
    for (float& x : v) x = 1.0f + 0.2f * normal_(rng_);
    w_->AddTensor(name, GgmlType::kF32, {n}, v.data(), v.size() * 4);
  }

 private:
  gguf::Writer* w_;
  std::mt19937_64 rng_;
  std::normal_distribution<float> normal_{0.0f, 1.0f};
};

// A hybrid layer's token mixer (tensor names start with `p`): Gated DeltaNet, or gated attention
// every attn_interval-th layer (`attention` forces it: a multi-token-prediction block). qwen35
// files hold ssm_beta / ssm_alpha where qwen3next holds the fused ssm_ba, and draw their dt
// biases and decay rates (qwen3next: 0 and -1).
void AddHybridMixer(const SynthOptions& o, const std::string& p, bool attention, int head_dim,
                    GgmlType type, WeightWriter& ww) {
  const int dim = o.dim, heads = o.heads, kv_heads = o.kv_heads;
  const int ssm_inner = o.ssm_v_heads * o.ssm_head_dim;
  const int conv_channels = 2 * o.ssm_k_heads * o.ssm_head_dim + ssm_inner;
  const bool q35 = IsQwen35(o.arch);
  if (!attention) {  // Gated DeltaNet
    ww.Matrix(p + "attn_qkv.weight", dim, conv_channels, type);
    ww.Matrix(p + "attn_gate.weight", dim, ssm_inner, type);
    ww.Matrix(p + "ssm_conv1d.weight", 4, conv_channels, GgmlType::kF32);
    if (q35) {
      ww.Normal(p + "ssm_dt.bias", o.ssm_v_heads, 0.0f, 0.5f);
      ww.Normal(p + "ssm_a", o.ssm_v_heads, -1.0f, 0.2f);
      ww.Matrix(p + "ssm_beta.weight", dim, o.ssm_v_heads, type);
      ww.Matrix(p + "ssm_alpha.weight", dim, o.ssm_v_heads, type);
      ww.Norm(p + "ssm_norm.weight", o.ssm_head_dim);
    } else {
      ww.Filled(p + "ssm_dt.bias", o.ssm_v_heads, 0.0f);
      ww.Filled(p + "ssm_a", o.ssm_v_heads, -1.0f);
      ww.Matrix(p + "ssm_ba.weight", dim, 2 * o.ssm_v_heads, type);
      ww.Ones(p + "ssm_norm.weight", o.ssm_head_dim);
    }
    ww.Matrix(p + "ssm_out.weight", ssm_inner, dim, type);
    return;
  }
  // Gated attention: per head [q | gate].
  ww.Matrix(p + "attn_q.weight", dim, 2 * heads * head_dim, type);
  ww.Matrix(p + "attn_k.weight", dim, kv_heads * head_dim, type);
  ww.Matrix(p + "attn_v.weight", dim, kv_heads * head_dim, type);
  ww.Matrix(p + "attn_output.weight", heads * head_dim, dim, type);
  if (q35) {
    ww.Norm(p + "attn_q_norm.weight", head_dim);
    ww.Norm(p + "attn_k_norm.weight", head_dim);
  } else {
    ww.Ones(p + "attn_q_norm.weight", head_dim);
    ww.Ones(p + "attn_k_norm.weight", head_dim);
  }
}

// A hybrid layer after its attn_norm: the mixer, post_attention_norm and the FFN (the experts
// and the shared expert; qwen35: a dense SwiGLU FFN).
void AddHybridLayer(const SynthOptions& o, const std::string& p, bool attention, int head_dim,
                    GgmlType type, WeightWriter& ww) {
  const int dim = o.dim, experts = o.experts, ff_exp = o.ff_exp;
  const bool q35 = IsQwen35(o.arch);
  if (q35) {
    AddHybridMixer(o, p, attention, head_dim, type, ww);
    ww.Norm(p + "post_attention_norm.weight", dim);
  } else {
    ww.Ones(p + "post_attention_norm.weight", dim);
    AddHybridMixer(o, p, attention, head_dim, type, ww);
  }
  if (o.arch == "qwen35") {
    ww.Matrix(p + "ffn_gate.weight", dim, o.ff, type);
    ww.Matrix(p + "ffn_up.weight", dim, o.ff, type);
    ww.Matrix(p + "ffn_down.weight", o.ff, dim, type);
    return;
  }
  ww.Matrix(p + "ffn_gate_inp.weight", dim, experts, GgmlType::kF32);
  ww.Stacked(p + "ffn_gate_exps.weight", dim, ff_exp, experts, type);
  ww.Stacked(p + "ffn_up_exps.weight", dim, ff_exp, experts, type);
  ww.Stacked(p + "ffn_down_exps.weight", ff_exp, dim, experts, type);
  ww.Matrix(p + "ffn_gate_inp_shexp.weight", dim, 1, GgmlType::kF32);
  ww.Matrix(p + "ffn_gate_shexp.weight", dim, ff_exp, type);
  ww.Matrix(p + "ffn_up_shexp.weight", dim, ff_exp, type);
  ww.Matrix(p + "ffn_down_shexp.weight", ff_exp, dim, type);
}

// A qwen35 multi-token-prediction block `blk.<il>.` (llama.cpp's NextN layout): a gated
// attention layer with its FFN, and the nextn projection of [enorm(embedding); hnorm(hidden)]
// with its norms.
void AddNextnBlock(const SynthOptions& o, int il, int head_dim, GgmlType type, WeightWriter& ww) {
  const std::string p = "blk." + std::to_string(il) + ".";
  ww.Norm(p + "attn_norm.weight", o.dim);
  AddHybridLayer(o, p, /*attention=*/true, head_dim, type, ww);
  ww.Matrix(p + "nextn.eh_proj.weight", 2 * o.dim, o.dim, type);
  ww.Norm(p + "nextn.enorm.weight", o.dim);
  ww.Norm(p + "nextn.hnorm.weight", o.dim);
  ww.Norm(p + "nextn.shared_head_norm.weight", o.dim);
}

// A gemma3 layer after its attn_norm: attention with Q/K norms and a norm after it, a
// GELU-gated FFN with a norm after it.
void AddGemmaLayer(const SynthOptions& o, const std::string& p, int head_dim, GgmlType type,
                   WeightWriter& ww) {
  const int dim = o.dim, heads = o.heads, kv_heads = o.kv_heads, ff = o.ff;
  ww.Matrix(p + "attn_q.weight", dim, heads * head_dim, type);
  ww.Matrix(p + "attn_k.weight", dim, kv_heads * head_dim, type);
  ww.Matrix(p + "attn_v.weight", dim, kv_heads * head_dim, type);
  ww.Matrix(p + "attn_output.weight", heads * head_dim, dim, type);
  ww.Norm(p + "attn_q_norm.weight", head_dim);
  ww.Norm(p + "attn_k_norm.weight", head_dim);
  ww.Norm(p + "post_attention_norm.weight", dim);
  ww.Norm(p + "ffn_norm.weight", dim);
  ww.Matrix(p + "ffn_gate.weight", dim, ff, type);
  ww.Matrix(p + "ffn_up.weight", dim, ff, type);
  ww.Matrix(p + "ffn_down.weight", ff, dim, type);
  ww.Norm(p + "post_ffw_norm.weight", dim);
}

// A gpt-oss layer after its attn_norm: attention with biases and sinks, post_attention_norm,
// the router and the experts with their biases.
void AddGptOssLayer(const SynthOptions& o, const std::string& p, int head_dim, GgmlType type,
                    WeightWriter& ww) {
  const int dim = o.dim, heads = o.heads, kv_heads = o.kv_heads;
  const int experts = o.experts, ff_exp = o.ff_exp;
  ww.Matrix(p + "attn_q.weight", dim, heads * head_dim, type);
  ww.Random(p + "attn_q.bias", heads * head_dim, 1, 0.2f);
  ww.Matrix(p + "attn_k.weight", dim, kv_heads * head_dim, type);
  ww.Random(p + "attn_k.bias", kv_heads * head_dim, 1, 0.2f);
  ww.Matrix(p + "attn_v.weight", dim, kv_heads * head_dim, type);
  ww.Random(p + "attn_v.bias", kv_heads * head_dim, 1, 0.2f);
  ww.Matrix(p + "attn_output.weight", heads * head_dim, dim, type);
  ww.Random(p + "attn_output.bias", dim, 1, 0.2f);
  ww.Random(p + "attn_sinks.weight", heads, 1, 1.0f);
  ww.Norm(p + "post_attention_norm.weight", dim);
  ww.Matrix(p + "ffn_gate_inp.weight", dim, experts, GgmlType::kF32);
  ww.Random(p + "ffn_gate_inp.bias", experts, 1, 0.5f);
  ww.Stacked(p + "ffn_gate_exps.weight", dim, ff_exp, experts, type);
  ww.Random(p + "ffn_gate_exps.bias", ff_exp, experts, 0.2f);
  ww.Stacked(p + "ffn_up_exps.weight", dim, ff_exp, experts, type);
  ww.Random(p + "ffn_up_exps.bias", ff_exp, experts, 0.2f);
  ww.Stacked(p + "ffn_down_exps.weight", ff_exp, dim, experts, type);
  ww.Random(p + "ffn_down_exps.bias", dim, experts, 0.2f);
}

// A phi3 layer after its attn_norm: fused attn_qkv, ffn_norm, fused ffn_up (gate rows, then up
// rows); or a mistral3 one: llama's tensors (with --biases random biases; with --moe a router
// and experts each --ff wide instead of the FFN). Norm weights are drawn around 1.
void AddPhi3OrMistral3Layer(const SynthOptions& o, const std::string& p, int head_dim,
                            GgmlType type, WeightWriter& ww) {
  const int dim = o.dim, q = o.heads * head_dim, kv = o.kv_heads * head_dim, ff = o.ff;
  const bool bias = o.arch == "mistral3" && o.biases;
  if (o.arch == "phi3") {
    ww.Matrix(p + "attn_qkv.weight", dim, q + 2 * kv, type);
  } else {
    ww.Matrix(p + "attn_q.weight", dim, q, type);
    if (bias) ww.Random(p + "attn_q.bias", q, 1, 0.2f);
    ww.Matrix(p + "attn_k.weight", dim, kv, type);
    if (bias) ww.Random(p + "attn_k.bias", kv, 1, 0.2f);
    ww.Matrix(p + "attn_v.weight", dim, kv, type);
    if (bias) ww.Random(p + "attn_v.bias", kv, 1, 0.2f);
  }
  ww.Matrix(p + "attn_output.weight", q, dim, type);
  if (bias) ww.Random(p + "attn_output.bias", dim, 1, 0.2f);
  ww.Norm(p + "ffn_norm.weight", dim);
  if (o.arch == "phi3") {
    ww.Matrix(p + "ffn_up.weight", dim, 2 * ff, type);
  } else if (o.moe) {
    ww.Matrix(p + "ffn_gate_inp.weight", dim, o.experts, GgmlType::kF32);  // routers stay F32
    if (!o.no_expert_gate) ww.Stacked(p + "ffn_gate_exps.weight", dim, ff, o.experts, type);
    ww.Stacked(p + "ffn_up_exps.weight", dim, ff, o.experts, type);
    ww.Stacked(p + "ffn_down_exps.weight", ff, dim, o.experts, type);
    return;
  } else {
    ww.Matrix(p + "ffn_gate.weight", dim, ff, type);
    if (bias) ww.Random(p + "ffn_gate.bias", ff, 1, 0.2f);
    ww.Matrix(p + "ffn_up.weight", dim, ff, type);
    if (bias) ww.Random(p + "ffn_up.bias", ff, 1, 0.2f);
  }
  ww.Matrix(p + "ffn_down.weight", ff, dim, type);
  if (bias) ww.Random(p + "ffn_down.bias", dim, 1, 0.2f);
}

// A phimoe layer (Phi-3.5-MoE as llama.cpp loads it): attn_norm with its bias, attn_q/k/v and
// attn_output with biases, ffn_norm with its bias, the router and experts each --ff wide.
void AddPhiMoeLayer(const SynthOptions& o, const std::string& p, int head_dim, GgmlType type,
                    WeightWriter& ww) {
  const int dim = o.dim, q = o.heads * head_dim, kv = o.kv_heads * head_dim, ff = o.ff;
  ww.Norm(p + "attn_norm.weight", dim);
  ww.Random(p + "attn_norm.bias", dim, 1, 0.2f);
  ww.Matrix(p + "attn_q.weight", dim, q, type);
  ww.Random(p + "attn_q.bias", q, 1, 0.2f);
  ww.Matrix(p + "attn_k.weight", dim, kv, type);
  ww.Random(p + "attn_k.bias", kv, 1, 0.2f);
  ww.Matrix(p + "attn_v.weight", dim, kv, type);
  ww.Random(p + "attn_v.bias", kv, 1, 0.2f);
  ww.Matrix(p + "attn_output.weight", q, dim, type);
  ww.Random(p + "attn_output.bias", dim, 1, 0.2f);
  ww.Norm(p + "ffn_norm.weight", dim);
  ww.Random(p + "ffn_norm.bias", dim, 1, 0.2f);
  ww.Matrix(p + "ffn_gate_inp.weight", dim, o.experts, GgmlType::kF32);  // routers stay F32
  ww.Stacked(p + "ffn_gate_exps.weight", dim, ff, o.experts, type);
  ww.Stacked(p + "ffn_up_exps.weight", dim, ff, o.experts, type);
  ww.Stacked(p + "ffn_down_exps.weight", ff, dim, o.experts, type);
}

// A llama or qwen3moe layer after its attn_norm (tensor names start with `p`).
void AddLayer(const SynthOptions& o, const std::string& p, bool moe, int head_dim, GgmlType type,
              WeightWriter& ww) {
  const int dim = o.dim, heads = o.heads, kv_heads = o.kv_heads;
  const int experts = o.experts, ff_exp = o.ff_exp, ff = o.ff;
  ww.Matrix(p + "attn_q.weight", dim, heads * head_dim, type);
  ww.Matrix(p + "attn_k.weight", dim, kv_heads * head_dim, type);
  ww.Matrix(p + "attn_v.weight", dim, kv_heads * head_dim, type);
  ww.Matrix(p + "attn_output.weight", heads * head_dim, dim, type);
  ww.Ones(p + "ffn_norm.weight", dim);
  if (moe) {
    ww.Ones(p + "attn_q_norm.weight", head_dim);
    ww.Ones(p + "attn_k_norm.weight", head_dim);
    ww.Matrix(p + "ffn_gate_inp.weight", dim, experts, GgmlType::kF32);  // routers stay F32
    ww.Stacked(p + "ffn_gate_exps.weight", dim, ff_exp, experts, type);
    ww.Stacked(p + "ffn_up_exps.weight", dim, ff_exp, experts, type);
    ww.Stacked(p + "ffn_down_exps.weight", ff_exp, dim, experts, type);
    return;
  }
  ww.Matrix(p + "ffn_gate.weight", dim, ff, type);
  ww.Matrix(p + "ffn_up.weight", dim, ff, type);
  ww.Matrix(p + "ffn_down.weight", ff, dim, type);
}

// phi3's LongRoPE factors, one per rotated pair (phimoe: per pair of the head, as llama.cpp's
// phimoe loader wants them): short 1 + 0.5 |N(0, 1)|, long 1 + 4 |N(0, 1)| (the published ones
// run from 1 to about 3 and 60).
void AddLongRopeFactors(const SynthOptions& o, int head_dim, WeightWriter& ww) {
  const int pairs = (o.rope_dims > 0 && o.arch != "phimoe" ? o.rope_dims : head_dim) / 2;
  ww.AbsNormal("rope_factors_long.weight", pairs, 1.0f, 4.0f);
  ww.AbsNormal("rope_factors_short.weight", pairs, 1.0f, 0.5f);
}

// Writes the model; the exit code.
int Synth(const SynthOptions& o) {
  GgmlType type = GgmlType::kF32;
  if (!FindQuantType(o.type_name, &type)) {
    std::fprintf(stderr, "lamina-synth: no quantizer for type %s\n", o.type_name.c_str());
    return 2;
  }
  Result<std::unique_ptr<gguf::File>> vocab = gguf::File::Open(o.vocab_from);
  if (!vocab.ok()) {
    std::fprintf(stderr, "lamina-synth: %s\n", vocab.error().message.c_str());
    return 3;
  }
  const gguf::Value* tokens = (*vocab)->Find("tokenizer.ggml.tokens");
  if (tokens == nullptr) {
    std::fprintf(stderr, "lamina-synth: %s has no tokenizer.ggml.tokens\n", o.vocab_from.c_str());
    return 3;
  }
  const int n_vocab = static_cast<int>(tokens->array.size());
  const int head_dim = o.head_dim_opt > 0 ? o.head_dim_opt : o.dim / o.heads;
  const bool next = IsHybrid(o.arch);
  const bool moe = o.arch == "qwen3moe";
  const bool gemma = o.arch == "gemma3";
  const bool oss = o.arch == "gpt-oss";

  gguf::Writer w;
  SetMetadata(o, head_dim, **vocab, &w);
  WeightWriter ww(&w, o.seed);
  ww.Matrix("token_embd.weight", o.dim, n_vocab, type, o.embd_sd);
  for (int l = 0; l < o.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    if (gemma) {
      ww.Norm(p + "attn_norm.weight", o.dim);
      AddGemmaLayer(o, p, head_dim, type, ww);
      continue;
    }
    if (oss) {
      ww.Norm(p + "attn_norm.weight", o.dim);
      AddGptOssLayer(o, p, head_dim, type, ww);
      continue;
    }
    if (o.arch == "phi3" || o.arch == "mistral3") {
      ww.Norm(p + "attn_norm.weight", o.dim);
      AddPhi3OrMistral3Layer(o, p, head_dim, type, ww);
      continue;
    }
    if (o.arch == "phimoe") {
      AddPhiMoeLayer(o, p, head_dim, type, ww);
      continue;
    }
    if (IsQwen35(o.arch)) {
      ww.Norm(p + "attn_norm.weight", o.dim);
    } else {
      ww.Ones(p + "attn_norm.weight", o.dim);
    }
    if (next) {
      AddHybridLayer(o, p, (l + 1) % o.attn_interval == 0, head_dim, type, ww);
    } else {
      AddLayer(o, p, moe, head_dim, type, ww);
    }
  }
  if (gemma) {
    ww.Norm("output_norm.weight", o.dim);  // the output head is the embedding (tied)
  } else if (IsQwen35(o.arch)) {
    ww.Norm("output_norm.weight", o.dim);
    ww.Matrix("output.weight", o.dim, n_vocab, type);
    for (int i = 0; i < o.nextn; ++i) AddNextnBlock(o, o.layers + i, head_dim, type, ww);
  } else if (o.arch == "phi3" || o.arch == "mistral3") {
    ww.Norm("output_norm.weight", o.dim);
    ww.Matrix("output.weight", o.dim, n_vocab, type);
    if (o.arch == "phi3") AddLongRopeFactors(o, head_dim, ww);
  } else if (o.arch == "phimoe") {
    ww.Norm("output_norm.weight", o.dim);
    ww.Random("output_norm.bias", o.dim, 1, 0.2f);
    ww.Matrix("output.weight", o.dim, n_vocab, type);
    ww.Random("output.bias", n_vocab, 1, 0.2f);
    AddLongRopeFactors(o, head_dim, ww);
  } else {
    ww.Ones("output_norm.weight", o.dim);
    ww.Matrix("output.weight", o.dim, n_vocab, type);
  }
  if (o.rope_freqs && (o.arch == "llama" || o.arch == "mistral3")) {
    // Llama 3.1's files hold factors from 1 to 8 that only the slow pairs use; random ones on
    // every pair make a golden see each of them.
    ww.AbsNormal("rope_freqs.weight", head_dim / 2, 1.0f, 4.0f);
  }
  Status st = w.WriteFile(o.out_path);
  if (!st.ok()) {
    std::fprintf(stderr, "lamina-synth: %s\n", st.error().message.c_str());
    return 1;
  }
  std::fprintf(stderr, "lamina-synth: wrote %s\n", o.out_path.c_str());
  return 0;
}

}  // namespace
}  // namespace lamina

int main(int argc, char** argv) {
  CLI::App app{
      "Write a random-weight llama, qwen3moe, qwen3next, qwen35, qwen35moe, gemma3, gpt-oss, phi3, "
      "mistral3 or phimoe GGUF"};
  lamina::SynthOptions options;
  lamina::AddOptions(&app, &options);
  CLI11_PARSE(app, argc, argv);
  return lamina::Synth(options);
}
