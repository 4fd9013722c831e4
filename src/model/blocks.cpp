// The transformer blocks shared by the architectures: attention and FFN weights, scratch,
// embedding lookup, pre-norm attention and SwiGLU blocks, the output head.
#include "model/blocks.h"

#include <algorithm>
#include <functional>

namespace lamina {

namespace {

// The fused attn_qkv weight, when the file has it, and its optional bias (split into bq, bk,
// bv).
void LoadFusedQkv(WeightLoader& L, const Hparams& hp, const std::string& p, AttentionWeights* w) {
  const int64_t qd = hp.q_dim(), kvd = hp.kv_dim();
  w->wqkv = L.Matrix(p + "attn_qkv.weight", hp.n_embd, qd + 2 * kvd, /*required=*/false);
  if (!w->wqkv.valid()) return;
  const std::vector<float> b = L.Vector(p + "attn_qkv.bias", qd + 2 * kvd, false);
  if (b.empty()) return;
  w->bq.assign(b.begin(), b.begin() + qd);
  w->bk.assign(b.begin() + qd, b.begin() + qd + kvd);
  w->bv.assign(b.begin() + qd + kvd, b.end());
}

}  // namespace

void LoadAttentionWeights(WeightLoader& L, const Hparams& hp, int layer, const LayerBiases& biases,
                          bool with_qk_norm, AttentionWeights* w, bool with_fused_qkv) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  w->norm = L.Vector(p + "attn_norm.weight", hp.n_embd);
  if (biases.norm) w->norm_b = L.Vector(p + "attn_norm.bias", hp.n_embd, biases.required);
  if (with_fused_qkv) LoadFusedQkv(L, hp, p, w);
  if (!w->wqkv.valid()) {
    w->wq = L.Matrix(p + "attn_q.weight", hp.n_embd, hp.q_dim());
    w->wk = L.Matrix(p + "attn_k.weight", hp.n_embd, hp.kv_dim());
    w->wv = L.Matrix(p + "attn_v.weight", hp.n_embd, hp.kv_dim());
  }
  w->wo = L.Matrix(p + "attn_output.weight", hp.q_dim(), hp.n_embd);
  if (biases.out) w->bo = L.Vector(p + "attn_output.bias", hp.n_embd, biases.required);
  if (biases.qkv && !w->wqkv.valid()) {
    w->bq = L.Vector(p + "attn_q.bias", hp.q_dim(), false);
    w->bk = L.Vector(p + "attn_k.bias", hp.kv_dim(), false);
    w->bv = L.Vector(p + "attn_v.bias", hp.kv_dim(), false);
  }
  if (with_qk_norm) {
    w->q_norm = L.Vector(p + "attn_q_norm.weight", hp.head_dim);
    w->k_norm = L.Vector(p + "attn_k_norm.weight", hp.head_dim);
  }
}

void LoadAttentionWeights(WeightLoader& L, const Hparams& hp, int layer, bool with_bias,
                          bool with_qk_norm, AttentionWeights* w, bool with_fused_qkv) {
  LayerBiases biases;
  biases.qkv = with_bias;
  LoadAttentionWeights(L, hp, layer, biases, with_qk_norm, w, with_fused_qkv);
}

void LoadFfnWeights(WeightLoader& L, const Hparams& hp, int layer, FfnWeights* w,
                    const char* norm_name, bool fused_up, bool with_bias) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  w->norm = L.Vector(p + norm_name + ".weight", hp.n_embd);
  if (!fused_up) w->gate = L.Matrix(p + "ffn_gate.weight", hp.n_embd, hp.n_ff);
  w->up = L.Matrix(p + "ffn_up.weight", hp.n_embd, fused_up ? 2 * hp.n_ff : hp.n_ff);
  w->down = L.Matrix(p + "ffn_down.weight", hp.n_ff, hp.n_embd);
  if (with_bias && !fused_up) {
    w->gate_b = L.Vector(p + "ffn_gate.bias", hp.n_ff, /*required=*/false);
    w->up_b = L.Vector(p + "ffn_up.bias", hp.n_ff, false);
    w->down_b = L.Vector(p + "ffn_down.bias", hp.n_embd, false);
  }
}

void NormBatch(const Hparams& hp, const std::vector<float>& weight, const std::vector<float>& bias,
               int n, const float* x, float* out, ThreadPool* pool) {
  const int64_t d = hp.n_embd;
  auto rows = [&](int64_t t0, int64_t t1) {
    RmsNormRows(x + t0 * d, d, weight.data(), d, hp.rms_eps, t1 - t0, out + t0 * d, d);
    if (!bias.empty()) {
      for (int64_t t = t0; t < t1; ++t) AddInPlace(out + t * d, bias.data(), d);
    }
  };
  // A prompt batch's rows over the pool; a few rows (decode) are not worth a fork and join.
  constexpr int kRowsPerTask = 16;
  if (pool != nullptr && pool->size() > 1 && n >= 2 * kRowsPerTask) {
    pool->ParallelFor(n, kRowsPerTask, rows);
  } else {
    rows(0, n);
  }
}

void PrefetchNext(ThreadPool& pool, const NextWeights& next) {
  PrefetchRange r[2];
  int n = 0;
  for (const WeightMatrix* w : {next.a, next.b}) {
    if (w != nullptr && w->valid()) {
      r[n++] = {w->data, static_cast<size_t>(w->rows) * w->row_bytes};
    }
  }
  pool.PrefetchWhileIdle(r, n);
}

NextWeights FirstWeights(const AttentionWeights& w) {
  return w.wqkv.valid() ? NextWeights{&w.wqkv} : NextWeights{&w.wq, &w.wk};
}

NextWeights FirstWeights(const FfnWeights& w) {
  return w.gate.valid() ? NextWeights{&w.gate, &w.up} : NextWeights{&w.up};
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

// s.q, s.k, s.v from one matmul of the fused attn_qkv over s.xn (its rows: Q, then K, then V).
void SplitQkv(const Hparams& hp, const WeightMatrix& wqkv, int n, ForwardScratch& s,
              ThreadPool& pool) {
  const int64_t d = hp.n_embd, qd = hp.q_dim(), kvd = hp.kv_dim(), all = qd + 2 * kvd;
  GrowTo(s.fused, static_cast<size_t>(n) * all);
  MatMul(wqkv, s.xn.data(), d, n, s.fused.data(), all, s.matmul, pool);
  for (int64_t t = 0; t < n; ++t) {
    const float* row = s.fused.data() + t * all;
    std::copy(row, row + qd, s.q.data() + t * qd);
    std::copy(row + qd, row + qd + kvd, s.k.data() + t * kvd);
    std::copy(row + qd + kvd, row + all, s.v.data() + t * kvd);
  }
}

// Whether two RoPE parameter sets compute the same tables (field by field; freq_factors by
// address, as their owner never changes them).
bool SameRope(const RopeParams& a, const RopeParams& b) {
  return a.n_rot == b.n_rot && a.freq_base == b.freq_base && a.freq_scale == b.freq_scale &&
         a.ext_factor == b.ext_factor && a.attn_factor == b.attn_factor &&
         a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow && a.n_ctx_orig == b.n_ctx_orig &&
         a.style == b.style && std::equal(a.sections, a.sections + 4, b.sections) &&
         a.freq_factors == b.freq_factors;
}

// The RoPE tables of the batch's positions for `rope` ([n_tokens, n_rot]): the previous
// layer's when it had the same parameters and positions (a decode step computes them once,
// not once per layer), else computed now.
const float* RopeTablesFor(const RopeParams& rope, const ForwardBatch& b, ForwardScratch& s,
                           ThreadPool& pool) {
  ForwardScratch::RopeTables& rt = s.rope_tables;
  const size_t n = static_cast<size_t>(b.n_tokens);
  if (rt.valid && rt.pos.size() == n && SameRope(rt.params, rope) &&
      std::equal(b.pos, b.pos + n, rt.pos.begin())) {
    return rt.cos_sin.data();
  }
  rt.valid = false;
  rt.cos_sin.resize(n * rope.n_rot);
  rt.pos.assign(b.pos, b.pos + n);
  float* cos_sin = rt.cos_sin.data();
  pool.ParallelFor(b.n_tokens, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) RopeCache(rope, b.pos[t], cos_sin + t * rope.n_rot);
  });
  rt.params = rope;
  rt.valid = true;
  return rt.cos_sin.data();
}

// s.gate = act(gate) * up per token from one matmul of a fused ffn_up ([gate | up] per row).
void FusedGateUp(const Hparams& hp, const WeightMatrix& up, FfnActivation act, int n,
                 ForwardScratch& s, ThreadPool& pool) {
  const int64_t d = hp.n_embd, ff = hp.n_ff;
  GrowTo(s.fused, static_cast<size_t>(n) * 2 * ff);
  MatMul(up, s.xn.data(), d, n, s.fused.data(), 2 * ff, s.matmul, pool);
  for (int64_t t = 0; t < n; ++t) {
    const float* row = s.fused.data() + t * 2 * ff;
    float* out = s.gate.data() + t * ff;
    if (act == FfnActivation::kGeluTanh) {
      GeluTanhMul(row, row + ff, ff, out);
    } else {
      SiluMul(row, row + ff, ff, out);
    }
  }
}
}  // namespace

void AttentionOutput(const Hparams& hp, const AttentionWeights& w, int layer, const ForwardBatch& b,
                     AttentionContext& attention, ForwardScratch& s, ThreadPool& pool,
                     const NextWeights& next) {
  const RopeParams& rope = hp.layer_rope(layer, b.long_rope);
  const int n = b.n_tokens;
  const int64_t d = hp.n_embd, qd = hp.q_dim(), kvd = hp.kv_dim();
  NormBatch(hp, w.norm, w.norm_b, n, s.x.data(), s.xn.data(), &pool);
  PrefetchNext(pool, {&w.wo});  // during Q/K/V, the attention and the serial work after it
  if (w.wqkv.valid()) {
    SplitQkv(hp, w.wqkv, n, s, pool);
  } else {
    // One parallel region for the three (a short window pays each region's fork and join).
    const MatMulPart qkv[] = {
        {&w.wq, s.q.data(), qd}, {&w.wk, s.k.data(), kvd}, {&w.wv, s.v.data(), kvd}};
    MatMulMany(qkv, 3, s.xn.data(), d, n, s.matmul, pool);
  }
  AddBias(s.q.data(), w.bq, n, qd);
  AddBias(s.k.data(), w.bk, n, kvd);
  AddBias(s.v.data(), w.bv, n, kvd);
  const float* rope_tables = RopeTablesFor(rope, b, s, pool);  // [n_tokens, n_rot]
  pool.ParallelFor(n, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* q = s.q.data() + t * qd;
      float* k = s.k.data() + t * kvd;
      if (!w.q_norm.empty()) {  // each head's row in place
        RmsNormRows(q, hp.head_dim, w.q_norm.data(), hp.head_dim, hp.rms_eps, hp.n_head, q,
                    hp.head_dim);
        RmsNormRows(k, hp.head_dim, w.k_norm.data(), hp.head_dim, hp.rms_eps, hp.n_head_kv, k,
                    hp.head_dim);
      }
      const float* cs = rope_tables + t * rope.n_rot;
      ApplyRope(rope, cs, q, hp.n_head, hp.head_dim);
      ApplyRope(rope, cs, k, hp.n_head_kv, hp.head_dim);
      if (hp.attn_temp_scale != 0.0f) {
        const float temp = hp.attention_temperature(b.pos[t]);
        for (int64_t i = 0; i < qd; ++i) q[i] *= temp;
      }
    }
  });
  attention.Attend(layer, s.q.data(), s.k.data(), s.v.data(), s.attn.data());
  // The output projection goes to a temporary (xn is free now).
  PrefetchNext(pool, next);
  MatMul(w.wo, s.attn.data(), qd, n, s.xn.data(), d, s.matmul, pool);
  AddBias(s.xn.data(), w.bo, n, d);
}

void AttentionBlock(const Hparams& hp, const AttentionWeights& w, int layer, const ForwardBatch& b,
                    AttentionContext& attention, ForwardScratch& s, ThreadPool& pool,
                    const NextWeights& next) {
  AttentionOutput(hp, w, layer, b, attention, s, pool, next);
  AddInPlace(s.x.data(), s.xn.data(), static_cast<int64_t>(b.n_tokens) * hp.n_embd);
}

void FfnOutput(const Hparams& hp, const FfnWeights& w, FfnActivation act, const ForwardBatch& b,
               ForwardScratch& s, ThreadPool& pool, const NextWeights& next) {
  const int n = b.n_tokens;
  const int64_t d = hp.n_embd, ff = hp.n_ff;
  NormBatch(hp, w.norm, {}, n, s.x.data(), s.xn.data(), &pool);
  PrefetchNext(pool, {&w.down});
  const bool ffn_bias = !w.gate_b.empty() || !w.up_b.empty();
  if (!w.gate.valid()) {
    FusedGateUp(hp, w.up, act, n, s, pool);
  } else {
    // Gate and up in one parallel region, each thread applying the activation to the rows it
    // computed (elementwise: the same bits however the rows are split).
    const MatMulPart gate_up[] = {{&w.gate, s.gate.data(), ff}, {&w.up, s.up.data(), ff}};
    const std::function<void(int64_t, int64_t)> activate = [&](int64_t r0, int64_t r1) {
      for (int64_t t = 0; t < n; ++t) {
        float* g = s.gate.data() + t * ff + r0;
        float* u = s.up.data() + t * ff + r0;
        if (ffn_bias) {  // the biases of rows r0..r1, before the activation (llama.cpp's order)
          if (!w.gate_b.empty()) AddInPlace(g, w.gate_b.data() + r0, r1 - r0);
          if (!w.up_b.empty()) AddInPlace(u, w.up_b.data() + r0, r1 - r0);
        }
        if (act == FfnActivation::kGeluTanh) {
          GeluTanhMul(g, u, r1 - r0, g);
        } else {
          SiluMul(g, u, r1 - r0, g);
        }
      }
    };
    MatMulMany(gate_up, 2, s.xn.data(), d, n, s.matmul, pool, &activate);
  }
  PrefetchNext(pool, next);
  MatMul(w.down, s.gate.data(), ff, n, s.xn.data(), d, s.matmul, pool);
  AddBias(s.xn.data(), w.down_b, n, d);
}

void FfnBlock(const Hparams& hp, const FfnWeights& w, const ForwardBatch& b, ForwardScratch& s,
              ThreadPool& pool, const NextWeights& next) {
  FfnOutput(hp, w, FfnActivation::kSilu, b, s, pool, next);
  AddInPlace(s.x.data(), s.xn.data(), static_cast<int64_t>(b.n_tokens) * hp.n_embd);
}

void NormRows(const Hparams& hp, const std::vector<float>& norm, const ForwardBatch& b,
              const float* x, float* hidden) {
  const int64_t d = hp.n_embd;
  RmsNormRows(x, d, norm.data(), d, hp.rms_eps, b.n_tokens, hidden, d);
}

void OutputHead(const Hparams& hp, const std::vector<float>& norm, const WeightMatrix& output,
                const ForwardBatch& b, ForwardScratch& s, ThreadPool& pool, float* logits,
                const std::vector<float>* norm_b, const std::vector<float>* output_b) {
  const int64_t d = hp.n_embd;
  int count = 0;
  for (int t = 0; t < b.n_tokens; ++t) count += b.wants_output(t) ? 1 : 0;
  if (count == b.n_tokens) {  // every row (a batch of sequences' last tokens, a verify window)
    RmsNormRows(s.x.data(), d, norm.data(), d, hp.rms_eps, count, s.xn.data(), d);
  } else {
    for (int t = 0, c = 0; t < b.n_tokens; ++t) {
      if (b.wants_output(t))
        RmsNorm(s.x.data() + t * d, norm.data(), d, hp.rms_eps, s.xn.data() + c++ * d);
    }
  }
  if (norm_b != nullptr && !norm_b->empty()) {
    for (int c = 0; c < count; ++c) AddInPlace(s.xn.data() + c * d, norm_b->data(), d);
  }
  if (count == 0) return;
  MatMul(output, s.xn.data(), d, count, logits, hp.n_vocab, s.matmul, pool);
  if (output_b != nullptr) AddBias(logits, *output_b, count, hp.n_vocab);
}

}  // namespace lamina
