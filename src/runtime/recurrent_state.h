// Recurrent state of the Gated DeltaNet layers of hybrid models (qwen3next), beside the KV
// cache: per sequence and recurrent layer a conv tail and a delta-rule state, written only by
// Scan (the single writer). A ring of per-token snapshots lets a sequence roll back exactly:
// the state after each of its last `ring` tokens is kept, so Truncate(seq, n) restores the state
// as it was after token n when n is 0, the current length, or one of the last `ring` lengths
// (ExactKeep says which). Further back, state cannot be restored: callers re-evaluate from 0
// (Session::Truncate) or get an error (Session::TruncateExact).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"
#include "util/thread_pool.h"

namespace lamina {

// Snapshots kept per sequence by default: covers a verify window of 1 + draft_max tokens for
// every draft_max up to 31.
inline constexpr int kRecurrentRingDefault = 32;

class RecurrentState {
 public:
  // shape.n_layer == 0: an empty store (pure transformers); every call is then a no-op.
  RecurrentState(const RecurrentShape& shape, int n_seq, int ring);

  const RecurrentShape& shape() const { return shape_; }
  bool empty() const { return shape_.n_layer == 0; }
  int ring() const { return ring_; }
  // Tokens the sequence's state has consumed (layer 0; every layer agrees after a forward).
  int length(int seq) const;
  // Bytes held: live state and snapshots of every sequence.
  uint64_t bytes() const;

  // The single writer: continues layer `layer` of sequence `seq` (at length pos0) over n tokens.
  // conv_w: [conv_channels, conv_kernel]; qkv: [n, conv_channels] before the convolution;
  // decay, beta: [n, n_v_heads]; out: [n, n_v_heads * head_v]. Heads run on the pool.
  void Scan(int layer, int seq, int pos0, int n, const float* conv_w, const float* qkv,
            const float* decay, const float* beta, float* out, ThreadPool& pool);

  // The largest length <= n the sequence can be truncated to exactly: n when n is 0, its
  // length, or a length whose snapshot is in the ring; else 0.
  int ExactKeep(int seq, int n) const;
  // Restores the state after token n_keep (ExactKeep(seq, n_keep) must be n_keep).
  void Truncate(int seq, int n_keep);
  // dst's state becomes src's after token n (ExactKeep(src, n) == n), with src's snapshots up
  // to n.
  void CopyPrefix(int src, int dst, int n);
  // Advances the sequence to length n without changing its state (benchmark filler cells:
  // attention layers get random cells, recurrent layers keep their state); drops snapshots.
  void Skip(int seq, int n);

  // Test access: the live conv tail [conv_kernel - 1, conv_channels] and delta state
  // [n_v_heads, head_k, head_v] of (seq, layer).
  const float* Conv(int seq, int layer) const { return live_.data() + LiveOffset(seq, layer); }
  const float* Delta(int seq, int layer) const {
    return live_.data() + LiveOffset(seq, layer) + shape_.conv_floats();
  }
  // Test-only planted fault: Truncate leaves the state as it is (only the length moves).
  void set_fault_skip_restore(bool on) { fault_skip_restore_ = on; }

 private:
  size_t LiveOffset(int seq, int layer) const {
    return (static_cast<size_t>(seq) * shape_.n_layer + layer) * per_;
  }
  size_t SnapOffset(int seq, int layer, int slot) const {
    return ((static_cast<size_t>(seq) * shape_.n_layer + layer) * ring_ + slot) * per_;
  }
  int& Tag(int seq, int layer, int slot) {
    return tags_[(static_cast<size_t>(seq) * shape_.n_layer + layer) * ring_ + slot];
  }
  int TagAt(int seq, int layer, int slot) const {
    return tags_[(static_cast<size_t>(seq) * shape_.n_layer + layer) * ring_ + slot];
  }

  RecurrentShape shape_;
  int n_seq_ = 0;
  int ring_ = 0;
  size_t per_ = 0;               // floats per (seq, layer): conv tail then delta state
  std::vector<float> live_;      // [n_seq, n_layer, per_]
  std::vector<float> snaps_;     // [n_seq, n_layer, ring, per_] state after token `tag`
  std::vector<int> tags_;        // [n_seq, n_layer, ring] length a snapshot holds (-1: none)
  std::vector<int> lengths_;     // [n_seq, n_layer]
  std::vector<float> conv_out_;  // [n, conv_channels] scratch of Scan
  bool fault_skip_restore_ = false;
};

}  // namespace lamina
