// Test helpers: the encoded bytes a KV cache holds for one sequence, per layer (K rows, V rows,
// with anchored keys each head's per-cell flags and anchor, with a window the exact copies the
// last position reads), and a hybrid model's recurrent state of one sequence, for identity
// checks.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/kv_cache.h"
#include "runtime/session.h"

namespace lamina {

// Cells [0, n_cells) of sequence `seq` (n_cells < 0: the whole context).
inline std::vector<std::vector<uint8_t>> KvStorageBytes(const KvCache& c, int seq,
                                                        int n_cells = -1) {
  const int n = n_cells < 0 ? c.config().n_ctx : n_cells;
  std::vector<std::vector<uint8_t>> storage;  // [n_layer][bytes]
  for (int l = 0; l < c.config().n_layer; ++l) {
    std::vector<uint8_t> bytes(c.KStorage(l, seq), c.KStorage(l, seq) + c.k_row_bytes() * n);
    bytes.insert(bytes.end(), c.VStorage(l, seq), c.VStorage(l, seq) + c.v_row_bytes() * n);
    if (c.k_anchored()) {
      for (int h = 0; h < c.config().n_kv_heads; ++h) {
        const uint8_t* flags = c.KAnchorFlags(l, seq, h);
        bytes.insert(bytes.end(), flags, flags + n);
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
