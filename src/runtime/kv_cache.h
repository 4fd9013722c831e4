// The KV cache. One write operation (Write) is the only code that touches cell storage: every
// path — prompt batch, single-token decode, verify windows, several sequences — goes through
// it, so all paths produce identical bytes by construction. Truncate and CopyPrefix are the
// other mutations. Attention reads rows through typed views.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "util/fp16.h"
#include "util/status.h"

namespace lamina {

enum class KvType { kF32, kF16 };
const char* KvTypeName(KvType type);
Result<KvType> ParseKvType(const std::string& name);

struct KvCacheConfig {
  int n_layer = 0;
  int n_ctx = 0;       // cells per sequence
  int n_kv_heads = 0;
  int head_dim = 0;
  int n_seq = 1;
  KvType type = KvType::kF16;
};

class KvCache {
 public:
  explicit KvCache(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  int row_elems() const { return config_.n_kv_heads * config_.head_dim; }
  double BitsPerElement() const;
  size_t BytesPerToken() const;  // K + V over all layers
  size_t BytesTotal() const;     // for n_ctx tokens and all sequences

  // The single writer: K and V rows for positions [pos0, pos0 + n) of sequence `seq` in
  // `layer`. k, v: [n, n_kv_heads * head_dim] f32 (k after RoPE). Positions must continue the
  // sequence (pos0 <= Length(seq, layer)), so rewriting after Truncate is allowed.
  void Write(int layer, int seq, int pos0, int n, const float* k, const float* v);

  // Drops cells at positions >= n_keep in every layer (rollback of rejected tokens).
  void Truncate(int seq, int n_keep);
  // Makes dst's first n cells a copy of src's (every layer).
  void CopyPrefix(int src_seq, int dst_seq, int n);

  int Length(int seq, int layer = 0) const { return lengths_[Index(layer, seq)]; }

  // Raw row access for attention: the K (or V) row of a cell, all heads, in the cache type.
  const uint8_t* KRow(int layer, int seq, int pos) const { return RowPtr(k_, layer, seq, pos); }
  const uint8_t* VRow(int layer, int seq, int pos) const { return RowPtr(v_, layer, seq, pos); }
  size_t row_bytes() const { return row_bytes_; }

  // Whole storage of one layer and sequence, for tests comparing paths byte by byte.
  const uint8_t* KStorage(int layer, int seq) const { return RowPtr(k_, layer, seq, 0); }
  const uint8_t* VStorage(int layer, int seq) const { return RowPtr(v_, layer, seq, 0); }

 private:
  size_t Index(int layer, int seq) const { return static_cast<size_t>(seq) * config_.n_layer + layer; }
  const uint8_t* RowPtr(const std::vector<uint8_t>& buf, int layer, int seq, int pos) const;
  uint8_t* MutableRow(std::vector<uint8_t>& buf, int layer, int seq, int pos);
  void StoreRow(const float* src, uint8_t* dst) const;

  KvCacheConfig config_;
  size_t row_bytes_ = 0;
  std::vector<uint8_t> k_;  // [n_seq, n_layer, n_ctx, n_kv_heads, head_dim] in type
  std::vector<uint8_t> v_;  // same
  std::vector<int> lengths_;  // [n_seq, n_layer]
};

}  // namespace lamina
