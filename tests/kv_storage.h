// Test helpers: the encoded bytes a KV cache holds for one sequence, per layer (K rows, V rows,
// with anchored keys each head's per-cell flags and anchor, with a window the exact copies the
// last position reads; of a sliding-window ring the cells of the next query's window), and a
// hybrid model's recurrent state of one sequence, for identity checks.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/kv_cache.h"
#include "runtime/session.h"

namespace lamina {

// The cells [Length - window, Length) of a sliding-window layer (`window`: its attention
// window): the next query's window and the cell before it, each head's K rows, V rows and
// (anchored keys) flags, read through the ring where there is one.
inline std::vector<uint8_t> KvWindowCells(const KvCache& c, int l, int seq, int window) {
  const int len = c.Length(seq, l);
  std::vector<uint8_t> bytes, krow(c.k_head_bytes());  // krow: one cell's K row (rows or tiles)
  for (int h = 0; h < c.config().n_kv_heads; ++h) {
    for (int p = std::max(0, len - window); p < len; ++p) {
      c.KRow(l, seq, h, p, krow.data());
      bytes.insert(bytes.end(), krow.begin(), krow.end());
      bytes.insert(bytes.end(), c.VHead(l, seq, h, p), c.VHead(l, seq, h, p) + c.v_head_bytes());
      if (c.k_anchored()) bytes.push_back(*c.KAnchorFlags(l, seq, h, p));
    }
  }
  return bytes;
}

// Cells [0, n_cells) of sequence `seq` (n_cells < 0: the whole context); of a sliding-window
// ring, the cells of its window only (KvWindowCells), and so with `windows_only` of every
// sliding-window layer (to compare a ring with a cache that keeps every cell).
inline std::vector<std::vector<uint8_t>> KvStorageBytes(const KvCache& c, int seq, int n_cells = -1,
                                                        bool windows_only = false) {
  const int n = n_cells < 0 ? c.config().n_ctx : n_cells;
  std::vector<std::vector<uint8_t>> storage;  // [n_layer][bytes]
  for (int l = 0; l < c.config().n_layer; ++l) {
    std::vector<uint8_t> bytes;
    if (c.ring_layer(l) || (windows_only && c.sliding_window(l) > 0)) {
      bytes = KvWindowCells(c, l, seq, c.sliding_window(l));
    } else {
      bytes.assign(c.KStorage(l, seq), c.KStorage(l, seq) + c.k_row_bytes() * n);
      bytes.insert(bytes.end(), c.VStorage(l, seq), c.VStorage(l, seq) + c.v_row_bytes() * n);
    }
    if (c.k_anchored()) {
      for (int h = 0; h < c.config().n_kv_heads; ++h) {
        const uint8_t* flags = c.KAnchorFlags(l, seq, h);
        if (!c.ring_layer(l) && !(windows_only && c.sliding_window(l) > 0)) {
          bytes.insert(bytes.end(), flags, flags + n);
        }
        const auto* anchor = reinterpret_cast<const uint8_t*>(c.KAnchor(l, seq, h));
        bytes.insert(bytes.end(), anchor, anchor + sizeof(float) * c.config().head_dim);
      }
    }
    if (c.window() > 0) {
      // The window's exact copies of the cells a query at the last position reads exactly.
      const int len = c.Length(seq, l);
      for (int h = 0; h < c.config().n_kv_heads; ++h) {
        for (int p = c.WindowBegin(l, seq, len - 1); p < len; ++p) {
          bytes.insert(bytes.end(), c.WindowK(l, seq, h, p),
                       c.WindowK(l, seq, h, p) + c.window_row_bytes());
          bytes.insert(bytes.end(), c.WindowV(l, seq, h, p),
                       c.WindowV(l, seq, h, p) + c.window_row_bytes());
        }
      }
    }
    storage.push_back(std::move(bytes));
  }
  return storage;
}

// Sequence `seq`'s recurrent state, layer by layer: conv tail then delta state (empty for a
// pure transformer).
inline std::vector<float> RecurrentStateFloats(const Session& s, int seq) {
  const RecurrentState& r = s.recurrent();
  std::vector<float> out;
  for (int l = 0; l < r.shape().n_layer; ++l) {
    out.insert(out.end(), r.Conv(seq, l), r.Conv(seq, l) + r.shape().conv_floats());
    out.insert(out.end(), r.Delta(seq, l), r.Delta(seq, l) + r.shape().state_floats());
  }
  return out;
}

}  // namespace lamina
