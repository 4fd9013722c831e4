// The one hook on a Session's mutations, for planting faults (the write-path tests, `lamina
// probe --inject-fault`): every hook defaults to "no fault", and without an observer nothing
// asks.
#pragma once

namespace lamina {

// Where one KvCache::Write lands.
struct KvWriteSpan {
  int layer = 0;
  int seq = 0;
  int pos0 = 0;  // first position written
  int n = 0;     // rows (1: a single-token decode step)
  int n_kv_heads = 0;
  int head_dim = 0;
};

// Passed as KvCacheConfig::write_observer / SessionConfig::write_observer (not owned; it must
// outlive the session). Hooks may be called from the thread that calls into the session only.
class WriteObserver {
 public:
  virtual ~WriteObserver() = default;

  // Rows lost or corrupted on their way to storage. KvCache::Write calls it once per call,
  // before anything is checked or stored. k, v: [n, n_kv_heads * head_dim], writable copies of
  // the rows about to be encoded (k after RoPE). Returns false to veto the write: no cell is
  // stored, yet the sequence's length advances, as when a write path loses its rows.
  virtual bool OnWrite(const KvWriteSpan& /*span*/, float* /*k*/, float* /*v*/) const {
    return true;
  }

  // A windowed cell never encoded: asked once per single-token write of a cache with a window
  // (KvCacheConfig::window); true stores only the cell's exact copy in the ring, not its
  // encoded form (it reads wrong once it leaves the window).
  virtual bool SkipWindowedEncode(const KvWriteSpan& /*span*/) const { return false; }
  // A windowed cell encoded twice: asked like SkipWindowedEncode; true encodes the cell's V a
  // second time, from its own decoded form.
  virtual bool EncodeWindowedTwice(const KvWriteSpan& /*span*/) const { return false; }

  // Recurrent state not rolled back: RecurrentState::Truncate asks it once per call (a sequence
  // at `length` cut to n_keep); true moves the length back but leaves the rejected tokens'
  // state live.
  virtual bool SkipStateRestore(int /*seq*/, int /*length*/, int /*n_keep*/) const { return false; }

  // Rejected cells left in the sequence: Session::Truncate asks it before a cut that would drop
  // cells (n_keep < n_past); true keeps everything (cells, state, tokens) as it was.
  virtual bool KeepOnTruncate(int /*seq*/, int /*n_past*/, int /*n_keep*/) const { return false; }
};

}  // namespace lamina
