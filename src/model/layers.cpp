// Shared transformer building blocks.
#include "model/layers.h"

#include <algorithm>
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

const gguf::TensorInfo* WeightLoader::Find(const std::string& name, bool required) {
  const gguf::TensorInfo* t = file_.FindTensor(name);
  if (t == nullptr && required) Fail(file_.path() + ": missing tensor " + name);
  return t;
}

void WeightLoader::Fail(const std::string& message) {
  if (status_.ok()) status_ = Error{message};
}

WeightMatrix WeightLoader::Matrix(const std::string& name, int64_t cols, int64_t rows,
                                  bool required) {
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
    Fail(file_.path() + ": tensor " + name + " has unsupported type " + GgmlTypeName(t->type));
    return w;
  }
  w.type = t->type;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = RowSize(t->type, cols);
  w.data = t->data;
  n_params_ += static_cast<uint64_t>(rows * cols);
  n_bytes_ += t->n_bytes;
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
    Fail(file_.path() + ": tensor " + name + " has unsupported type " + GgmlTypeName(t->type));
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
  const TypeKernels& k = GetKernels(t->type);
  if (k.dequantize == nullptr) {
    Fail(file_.path() + ": tensor " + name + " has unsupported type " + GgmlTypeName(t->type));
    return out;
  }
  out.resize(n);
  k.dequantize(t->data, out.data(), n);
  n_params_ += static_cast<uint64_t>(n);
  n_bytes_ += t->n_bytes;
  return out;
}

void LoadAttentionWeights(WeightLoader& L, const Hparams& hp, int layer, bool with_bias,
                          bool with_qk_norm, AttentionWeights* w) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  w->norm = L.Vector(p + "attn_norm.weight", hp.n_embd);
  w->wq = L.Matrix(p + "attn_q.weight", hp.n_embd, hp.q_dim());
  w->wk = L.Matrix(p + "attn_k.weight", hp.n_embd, hp.kv_dim());
  w->wv = L.Matrix(p + "attn_v.weight", hp.n_embd, hp.kv_dim());
  w->wo = L.Matrix(p + "attn_output.weight", hp.q_dim(), hp.n_embd);
  if (with_bias) {
    w->bq = L.Vector(p + "attn_q.bias", hp.q_dim(), false);
    w->bk = L.Vector(p + "attn_k.bias", hp.kv_dim(), false);
    w->bv = L.Vector(p + "attn_v.bias", hp.kv_dim(), false);
  }
  if (with_qk_norm) {
    w->q_norm = L.Vector(p + "attn_q_norm.weight", hp.head_dim);
    w->k_norm = L.Vector(p + "attn_k_norm.weight", hp.head_dim);
  }
}

void LoadFfnWeights(WeightLoader& L, const Hparams& hp, int layer, FfnWeights* w) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  w->norm = L.Vector(p + "ffn_norm.weight", hp.n_embd);
  w->gate = L.Matrix(p + "ffn_gate.weight", hp.n_embd, hp.n_ff);
  w->up = L.Matrix(p + "ffn_up.weight", hp.n_embd, hp.n_ff);
  w->down = L.Matrix(p + "ffn_down.weight", hp.n_ff, hp.n_embd);
}

void PrepareScratch(const Hparams& hp, int n, ForwardScratch& s) {
  auto grow = [](std::vector<float>& v, size_t size) {
    if (v.size() < size) v.resize(size);
  };
  const size_t nt = static_cast<size_t>(n);
  grow(s.x, nt * hp.n_embd);
  grow(s.xn, nt * hp.n_embd);
  grow(s.q, nt * hp.q_dim());
  grow(s.k, nt * hp.kv_dim());
  grow(s.v, nt * hp.kv_dim());
  grow(s.attn, nt * hp.q_dim());
  grow(s.gate, nt * hp.n_ff);
  grow(s.up, nt * hp.n_ff);
  grow(s.rope, nt * hp.rope.n_rot);
}

int ForwardBatch::n_outputs() const {
  if (output == nullptr) return n_tokens > 0 ? 1 : 0;
  int n = 0;
  for (int t = 0; t < n_tokens; ++t) n += output[t] != 0;
  return n;
}

void EmbedTokens(const WeightMatrix& embd, const ForwardBatch& b, float* x) {
  for (int t = 0; t < b.n_tokens; ++t) {
    const int32_t id = b.tokens[t];
    LAMINA_CHECK(id >= 0 && id < embd.rows);
    DequantizeRow(embd, id, x + static_cast<int64_t>(t) * embd.cols);
  }
}

namespace {
void AddBias(float* x, const std::vector<float>& bias, int n_tokens, int64_t dim) {
  if (bias.empty()) return;
  for (int t = 0; t < n_tokens; ++t) AddInPlace(x + t * dim, bias.data(), dim);
}
}  // namespace

void AttentionBlock(const Hparams& hp, const AttentionWeights& w, int layer, const ForwardBatch& b,
                    AttentionContext& attention, ForwardScratch& s, ThreadPool& pool) {
  const int n = b.n_tokens;
  const int64_t d = hp.n_embd, qd = hp.q_dim(), kvd = hp.kv_dim();
  for (int t = 0; t < n; ++t)
    RmsNorm(s.x.data() + t * d, w.norm.data(), d, hp.rms_eps, s.xn.data() + t * d);
  MatMul(w.wq, s.xn.data(), d, n, s.q.data(), qd, s.matmul, pool);
  MatMul(w.wk, s.xn.data(), d, n, s.k.data(), kvd, s.matmul, pool);
  MatMul(w.wv, s.xn.data(), d, n, s.v.data(), kvd, s.matmul, pool);
  AddBias(s.q.data(), w.bq, n, qd);
  AddBias(s.k.data(), w.bk, n, kvd);
  AddBias(s.v.data(), w.bv, n, kvd);
  pool.ParallelFor(n, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* q = s.q.data() + t * qd;
      float* k = s.k.data() + t * kvd;
      if (!w.q_norm.empty()) {
        for (int h = 0; h < hp.n_head; ++h)
          RmsNorm(q + h * hp.head_dim, w.q_norm.data(), hp.head_dim, hp.rms_eps,
                  q + h * hp.head_dim);
        for (int h = 0; h < hp.n_head_kv; ++h)
          RmsNorm(k + h * hp.head_dim, w.k_norm.data(), hp.head_dim, hp.rms_eps,
                  k + h * hp.head_dim);
      }
      float* cs = s.rope.data() + t * hp.rope.n_rot;
      RopeCache(hp.rope, b.pos[t], cs);
      ApplyRope(hp.rope, cs, q, hp.n_head, hp.head_dim);
      ApplyRope(hp.rope, cs, k, hp.n_head_kv, hp.head_dim);
    }
  });
  attention.Attend(layer, s.q.data(), s.k.data(), s.v.data(), s.attn.data());
  // The output projection accumulates into the residual via a temporary (xn is free now).
  MatMul(w.wo, s.attn.data(), qd, n, s.xn.data(), d, s.matmul, pool);
  AddInPlace(s.x.data(), s.xn.data(), static_cast<int64_t>(n) * d);
}

void FfnBlock(const Hparams& hp, const FfnWeights& w, const ForwardBatch& b, ForwardScratch& s,
              ThreadPool& pool) {
  const int n = b.n_tokens;
  const int64_t d = hp.n_embd, ff = hp.n_ff;
  for (int t = 0; t < n; ++t)
    RmsNorm(s.x.data() + t * d, w.norm.data(), d, hp.rms_eps, s.xn.data() + t * d);
  MatMul(w.gate, s.xn.data(), d, n, s.gate.data(), ff, s.matmul, pool);
  MatMul(w.up, s.xn.data(), d, n, s.up.data(), ff, s.matmul, pool);
  SiluMul(s.gate.data(), s.up.data(), static_cast<int64_t>(n) * ff, s.gate.data());
  MatMul(w.down, s.gate.data(), ff, n, s.xn.data(), d, s.matmul, pool);
  AddInPlace(s.x.data(), s.xn.data(), static_cast<int64_t>(n) * d);
}

void OutputHead(const Hparams& hp, const std::vector<float>& norm, const WeightMatrix& output,
                const ForwardBatch& b, ForwardScratch& s, ThreadPool& pool, float* logits) {
  const int64_t d = hp.n_embd;
  int count = 0;
  for (int t = 0; t < b.n_tokens; ++t) {
    if (!b.wants_output(t)) continue;
    RmsNorm(s.x.data() + t * d, norm.data(), d, hp.rms_eps, s.xn.data() + count * d);
    ++count;
  }
  if (count > 0) MatMul(output, s.xn.data(), d, count, logits, hp.n_vocab, s.matmul, pool);
}

Status DecoderModel::InitHparams(std::unique_ptr<gguf::File> file,
                                 std::unique_ptr<Tokenizer> tokenizer, RopeStyle rope_style) {
  file_ = std::move(file);
  tokenizer_ = std::move(tokenizer);
  Result<Hparams> hp = ReadLlamaLikeHparams(*file_, rope_style);
  if (!hp.ok()) return hp.error();
  hparams_ = *hp;
  const gguf::TensorInfo* embd = file_->FindTensor("token_embd.weight");
  if (embd == nullptr) return Error{file_->path() + ": missing tensor token_embd.weight"};
  hparams_.n_vocab = static_cast<int>(embd->ne[1]);
  if (hparams_.n_vocab != tokenizer_->vocab_size()) {
    return Error{file_->path() + ": token_embd.weight has " + std::to_string(hparams_.n_vocab) +
                 " rows but the tokenizer has " + std::to_string(tokenizer_->vocab_size()) +
                 " tokens"};
  }
  return Status::Ok();
}

void DecoderModel::LoadEmbeddingAndHead(WeightLoader& L) {
  const uint64_t before = L.n_bytes();
  token_embd_ = L.Matrix("token_embd.weight", hparams_.n_embd, hparams_.n_vocab);
  embd_bytes_ = L.n_bytes() - before;
  output_norm_ = L.Vector("output_norm.weight", hparams_.n_embd);
  output_ = L.Matrix("output.weight", hparams_.n_embd, hparams_.n_vocab, /*required=*/false);
  tied_ = !output_.valid();
  if (tied_) output_ = token_embd_;
}

Status DecoderModel::Finish(const WeightLoader& L, uint64_t unread_bytes) {
  if (!L.status().ok()) return L.status();
  n_params_ = L.n_params();
  weight_bytes_per_token_ = L.n_bytes() - embd_bytes_ + (tied_ ? embd_bytes_ : 0) - unread_bytes;
  return Status::Ok();
}

}  // namespace lamina
