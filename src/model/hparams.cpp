// Hyper-parameters from GGUF metadata: the llama-like `<arch>.*` keys, RoPE scaling and its
// command-line overrides.
#include "model/hparams.h"

#include <cmath>

namespace lamina {

namespace {

Result<int64_t> RequiredInt(const gguf::File& f, const std::string& key) {
  Result<int64_t> r = f.GetInt(key);
  if (!r.ok())
    return Error{f.path() + ": missing or invalid required key " + key + ": " + r.error().message};
  if (*r <= 0 || *r > (1ll << 31))
    return Error{f.path() + ": key " + key + " out of range: " + std::to_string(*r)};
  return r;
}
}  // namespace

Result<Hparams> ReadLlamaLikeHparams(const gguf::File& f, RopeStyle rope_style) {
  Hparams hp;
  Result<std::string> arch = f.GetString("general.architecture");
  if (!arch.ok()) return Error{f.path() + ": missing general.architecture"};
  hp.arch = *arch;
  const std::string& a = hp.arch;
#define LAMINA_REQ_INT(field, suffix)                        \
  do {                                                       \
    Result<int64_t> r_ = RequiredInt(f, ArchKey(a, suffix)); \
    if (!r_.ok()) return r_.error();                         \
    hp.field = static_cast<int>(*r_);                        \
  } while (0)
  LAMINA_REQ_INT(n_embd, "embedding_length");
  LAMINA_REQ_INT(n_layer, "block_count");
  LAMINA_REQ_INT(n_head, "attention.head_count");
  LAMINA_REQ_INT(n_ff, "feed_forward_length");
  LAMINA_REQ_INT(n_ctx_train, "context_length");
#undef LAMINA_REQ_INT
  Result<int64_t> n_head_kv = f.GetIntOr(ArchKey(a, "attention.head_count_kv"), hp.n_head);
  if (!n_head_kv.ok()) return n_head_kv.error();
  hp.n_head_kv = static_cast<int>(*n_head_kv);
  if (hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv != 0) {
    return Error{f.path() + ": " + ArchKey(a, "attention.head_count_kv") + " = " +
                 std::to_string(hp.n_head_kv) + " does not divide head_count " +
                 std::to_string(hp.n_head)};
  }
  Result<int64_t> key_len = f.GetIntOr(ArchKey(a, "attention.key_length"), hp.n_embd / hp.n_head);
  if (!key_len.ok()) return key_len.error();
  hp.head_dim = static_cast<int>(*key_len);
  if (hp.head_dim <= 0 || hp.head_dim > 1024 || hp.head_dim % 2 != 0) {
    return Error{f.path() + ": invalid head dimension " + std::to_string(hp.head_dim)};
  }
  // K and V rows share one head_dim here; a model whose value_length differs is rejected
  // rather than misread.
  Result<int64_t> value_len = f.GetIntOr(ArchKey(a, "attention.value_length"), hp.head_dim);
  if (!value_len.ok()) return value_len.error();
  if (*value_len != hp.head_dim) {
    return Error{f.path() + ": " + ArchKey(a, "attention.value_length") + " = " +
                 std::to_string(*value_len) + " differs from key_length " +
                 std::to_string(hp.head_dim) + " (unsupported)"};
  }
  Result<double> eps = f.GetFloat(ArchKey(a, "attention.layer_norm_rms_epsilon"));
  if (!eps.ok())
    return Error{f.path() + ": missing or invalid required key " +
                 ArchKey(a, "attention.layer_norm_rms_epsilon")};
  hp.rms_eps = static_cast<float>(*eps);
  Result<double> base = f.GetFloatOr(ArchKey(a, "rope.freq_base"), 10000.0);
  if (!base.ok()) return base.error();
  Result<int64_t> n_rot = f.GetIntOr(ArchKey(a, "rope.dimension_count"), hp.head_dim);
  if (!n_rot.ok()) return n_rot.error();
  if (*n_rot <= 0 || *n_rot > hp.head_dim || *n_rot % 2 != 0) {
    return Error{f.path() + ": invalid " + ArchKey(a, "rope.dimension_count") + " " +
                 std::to_string(*n_rot)};
  }
  hp.rope.n_rot = static_cast<int>(*n_rot);
  hp.rope.freq_base = static_cast<float>(*base);
  hp.rope.style = rope_style;
  Result<RopeScalingConfig> scaling = ReadRopeScaling(f, a, hp.n_ctx_train);
  if (!scaling.ok()) return scaling.error();
  hp.rope_scaling = *scaling;
  hp.rope = ResolveRope(hp.rope, hp.rope_scaling, RopeOverrides{});
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
      return Error{f.path() + ": unsupported rope scaling type \"" + st->str + "\""};
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
  if (*orig <= 0 || *orig > (1ll << 31)) {
    return Error{f.path() + ": invalid " + ArchKey(a, "rope.scaling.original_context_length")};
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
  p.beta_fast = c.beta_fast;
  p.beta_slow = c.beta_slow;
  p.n_ctx_orig = o.yarn_orig_ctx > 0 ? o.yarn_orig_ctx : c.n_ctx_orig;
  return p;
}

}  // namespace lamina
