// Recurrent state of the Gated DeltaNet layers of hybrid models (qwen3next), beside the KV
// cache: per sequence and recurrent layer a conv tail and a delta-rule state, written only by
// Scan (the single writer). The states live in a ring: token t of a sequence reads the state
// after t - 1 tokens from one slot and writes the state after t tokens into the next slot, so
// the states after each of the last `ring` tokens stay in place without a copy. Truncate(seq, n)
// restores the state as it was after token n when n is 0, the current length, or one of the
// last `ring` lengths (ExactKeep says which) by pointing back at that slot. Further back, state
// cannot be restored: callers re-evaluate from 0 (Session::Truncate) or get an error
// (Session::TruncateExact).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/write_observer.h"
#include "util/thread_pool.h"

namespace lamina {

// States kept per sequence by default: rolls back a verify window of 1 + draft_max tokens for
// every draft_max up to 31.
inline constexpr int kRecurrentRingDefault = 32;

class RecurrentState {
 public:
  // shape.n_layer == 0: an empty store (pure transformers); every call is then a no-op.
  // observer (optional, not owned; planted faults): Truncate asks its SkipStateRestore.
  RecurrentState(const RecurrentShape& shape, int n_seq, int ring,
                 const WriteObserver* observer = nullptr);

  const RecurrentShape& shape() const { return shape_; }
  bool empty() const { return shape_.n_layer == 0; }
  int ring() const { return ring_; }
  // Tokens the sequence's state has consumed (layer 0; every layer agrees after a forward).
  int length(int seq) const;
  // Bytes held: every sequence's ring of states.
  uint64_t bytes() const;
  // The bytes a store of this shape would hold, computed before allocating it (0 when empty).
  static uint64_t PlanBytes(const RecurrentShape& shape, int n_seq, int ring);

  // The single writer: continues layer `layer` of sequence `seq` (at length pos0) over n tokens.
  // conv_w: [conv_channels, conv_kernel]; qkv: [n, conv_channels] before the convolution;
  // decay, beta: [n, n_v_heads]; out: [n, n_v_heads * head_v]. Heads run on the pool.
  void Scan(int layer, int seq, int pos0, int n, const float* conv_w, const float* qkv,
            const float* decay, const float* beta, float* out, ThreadPool& pool);

  // The largest length <= n the sequence can be truncated to exactly: n when n is 0, its
  // length, or a length whose state is still in the ring; else 0.
  int ExactKeep(int seq, int n) const;
  // Restores the state after token n_keep (ExactKeep(seq, n_keep) must be n_keep).
  void Truncate(int seq, int n_keep);
  // dst's state becomes src's after token n (ExactKeep(src, n) == n), with src's ring up to n.
  void CopyPrefix(int src, int dst, int n);
  // Advances the sequence to length n without changing its state (benchmark filler cells:
  // attention layers get random cells, recurrent layers keep their state); drops the ring.
  void Skip(int seq, int n);

  // Test access: the current conv tail [conv_kernel - 1, conv_channels] and delta state
  // [n_v_heads, head_k, head_v] of (seq, layer).
  const float* Conv(int seq, int layer) const { return Current(seq, layer); }
  const float* Delta(int seq, int layer) const {
    return Current(seq, layer) + shape_.conv_floats();
  }

 private:
  size_t Index(int seq, int layer) const {
    return static_cast<size_t>(seq) * shape_.n_layer + layer;
  }
  float* Slot(int seq, int layer, int length) {
    return states_.data() + (Index(seq, layer) * ring_ + length % ring_) * per_;
  }
  const float* Current(int seq, int layer) const {
    const int len = lengths_[Index(seq, layer)];
    return states_.data() + (Index(seq, layer) * ring_ + len % ring_) * per_;
  }
  int& Tag(int seq, int layer, int length) {
    return tags_[Index(seq, layer) * ring_ + length % ring_];
  }
  int TagOf(int seq, int layer, int length) const {
    return tags_[Index(seq, layer) * ring_ + length % ring_];
  }
  // Makes the sequence's state the zero state at length 0, dropping the rest of the ring.
  void Reset(int seq);

  RecurrentShape shape_;
  int n_seq_ = 0;
  int ring_ = 0;
  size_t per_ = 0;               // floats per state: conv tail then delta state
  std::vector<float> states_;    // [n_seq, n_layer, ring, per_] the state after `tag` tokens
  std::vector<int> tags_;        // [n_seq, n_layer, ring] length a slot holds (-1: none)
  std::vector<int> lengths_;     // [n_seq, n_layer]
  std::vector<float> conv_out_;  // [n, conv_channels] scratch of Scan
  std::vector<float> tail_in_;   // [conv_kernel - 1, conv_channels] scratch of Scan
  const WriteObserver* observer_ = nullptr;
};

}  // namespace lamina
