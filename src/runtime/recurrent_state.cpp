// Recurrent (Gated DeltaNet) state in a ring of per-token states (see recurrent_state.h).
#include "runtime/recurrent_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/delta_net.h"
#include "util/check.h"

namespace lamina {

RecurrentState::RecurrentState(const RecurrentShape& shape, int n_seq, int ring,
                               const WriteObserver* observer)
    : shape_(shape), n_seq_(n_seq), ring_(std::max(1, ring)), observer_(observer) {
  if (empty()) return;
  LAMINA_CHECK(n_seq > 0 && shape.conv_kernel >= 1 && shape.n_k_heads > 0 &&
               shape.n_v_heads % shape.n_k_heads == 0);
  per_ = static_cast<size_t>(shape.conv_floats() + shape.state_floats());
  const size_t n_ls = static_cast<size_t>(n_seq) * shape.n_layer;
  states_.assign(n_ls * ring_ * per_, 0.0f);
  tags_.assign(n_ls * ring_, -1);
  lengths_.assign(n_ls, 0);
  for (int seq = 0; seq < n_seq; ++seq) Reset(seq);
}

void RecurrentState::Reset(int seq) {
  for (int layer = 0; layer < shape_.n_layer; ++layer) {
    std::fill_n(Slot(seq, layer, 0), per_, 0.0f);
    std::fill_n(tags_.begin() + Index(seq, layer) * ring_, ring_, -1);
    Tag(seq, layer, 0) = 0;
    lengths_[Index(seq, layer)] = 0;
  }
}

int RecurrentState::length(int seq) const {
  if (empty()) return 0;
  return lengths_[Index(seq, 0)];
}

uint64_t RecurrentState::bytes() const {
  return static_cast<uint64_t>(states_.size()) * sizeof(float);
}

uint64_t RecurrentState::PlanBytes(const RecurrentShape& shape, int n_seq, int ring) {
  if (shape.n_layer == 0) return 0;
  const uint64_t per = static_cast<uint64_t>(shape.conv_floats() + shape.state_floats());
  return static_cast<uint64_t>(std::max(0, n_seq)) * shape.n_layer * std::max(1, ring) * per *
         sizeof(float);
}

void RecurrentState::Scan(int layer, int seq, int pos0, int n, const float* conv_w,
                          const float* qkv, const float* decay, const float* beta, float* out,
                          ThreadPool& pool) {
  LAMINA_CHECK(!empty() && layer >= 0 && layer < shape_.n_layer && seq >= 0 && seq < n_seq_);
  int& len = lengths_[Index(seq, layer)];
  LAMINA_CHECK(pos0 == len && n > 0 && TagOf(seq, layer, pos0) == pos0);
  const int C = shape_.conv_channels(), K = shape_.conv_kernel;
  const int hk = shape_.head_k, hv = shape_.head_v;
  const int n_kh = shape_.n_k_heads, n_vh = shape_.n_v_heads, r = n_vh / n_kh;
  const int64_t conv_floats = shape_.conv_floats();

  // The conv tail before the run (its slot may be overwritten below when n >= ring).
  tail_in_.assign(Slot(seq, layer, pos0), Slot(seq, layer, pos0) + conv_floats);
  if (conv_out_.size() < static_cast<size_t>(n) * C) conv_out_.resize(static_cast<size_t>(n) * C);
  float* co = conv_out_.data();  // [n, C]
  CausalConvSilu(tail_in_.data(), qkv, n, C, K, conv_w, co);
  // Tokens whose state stays in the ring: the last min(n, ring) of the run; earlier ones'
  // slots are taken again by later tokens, so their conv tails are not written.
  const int first_kept = std::max(0, n - ring_);
  for (int t = first_kept; t < n; ++t) {
    ConvTailAdvance(tail_in_.data(), qkv, t + 1, C, K, Slot(seq, layer, pos0 + t + 1));
  }
  // q and k: L2-normalised per head, in place.
  for (int t = 0; t < n; ++t) {
    float* row = co + static_cast<int64_t>(t) * C;
    for (int h = 0; h < 2 * n_kh; ++h) L2Normalize(row + h * hk, hk, shape_.l2_eps);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hk));
  const GatedDeltaStepFn step = BestGatedDeltaStep();
  const int64_t head_floats = static_cast<int64_t>(hk) * hv;
  const int64_t vd = static_cast<int64_t>(n_vh) * hv;
  float* base = states_.data() + Index(seq, layer) * ring_ * per_;  // [ring, per_]
  pool.ParallelFor(n_vh, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = shape_.v_tiled ? h % n_kh : h / r;
      for (int t = 0; t < n; ++t) {
        // The state after pos0 + t tokens, into the slot of the state after pos0 + t + 1.
        const float* src = base + ((pos0 + t) % ring_) * per_ + conv_floats + h * head_floats;
        float* dst = base + ((pos0 + t + 1) % ring_) * per_ + conv_floats + h * head_floats;
        const float* row = co + static_cast<int64_t>(t) * C;
        const float* q = row + kh * hk;
        const float* k = row + (n_kh + kh) * hk;
        const float* v = row + 2 * n_kh * hk + h * hv;
        step(src, dst, q, k, v, decay[static_cast<int64_t>(t) * n_vh + h],
             beta[static_cast<int64_t>(t) * n_vh + h], scale, hk, hv, out + t * vd + h * hv);
      }
    }
  });
  // Slots of the run's earlier tokens were taken again; with n < ring, pos0's stays valid.
  for (int t = 0; t < first_kept; ++t) Tag(seq, layer, pos0 + t + 1) = -1;
  for (int t = first_kept; t < n; ++t) Tag(seq, layer, pos0 + t + 1) = pos0 + t + 1;
  len = pos0 + n;
}

int RecurrentState::ExactKeep(int seq, int n) const {
  if (empty()) return n;
  LAMINA_CHECK(seq >= 0 && seq < n_seq_);
  if (n <= 0) return 0;
  for (int layer = 0; layer < shape_.n_layer; ++layer) {
    if (n > lengths_[Index(seq, layer)] || TagOf(seq, layer, n) != n) return 0;
  }
  return n;
}

void RecurrentState::Truncate(int seq, int n_keep) {
  if (empty()) return;
  LAMINA_CHECK(ExactKeep(seq, n_keep) == n_keep);
  // A planted fault (write_observer.h): the rejected tokens' state stays live.
  const bool skip_restore =
      observer_ != nullptr && observer_->SkipStateRestore(seq, length(seq), n_keep);
  if (n_keep == 0 && !skip_restore) {
    Reset(seq);
    return;
  }
  for (int layer = 0; layer < shape_.n_layer; ++layer) {
    int& len = lengths_[Index(seq, layer)];
    if (n_keep == len) continue;
    if (skip_restore) {
      std::memmove(Slot(seq, layer, n_keep), Current(seq, layer), per_ * sizeof(float));
    }
    for (int slot = 0; slot < ring_; ++slot) {
      int& tag = tags_[Index(seq, layer) * ring_ + slot];
      if (tag > n_keep) tag = -1;
    }
    Tag(seq, layer, n_keep) = n_keep;
    len = n_keep;
  }
}

void RecurrentState::CopyPrefix(int src, int dst, int n) {
  if (empty() || src == dst) return;
  LAMINA_CHECK(ExactKeep(src, n) == n && dst >= 0 && dst < n_seq_);
  if (n == 0) {
    Reset(dst);
    return;
  }
  for (int layer = 0; layer < shape_.n_layer; ++layer) {
    for (int slot = 0; slot < ring_; ++slot) {
      const int tag = tags_[Index(src, layer) * ring_ + slot];
      const bool keep = tag >= 0 && tag <= n;
      tags_[Index(dst, layer) * ring_ + slot] = keep ? tag : -1;
      if (keep) std::copy_n(Slot(src, layer, slot), per_, Slot(dst, layer, slot));
    }
    lengths_[Index(dst, layer)] = n;
  }
}

void RecurrentState::Skip(int seq, int n) {
  if (empty()) return;
  for (int layer = 0; layer < shape_.n_layer; ++layer) {
    int& len = lengths_[Index(seq, layer)];
    if (n != len) std::memmove(Slot(seq, layer, n), Current(seq, layer), per_ * sizeof(float));
    std::fill_n(tags_.begin() + Index(seq, layer) * ring_, ring_, -1);
    Tag(seq, layer, n) = n;
    len = n;
  }
}

}  // namespace lamina
