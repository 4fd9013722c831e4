// Hyper-parameters from GGUF metadata: the llama-like `<arch>.*` keys, RoPE scaling and its
// command-line overrides.
#include "model/hparams.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <vector>

namespace lamina {

namespace {

std::string Quoted(const std::string& key) { return "\"" + key + "\""; }

// An integer key in [1, max]; missing, another type (e.g. a per-layer array) or out of range is
// an error naming it.
Result<int64_t> RequiredInt(const gguf::File& f, const std::string& key, int64_t max) {
  Result<int64_t> r = f.GetInt(key);
  if (!r.ok()) return r.error();  // names the file and the key: missing or another type
  if (*r <= 0 || *r > max) {
    return Error{f.path() + ": metadata key " + Quoted(key) + " = " + std::to_string(*r) +
                 " is out of range [1, " + std::to_string(max) + "]"};
  }
  return r;
}

// Parses the layer index of a tensor named "blk.<N>.<rest>" (N in decimal without leading
// zeros, as llama.cpp writes it); false for any other name. An index too long for int64 reads
// as INT64_MAX (beyond any layer count).
bool ParseLayerIndex(const std::string& name, int64_t* index) {
  constexpr std::string_view kPrefix = "blk.";
  if (!name.starts_with(kPrefix)) return false;
  size_t end = kPrefix.size();
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  const size_t digits = end - kPrefix.size();
  if (digits == 0 || end >= name.size() || name[end] != '.') return false;
  if (digits > 1 && name[kPrefix.size()] == '0') return false;
  constexpr size_t kMaxDigits = 18;  // 10^18 - 1 < INT64_MAX
  if (digits > kMaxDigits) {
    *index = INT64_MAX;
    return true;
  }
  int64_t v = 0;
  for (size_t k = kPrefix.size(); k < end; ++k) v = v * 10 + (name[k] - '0');
  *index = v;
  return true;
}

}  // namespace

Error HparamError(const gguf::File& f, const std::string& key, int64_t value,
                  const std::string& why, const std::string& how_defaulted) {
  std::string what = "metadata key " + Quoted(key);
  if (!how_defaulted.empty() && f.Find(key) == nullptr) what += " (absent; " + how_defaulted + ")";
  return Error{f.path() + ": " + what + " = " + std::to_string(value) + ", but " + why};
}

const gguf::TensorInfo* FirstLayerTensor(const gguf::File& f, int n_layer,
                                         const std::string& suffix, int* layer) {
  for (int i = 0; i < n_layer; ++i) {
    if (const gguf::TensorInfo* t = f.FindTensor("blk." + std::to_string(i) + "." + suffix)) {
      if (layer != nullptr) *layer = i;
      return t;
    }
  }
  return nullptr;
}

Status CheckLayerCount(const gguf::File& f, const std::string& key, int64_t n_layer) {
  std::vector<int64_t> layers;  // [tensors named blk.N.*] their N; sized by the tensor table
  for (const gguf::TensorInfo& t : f.tensors()) {
    int64_t index = 0;
    if (!ParseLayerIndex(t.name, &index)) continue;
    if (index >= n_layer) {
      // The layer, not the name: the rest of a name from the file may be any bytes.
      return HparamError(f, key, n_layer,
                         "tensors of blk." + std::to_string(index) +
                             " are present (layers are blk.0 .. blk." +
                             std::to_string(n_layer - 1) + ")");
    }
    layers.push_back(index);
  }
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  if (static_cast<int64_t>(layers.size()) == n_layer) return Status::Ok();
  if (layers.empty()) return HparamError(f, key, n_layer, "no blk.N tensor is present");
  if (static_cast<int64_t>(layers.size()) == layers.back() + 1) {
    return HparamError(f, key, n_layer,
                       "the tensors hold " + std::to_string(layers.size()) +
                           " layers (blk.0 .. blk." + std::to_string(layers.back()) + ")");
  }
  int64_t missing = 0;
  while (layers[missing] == missing) ++missing;
  return HparamError(f, key, n_layer,
                     "the tensors hold " + std::to_string(layers.size()) +
                         " layers and none of blk." + std::to_string(missing));
}

namespace {

// The required counts of hp->arch, checked against the layers and token embedding present.
Status ReadCounts(const gguf::File& f, Hparams* hp) {
  const std::string& a = hp->arch;
#define LAMINA_REQ_INT(field, suffix, max)                        \
  do {                                                            \
    Result<int64_t> r_ = RequiredInt(f, ArchKey(a, suffix), max); \
    if (!r_.ok()) return r_.error();                              \
    hp->field = static_cast<int>(*r_);                            \
  } while (0)
  LAMINA_REQ_INT(n_embd, "embedding_length", kMaxHparamInt);
  LAMINA_REQ_INT(n_layer, "block_count", kMaxHparamInt);
  LAMINA_REQ_INT(n_head, "attention.head_count", kMaxHeads);
  LAMINA_REQ_INT(n_ff, "feed_forward_length", kMaxHparamInt);
  LAMINA_REQ_INT(n_ctx_train, "context_length", kMaxContextLength);
#undef LAMINA_REQ_INT
  // Before anything is sized from the counts, check them against the tensors present.
  Status layers = CheckLayerCount(f, ArchKey(a, "block_count"), hp->n_layer);
  if (!layers.ok()) return layers.error();
  if (const gguf::TensorInfo* embd = f.FindTensor("token_embd.weight");
      embd != nullptr && embd->ne[0] != hp->n_embd) {
    return HparamError(
        f, ArchKey(a, "embedding_length"), hp->n_embd,
        "token_embd.weight has rows of " + std::to_string(embd->ne[0]) + " elements");
  }
  return Status::Ok();
}

// KV heads and head dimension, checked against the first layer's attn_q and attn_k rows
// (q_rows_per_head_dim query rows per head and head dimension); value_length must equal the
// head dimension.
Status ReadHeadShape(const gguf::File& f, int q_rows_per_head_dim, Hparams* hp) {
  const std::string& a = hp->arch;
  const std::string head_key = ArchKey(a, "attention.head_count");
  const std::string kv_key = ArchKey(a, "attention.head_count_kv");
  Result<int64_t> n_head_kv = f.GetIntOr(kv_key, hp->n_head);
  if (!n_head_kv.ok()) return n_head_kv.error();
  if (*n_head_kv <= 0 || *n_head_kv > hp->n_head || hp->n_head % *n_head_kv != 0) {
    return HparamError(f, kv_key, *n_head_kv,
                       "it does not divide " + head_key + " " + std::to_string(hp->n_head));
  }
  hp->n_head_kv = static_cast<int>(*n_head_kv);
  int q_layer = 0;
  int k_layer = 0;
  const gguf::TensorInfo* wq = FirstLayerTensor(f, hp->n_layer, "attn_q.weight", &q_layer);
  const gguf::TensorInfo* wk = FirstLayerTensor(f, hp->n_layer, "attn_k.weight", &k_layer);
  const std::string q_name = "blk." + std::to_string(q_layer) + ".attn_q.weight";
  const std::string k_name = "blk." + std::to_string(k_layer) + ".attn_k.weight";
  const int64_t q_per_head = q_rows_per_head_dim;  // query rows per head and head dimension
  const std::string q_multiple = q_per_head == 1 ? "it" : std::to_string(q_per_head) + " x it";
  if (wq != nullptr && wq->ne[1] % (q_per_head * hp->n_head) != 0) {
    return HparamError(
        f, head_key, hp->n_head,
        q_name + " has " + std::to_string(wq->ne[1]) + " rows, not a multiple of " + q_multiple);
  }
  if (wk != nullptr && wk->ne[1] % hp->n_head_kv != 0) {
    return HparamError(
        f, kv_key, hp->n_head_kv,
        k_name + " has " + std::to_string(wk->ne[1]) + " rows, not a multiple of it");
  }
  const std::string key_len_key = ArchKey(a, "attention.key_length");
  const std::string key_len_default = "embedding_length " + std::to_string(hp->n_embd) +
                                      " / head_count " + std::to_string(hp->n_head);
  Result<int64_t> key_len = f.GetIntOr(key_len_key, hp->n_embd / hp->n_head);
  if (!key_len.ok()) return key_len.error();
  if (*key_len <= 0 || *key_len > kMaxHeadDim || *key_len % 2 != 0) {
    return HparamError(
        f, key_len_key, *key_len,
        "a head dimension must be even and in [2, " + std::to_string(kMaxHeadDim) + "]",
        key_len_default);
  }
  hp->head_dim = static_cast<int>(*key_len);
  if (wq != nullptr && wq->ne[1] != q_per_head * hp->q_dim()) {
    return HparamError(f, key_len_key, hp->head_dim,
                       q_name + " has " + std::to_string(wq->ne[1]) + " rows for " +
                           std::to_string(hp->n_head) + " heads (" +
                           std::to_string(wq->ne[1] / (q_per_head * hp->n_head)) + " per head" +
                           (q_per_head == 1 ? "" : " and query/gate half") + ")",
                       key_len_default);
  }
  if (wk != nullptr && wk->ne[1] != hp->kv_dim()) {
    return HparamError(f, kv_key, hp->n_head_kv,
                       k_name + " has " + std::to_string(wk->ne[1]) + " rows, not " +
                           std::to_string(hp->n_head_kv) + " x head dimension " +
                           std::to_string(hp->head_dim));
  }
  // K and V rows share one head_dim here; a model whose value_length differs is rejected
  // rather than misread.
  Result<int64_t> value_len = f.GetIntOr(ArchKey(a, "attention.value_length"), hp->head_dim);
  if (!value_len.ok()) return value_len.error();
  if (*value_len != hp->head_dim) {
    return Error{f.path() + ": " + ArchKey(a, "attention.value_length") + " = " +
                 std::to_string(*value_len) + " differs from key_length " +
                 std::to_string(hp->head_dim) + " (unsupported)"};
  }
  return Status::Ok();
}

// The dense FFN width (checked against ffn_up: up_rows_per_ff x n_ff rows), the RMS norm
// epsilon and RoPE, its scaling resolved.
Status ReadNormAndRope(const gguf::File& f, RopeStyle rope_style, int up_rows_per_ff, Hparams* hp) {
  const std::string& a = hp->arch;
  // Dense FFN widths (MoE layers have no ffn_up.weight; ReadMoeHparams bounds n_ff there).
  int ff_layer = 0;
  if (const gguf::TensorInfo* up = FirstLayerTensor(f, hp->n_layer, "ffn_up.weight", &ff_layer);
      up != nullptr && up->ne[1] != int64_t{up_rows_per_ff} * hp->n_ff) {
    return HparamError(f, ArchKey(a, "feed_forward_length"), hp->n_ff,
                       "blk." + std::to_string(ff_layer) + ".ffn_up.weight has " +
                           std::to_string(up->ne[1]) + " rows" +
                           (up_rows_per_ff == 1 ? "" : " (gate and up: 2 x it)"));
  }
  Result<double> eps = f.GetFloat(ArchKey(a, "attention.layer_norm_rms_epsilon"));
  if (!eps.ok())
    return Error{f.path() + ": missing or invalid required key " +
                 ArchKey(a, "attention.layer_norm_rms_epsilon")};
  hp->rms_eps = static_cast<float>(*eps);
  Result<double> base = f.GetFloatOr(ArchKey(a, "rope.freq_base"), 10000.0);
  if (!base.ok()) return base.error();
  Result<int64_t> n_rot = f.GetIntOr(ArchKey(a, "rope.dimension_count"), hp->head_dim);
  if (!n_rot.ok()) return n_rot.error();
  if (*n_rot <= 0 || *n_rot > hp->head_dim || *n_rot % 2 != 0) {
    return HparamError(
        f, ArchKey(a, "rope.dimension_count"), *n_rot,
        "it must be even and in [2, head dimension " + std::to_string(hp->head_dim) + "]");
  }
  hp->rope.n_rot = static_cast<int>(*n_rot);
  hp->rope.freq_base = static_cast<float>(*base);
  hp->rope.style = rope_style;
  Result<RopeScalingConfig> scaling = ReadRopeScaling(f, a, hp->n_ctx_train);
  if (!scaling.ok()) return scaling.error();
  hp->rope_scaling = *scaling;
  hp->rope = ResolveRope(hp->rope, hp->rope_scaling, RopeOverrides{});
  return Status::Ok();
}

}  // namespace

Result<Hparams> ReadLlamaLikeHparams(const gguf::File& f, RopeStyle rope_style,
                                     int q_rows_per_head_dim, int up_rows_per_ff) {
  Hparams hp;
  Result<std::string> arch = f.GetString("general.architecture");
  if (!arch.ok()) return Error{f.path() + ": missing general.architecture"};
  hp.arch = *arch;
  if (Status st = ReadCounts(f, &hp); !st.ok()) return st.error();
  if (Status st = ReadHeadShape(f, q_rows_per_head_dim, &hp); !st.ok()) return st.error();
  if (Status st = ReadNormAndRope(f, rope_style, up_rows_per_ff, &hp); !st.ok()) {
    return st.error();
  }
  return hp;
}

Result<RopeScalingConfig> ReadRopeScaling(const gguf::File& f, const std::string& a,
                                          int n_ctx_train) {
  RopeScalingConfig c;
  if (const gguf::Value* st = f.Find(ArchKey(a, "rope.scaling.type"))) {
    if (st->type != gguf::ValueType::kString) {
      return Error{f.path() + ": " + ArchKey(a, "rope.scaling.type") + " is not a string"};
    }
    if (st->str == "none") {
      c.type = RopeScalingType::kNone;
    } else if (st->str == "linear") {
      c.type = RopeScalingType::kLinear;
    } else if (st->str == "yarn") {
      c.type = RopeScalingType::kYarn;
    } else {
      return Error{f.path() + ": unsupported rope scaling type \"" + st->str + "\" (metadata key " +
                   Quoted(ArchKey(a, "rope.scaling.type")) + "; none, linear or yarn)"};
    }
  }
  // llama.cpp reads rope.scaling.factor, falling back to the older rope.scale_linear; 0 = 1.
  const std::string factor_key = f.Find(ArchKey(a, "rope.scaling.factor"))
                                     ? ArchKey(a, "rope.scaling.factor")
                                     : ArchKey(a, "rope.scale_linear");
  Result<double> factor = f.GetFloatOr(factor_key, 0.0);
  if (!factor.ok()) return factor.error();
  if (*factor < 0.0 || !std::isfinite(*factor)) {
    return Error{f.path() + ": invalid " + factor_key + " " + std::to_string(*factor)};
  }
  c.factor = *factor == 0.0 ? 1.0f : static_cast<float>(*factor);
  Result<int64_t> orig =
      f.GetIntOr(ArchKey(a, "rope.scaling.original_context_length"), n_ctx_train);
  if (!orig.ok()) return orig.error();
  if (*orig <= 0 || *orig > kMaxContextLength) {
    return HparamError(f, ArchKey(a, "rope.scaling.original_context_length"), *orig,
                       "it must be in [1, " + std::to_string(kMaxContextLength) + "]");
  }
  c.n_ctx_orig = static_cast<int>(*orig);
  struct FloatKey {
    const char* suffix;
    float* field;
  };
  for (const FloatKey& k : {FloatKey{"rope.scaling.attn_factor", &c.attn_factor},
                            FloatKey{"rope.scaling.yarn_ext_factor", &c.ext_factor},
                            FloatKey{"rope.scaling.yarn_beta_fast", &c.beta_fast},
                            FloatKey{"rope.scaling.yarn_beta_slow", &c.beta_slow}}) {
    Result<double> v = f.GetFloatOr(ArchKey(a, k.suffix), *k.field);
    if (!v.ok()) return v.error();
    *k.field = static_cast<float>(*v);
  }
  return c;
}

RopeParams ResolveRope(const RopeParams& base, const RopeScalingConfig& c, const RopeOverrides& o) {
  RopeParams p = base;
  const RopeScalingType type = o.type.value_or(c.type);
  const float factor = o.scale > 0.0f ? o.scale : c.factor;
  // As llama.cpp: scaling type "none" never scales, whatever the factor says.
  p.freq_scale = type == RopeScalingType::kNone ? 1.0f : 1.0f / factor;
  if (type == RopeScalingType::kYarn) {
    p.ext_factor = c.ext_factor >= 0.0f ? c.ext_factor : 1.0f;
  } else {
    p.ext_factor = 0.0f;
  }
  p.attn_factor = c.attn_factor;
  if (p.ext_factor != 0.0f && c.yarn_log_mul != 0.0f) {
    // As llama.cpp's context: mscale(s, 1) / mscale(s, log_mul), with the 1 + 0.1 ln s that
    // RoPE multiplies by under YaRN cancelled.
    const float s = 1.0f / p.freq_scale;
    auto mscale = [s](float m) { return s <= 1.0f ? 1.0f : 0.1f * m * std::log(s) + 1.0f; };
    float f = mscale(1.0f) / mscale(c.yarn_log_mul);
    f *= 1.0f / (1.0f + 0.1f * std::log(s));
    p.attn_factor = f * c.attn_factor;
  }
  p.beta_fast = c.beta_fast;
  p.beta_slow = c.beta_slow;
  p.n_ctx_orig = o.yarn_orig_ctx > 0 ? o.yarn_orig_ctx : c.n_ctx_orig;
  return p;
}

RopeParams SlidingWindowRope(const RopeParams& global, float freq_base_swa) {
  RopeParams p = global;
  p.freq_base = freq_base_swa;
  p.freq_scale = 1.0f;
  return p;
}

Status ReadSlidingWindow(const gguf::File& f, Hparams* hp, const SlidingWindowRules& rules) {
  const std::string& a = hp->arch;
  const std::string window_key = ArchKey(a, "attention.sliding_window");
  if (f.Find(window_key) == nullptr) {
    if (!rules.required) return Status::Ok();
    return Error{f.path() + ": missing required key " + window_key};
  }
  Result<int64_t> window = f.GetInt(window_key);
  if (!window.ok()) return window.error();
  if (*window < 0 || *window > kMaxContextLength) {
    return HparamError(
        f, window_key, *window,
        "a sliding window must be in [0, " + std::to_string(kMaxContextLength) + "] (0: none)");
  }
  if (*window == 0) return Status::Ok();  // as llama.cpp: no sliding window
  const std::string pattern_key = ArchKey(a, "attention.sliding_window_pattern");
  if (const gguf::Value* v = f.Find(pattern_key);
      v != nullptr && v->type == gguf::ValueType::kArray) {
    return Error{f.path() + ": metadata key " + Quoted(pattern_key) +
                 " is a per-layer array; lamina reads the period form (an integer) only"};
  }
  Result<int64_t> period = f.GetIntOr(pattern_key, rules.default_period);
  if (!period.ok()) return period.error();
  if (*period < 0 || *period > kMaxHparamInt) {
    return HparamError(f, pattern_key, *period,
                       "the period must be in [0, " + std::to_string(kMaxHparamInt) + "]");
  }
  const std::string base_key = ArchKey(a, "rope.freq_base_swa");
  Result<double> base = f.GetFloatOr(base_key, rules.global_rope ? hp->rope.freq_base : 10000.0);
  if (!base.ok()) return base.error();
  if (!(*base > 0.0) || !std::isfinite(*base)) {
    return Error{f.path() + ": metadata key " + Quoted(base_key) + " = " + std::to_string(*base) +
                 " is not a positive RoPE base"};
  }
  hp->n_swa = static_cast<int>(*window);
  hp->swa_layers.assign(hp->kv_layers(), 0);
  for (int il = 0; il < hp->kv_layers(); ++il) {
    hp->swa_layers[il] = *period == 0 || il % *period < *period - 1 ? 1 : 0;
  }
  hp->swa_global_rope = rules.global_rope;
  if (rules.global_rope) {
    hp->rope_swa = hp->rope;
    hp->rope_swa.freq_base = static_cast<float>(*base);
  } else {
    hp->rope_swa = SlidingWindowRope(hp->rope, static_cast<float>(*base));
  }
  return Status::Ok();
}

Status ReadRopeSections(const gguf::File& f, Hparams* hp) {
  const std::string key = ArchKey(hp->arch, "rope.dimension_sections");
  const gguf::Value* v = f.Find(key);
  if (v == nullptr) return Error{f.path() + ": missing required key " + key};
  int64_t sec[4] = {0, 0, 0, 0};
  bool ok = true;
  if (v->type == gguf::ValueType::kArray) {
    // As llama.cpp: exactly 4 entries (t, h, w, e); a scalar sets all four.
    ok = v->array.size() == 4;
    for (size_t i = 0; ok && i < 4; ++i) ok = v->array[i].AsInt64(&sec[i]);
  } else {
    ok = v->AsInt64(&sec[0]);
    sec[1] = sec[2] = sec[3] = sec[0];
  }
  if (!ok) {
    return Error{f.path() + ": metadata key " + Quoted(key) +
                 " is not an integer or an array of 4 integers"};
  }
  int64_t total = 0;
  for (int64_t x : sec) {
    if (x < 0 || x > kMaxHeadDim) {
      return HparamError(f, key, x,
                         "a section must be in [0, " + std::to_string(kMaxHeadDim) + "]");
    }
    total += x;
  }
  if (total > hp->head_dim || sec[0] + sec[1] + sec[2] == 0) {
    return HparamError(f, key, total,
                       "the sections' sum must be in [1, head dimension " +
                           std::to_string(hp->head_dim) + "] and t, h, w not all 0");
  }
  for (int i = 0; i < 4; ++i) hp->rope.sections[i] = static_cast<int>(sec[i]);
  return Status::Ok();
}

}  // namespace lamina
