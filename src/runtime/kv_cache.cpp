// KV cache storage and its single writer.
#include "runtime/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "util/check.h"

namespace lamina {

const char* KvTypeName(KvType type) {
  switch (type) {
    case KvType::kF32: return "f32";
    case KvType::kF16: return "f16";
  }
  return "?";
}

Result<KvType> ParseKvType(const std::string& name) {
  if (name == "f32") return KvType::kF32;
  if (name == "f16") return KvType::kF16;
  return Error{"unknown KV cache type \"" + name + "\" (expected f32 or f16)"};
}

KvCache::KvCache(const KvCacheConfig& config) : config_(config) {
  LAMINA_CHECK(config.n_layer > 0 && config.n_ctx > 0 && config.n_kv_heads > 0 &&
               config.head_dim > 0 && config.n_seq > 0);
  const size_t elem = config.type == KvType::kF32 ? 4 : 2;
  row_bytes_ = elem * static_cast<size_t>(row_elems());
  const size_t total = row_bytes_ * config.n_ctx * config.n_layer * config.n_seq;
  k_.assign(total, 0);
  v_.assign(total, 0);
  lengths_.assign(static_cast<size_t>(config.n_seq) * config.n_layer, 0);
}

double KvCache::BitsPerElement() const { return config_.type == KvType::kF32 ? 32.0 : 16.0; }

size_t KvCache::BytesPerToken() const { return 2 * row_bytes_ * config_.n_layer; }

size_t KvCache::BytesTotal() const { return BytesPerToken() * config_.n_ctx * config_.n_seq; }

const uint8_t* KvCache::RowPtr(const std::vector<uint8_t>& buf, int layer, int seq,
                               int pos) const {
  LAMINA_DCHECK(layer >= 0 && layer < config_.n_layer && seq >= 0 && seq < config_.n_seq);
  LAMINA_DCHECK(pos >= 0 && pos <= config_.n_ctx);
  const size_t cell = (Index(layer, seq) * config_.n_ctx + pos);
  return buf.data() + cell * row_bytes_;
}

uint8_t* KvCache::MutableRow(std::vector<uint8_t>& buf, int layer, int seq, int pos) {
  return const_cast<uint8_t*>(RowPtr(buf, layer, seq, pos));
}

void KvCache::StoreRow(const float* src, uint8_t* dst) const {
  const int n = row_elems();
  if (config_.type == KvType::kF32) {
    std::memcpy(dst, src, sizeof(float) * n);
  } else {
    fp16_t* out = reinterpret_cast<fp16_t*>(dst);
    for (int i = 0; i < n; ++i) out[i] = F32ToFp16(src[i]);
  }
}

void KvCache::Write(int layer, int seq, int pos0, int n, const float* k, const float* v) {
  LAMINA_CHECK(layer >= 0 && layer < config_.n_layer);
  LAMINA_CHECK(seq >= 0 && seq < config_.n_seq);
  int& length = lengths_[Index(layer, seq)];
  LAMINA_CHECK(pos0 >= 0 && pos0 <= length && n >= 0 && pos0 + n <= config_.n_ctx);
  const int re = row_elems();
  for (int i = 0; i < n; ++i) {
    StoreRow(k + static_cast<int64_t>(i) * re, MutableRow(k_, layer, seq, pos0 + i));
    StoreRow(v + static_cast<int64_t>(i) * re, MutableRow(v_, layer, seq, pos0 + i));
  }
  length = std::max(length, pos0 + n);
}

void KvCache::Truncate(int seq, int n_keep) {
  LAMINA_CHECK(seq >= 0 && seq < config_.n_seq && n_keep >= 0);
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    int& length = lengths_[Index(layer, seq)];
    if (n_keep >= length) continue;
    // Zero the dropped cells so storage is a pure function of the surviving history.
    const size_t bytes = row_bytes_ * (length - n_keep);
    std::memset(MutableRow(k_, layer, seq, n_keep), 0, bytes);
    std::memset(MutableRow(v_, layer, seq, n_keep), 0, bytes);
    length = n_keep;
  }
}

void KvCache::CopyPrefix(int src_seq, int dst_seq, int n) {
  LAMINA_CHECK(src_seq >= 0 && src_seq < config_.n_seq && dst_seq >= 0 && dst_seq < config_.n_seq);
  if (src_seq == dst_seq) return;
  Truncate(dst_seq, 0);
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    LAMINA_CHECK(n <= Length(src_seq, layer));
    std::memcpy(MutableRow(k_, layer, dst_seq, 0), RowPtr(k_, layer, src_seq, 0), row_bytes_ * n);
    std::memcpy(MutableRow(v_, layer, dst_seq, 0), RowPtr(v_, layer, src_seq, 0), row_bytes_ * n);
    lengths_[Index(layer, dst_seq)] = n;
  }
}

}  // namespace lamina
