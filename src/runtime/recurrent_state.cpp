// Recurrent (Gated DeltaNet) state with a ring of per-token snapshots (see recurrent_state.h).
#include "runtime/recurrent_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/delta_net.h"
#include "util/check.h"

namespace lamina {

RecurrentState::RecurrentState(const RecurrentShape& shape, int n_seq, int ring)
    : shape_(shape), n_seq_(n_seq), ring_(std::max(1, ring)) {
  if (empty()) return;
  LAMINA_CHECK(n_seq > 0 && shape.conv_kernel >= 1 && shape.n_k_heads > 0 &&
               shape.n_v_heads % shape.n_k_heads == 0);
  per_ = static_cast<size_t>(shape.conv_floats() + shape.state_floats());
  const size_t n_ls = static_cast<size_t>(n_seq) * shape.n_layer;
  live_.assign(n_ls * per_, 0.0f);
  snaps_.assign(n_ls * ring_ * per_, 0.0f);
  tags_.assign(n_ls * ring_, -1);
  lengths_.assign(n_ls, 0);
}

int RecurrentState::length(int seq) const {
  if (empty()) return 0;
  return lengths_[static_cast<size_t>(seq) * shape_.n_layer];
}

uint64_t RecurrentState::bytes() const {
  return static_cast<uint64_t>(live_.size() + snaps_.size()) * sizeof(float);
}

void RecurrentState::Scan(int layer, int seq, int pos0, int n, const float* conv_w,
                          const float* qkv, const float* decay, const float* beta, float* out,
                          ThreadPool& pool) {
  LAMINA_CHECK(!empty() && layer >= 0 && layer < shape_.n_layer && seq >= 0 && seq < n_seq_);
  int& len = lengths_[static_cast<size_t>(seq) * shape_.n_layer + layer];
  LAMINA_CHECK(pos0 == len && n > 0);
  const int C = shape_.conv_channels(), K = shape_.conv_kernel;
  const int hk = shape_.head_k, hv = shape_.head_v;
  const int n_kh = shape_.n_k_heads, n_vh = shape_.n_v_heads, r = n_vh / n_kh;
  const int64_t conv_floats = shape_.conv_floats();
  float* live = live_.data() + LiveOffset(seq, layer);
  float* tail = live;                 // [K - 1, C]
  float* state = live + conv_floats;  // [n_vh, hk, hv]

  // Tokens whose resulting state goes into the ring: the last min(n, ring) of the run.
  const int first_snap = std::max(0, n - ring_);
  if (conv_out_.size() < static_cast<size_t>(n) * C) conv_out_.resize(static_cast<size_t>(n) * C);
  float* co = conv_out_.data();  // [n, C]
  CausalConvSilu(tail, qkv, n, C, K, conv_w, co);
  for (int t = first_snap; t < n; ++t) {
    const int slot = (pos0 + t + 1) % ring_;
    ConvTailAdvance(tail, qkv, t + 1, C, K, snaps_.data() + SnapOffset(seq, layer, slot));
  }
  ConvTailAdvance(tail, qkv, n, C, K, tail);
  // q and k: L2-normalised per head, in place.
  for (int t = 0; t < n; ++t) {
    float* row = co + static_cast<int64_t>(t) * C;
    for (int h = 0; h < 2 * n_kh; ++h) L2Normalize(row + h * hk, hk, shape_.l2_eps);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hk));
  const GatedDeltaStepFn step = BestGatedDeltaStep();
  const int64_t head_floats = static_cast<int64_t>(hv) * hk;
  const int64_t vd = static_cast<int64_t>(n_vh) * hv;
  pool.ParallelFor(n_vh, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      float* m = state + h * head_floats;  // [hk, hv]
      const int64_t kh = h / r;
      for (int t = 0; t < n; ++t) {
        const float* row = co + static_cast<int64_t>(t) * C;
        const float* q = row + kh * hk;
        const float* k = row + (n_kh + kh) * hk;
        const float* v = row + 2 * n_kh * hk + h * hv;
        step(m, q, k, v, decay[static_cast<int64_t>(t) * n_vh + h],
             beta[static_cast<int64_t>(t) * n_vh + h], scale, hk, hv, out + t * vd + h * hv);
        if (t >= first_snap) {
          const int slot = (pos0 + t + 1) % ring_;
          std::memcpy(snaps_.data() + SnapOffset(seq, layer, slot) + conv_floats + h * head_floats,
                      m, sizeof(float) * head_floats);
        }
      }
    }
  });
  for (int t = first_snap; t < n; ++t) Tag(seq, layer, (pos0 + t + 1) % ring_) = pos0 + t + 1;
  len = pos0 + n;
}

int RecurrentState::ExactKeep(int seq, int n) const {
  if (empty()) return n;
  LAMINA_CHECK(seq >= 0 && seq < n_seq_);
  if (n <= 0) return 0;
  for (int layer = 0; layer < shape_.n_layer; ++layer) {
    const int len = lengths_[static_cast<size_t>(seq) * shape_.n_layer + layer];
    if (n == len) continue;
    if (n > len || TagAt(seq, layer, n % ring_) != n) return 0;
  }
  return n;
}

void RecurrentState::Truncate(int seq, int n_keep) {
  if (empty()) return;
  LAMINA_CHECK(ExactKeep(seq, n_keep) == n_keep);
  for (int layer = 0; layer < shape_.n_layer; ++layer) {
    int& len = lengths_[static_cast<size_t>(seq) * shape_.n_layer + layer];
    if (n_keep == len) continue;
    float* live = live_.data() + LiveOffset(seq, layer);
    if (!fault_skip_restore_) {
      if (n_keep == 0) {
        std::fill(live, live + per_, 0.0f);
      } else {
        const float* snap = snaps_.data() + SnapOffset(seq, layer, n_keep % ring_);
        std::copy(snap, snap + per_, live);
      }
    }
    for (int slot = 0; slot < ring_; ++slot) {
      if (Tag(seq, layer, slot) > n_keep) Tag(seq, layer, slot) = -1;
    }
    len = n_keep;
  }
}

void RecurrentState::CopyPrefix(int src, int dst, int n) {
  if (empty() || src == dst) return;
  LAMINA_CHECK(ExactKeep(src, n) == n && dst >= 0 && dst < n_seq_);
  for (int layer = 0; layer < shape_.n_layer; ++layer) {
    const int src_len = lengths_[static_cast<size_t>(src) * shape_.n_layer + layer];
    float* live = live_.data() + LiveOffset(dst, layer);
    if (n == 0) {
      std::fill(live, live + per_, 0.0f);
    } else {
      const float* from = n == src_len ? live_.data() + LiveOffset(src, layer)
                                       : snaps_.data() + SnapOffset(src, layer, n % ring_);
      std::copy(from, from + per_, live);
    }
    for (int slot = 0; slot < ring_; ++slot) {
      const int tag = TagAt(src, layer, slot);
      const bool keep = tag >= 1 && tag <= n;
      Tag(dst, layer, slot) = keep ? tag : -1;
      if (keep) {
        const float* s = snaps_.data() + SnapOffset(src, layer, slot);
        std::copy(s, s + per_, snaps_.data() + SnapOffset(dst, layer, slot));
      }
    }
    lengths_[static_cast<size_t>(dst) * shape_.n_layer + layer] = n;
  }
}

void RecurrentState::Skip(int seq, int n) {
  if (empty()) return;
  for (int layer = 0; layer < shape_.n_layer; ++layer) {
    lengths_[static_cast<size_t>(seq) * shape_.n_layer + layer] = n;
    for (int slot = 0; slot < ring_; ++slot) Tag(seq, layer, slot) = -1;
  }
}

}  // namespace lamina
