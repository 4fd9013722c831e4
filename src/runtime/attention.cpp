// Causal GQA attention over f32 / f16 cache rows.
#include "runtime/attention.h"

#include <algorithm>
#include <cmath>

#include "kernels/attention_kernels.h"
#include "kernels/ops.h"

namespace lamina {

void CausalAttention(const KvCache& cache, int layer, int seq, int pos0, int n_tokens,
                     const float* q, float* out, const AttentionShape& shape,
                     AttentionScratch& scratch, ThreadPool& pool) {
  const int hd = shape.head_dim;
  const int group = shape.n_head / shape.n_head_kv;
  const int n_ctx = cache.config().n_ctx;
  const size_t per_thread = static_cast<size_t>(n_ctx) + 2 * hd;
  if (scratch.per_thread.size() < per_thread * pool.size()) {
    scratch.per_thread.resize(per_thread * pool.size());
  }
  const AttentionRowKernels& kern = BestAttentionRowKernels();
  const bool f16 = cache.config().type == KvType::kF16;
  const int64_t n_items = static_cast<int64_t>(n_tokens) * shape.n_head;
  pool.ParallelFor(n_items, 1, [&](int64_t begin, int64_t end, int thread) {
    float* scores = scratch.per_thread.data() + per_thread * thread;
    float* qrow = scores + n_ctx;  // [head_dim] query as the dot product sees it
    for (int64_t item = begin; item < end; ++item) {
      const int t = static_cast<int>(item / shape.n_head);
      const int h = static_cast<int>(item % shape.n_head);
      const int kvh = h / group;
      const int n_kv = pos0 + t + 1;
      const float* qsrc = q + static_cast<int64_t>(t) * shape.n_head * hd + h * hd;
      float* o = out + static_cast<int64_t>(t) * shape.n_head * hd + h * hd;
      for (int i = 0; i < hd; ++i) qrow[i] = f16 ? Fp16ToF32(F32ToFp16(qsrc[i])) : qsrc[i];
      for (int j = 0; j < n_kv; ++j) {
        const uint8_t* krow = cache.KRow(layer, seq, j);
        const float dot = f16 ? kern.dot_f16(reinterpret_cast<const fp16_t*>(krow) + kvh * hd, qrow, hd)
                              : kern.dot_f32(reinterpret_cast<const float*>(krow) + kvh * hd, qrow, hd);
        scores[j] = dot * shape.scale;
      }
      Softmax(scores, n_kv);
      std::fill(o, o + hd, 0.0f);
      for (int j = 0; j < n_kv; ++j) {
        const uint8_t* vrow = cache.VRow(layer, seq, j);
        if (f16) {
          const float p = Fp16ToF32(F32ToFp16(scores[j]));
          kern.axpy_f16(p, reinterpret_cast<const fp16_t*>(vrow) + kvh * hd, o, hd);
        } else {
          kern.axpy_f32(scores[j], reinterpret_cast<const float*>(vrow) + kvh * hd, o, hd);
        }
      }
    }
  });
}

}  // namespace lamina
