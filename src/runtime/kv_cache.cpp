// KV cache storage and its single writer.
#include "runtime/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/check.h"

namespace lamina {

const char* KvTypeName(KvType type) {
  switch (type) {
    case KvType::kF32: return "f32";
    case KvType::kF16: return "f16";
    case KvType::kInt8: return "int8";
    case KvType::kQ4_0: return "q4_0";
    case KvType::kK8V4: return "k8v4";
  }
  return "?";
}

Result<KvType> ParseKvType(const std::string& name) {
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kInt8, KvType::kQ4_0, KvType::kK8V4}) {
    if (name == KvTypeName(t)) return t;
  }
  return Error{"unknown KV cache type \"" + name + "\" (expected f32, f16, int8, q4_0 or k8v4)"};
}

Result<KvRounding> ParseKvRounding(const std::string& name) {
  if (name == "rtn") return KvRounding::kNearest;
  if (name == "stochastic") return KvRounding::kStochastic;
  return Error{"unknown V rounding \"" + name + "\" (expected rtn or stochastic)"};
}

const char* KvRoundingName(KvRounding r) { return r == KvRounding::kNearest ? "rtn" : "stochastic"; }

KvSideSpec KSpec(KvType type) {
  switch (type) {
    case KvType::kF32: return {KvRowFormat::kF32, false};
    case KvType::kF16: return {KvRowFormat::kF16, false};
    case KvType::kInt8: return {KvRowFormat::kInt8, false};
    case KvType::kQ4_0: return {KvRowFormat::kQ4_0, true};
    case KvType::kK8V4: return {KvRowFormat::kInt8, false};
  }
  return {KvRowFormat::kF32, false};
}

KvSideSpec VSpec(KvType type) {
  switch (type) {
    case KvType::kF32: return {KvRowFormat::kF32, false};
    case KvType::kF16: return {KvRowFormat::kF16, false};
    case KvType::kInt8: return {KvRowFormat::kInt8, false};
    case KvType::kQ4_0: return {KvRowFormat::kQ4_0, true};
    case KvType::kK8V4: return {KvRowFormat::kQ4_0, true};
  }
  return {KvRowFormat::kF32, false};
}

Status ValidateKvConfig(const KvCacheConfig& c) {
  if (c.n_layer <= 0 || c.n_ctx <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 || c.n_seq <= 0) {
    return Error{"invalid KV cache shape"};
  }
  if (KvRowBytes(KSpec(c.type).format, c.head_dim) == 0 ||
      KvRowBytes(VSpec(c.type).format, c.head_dim) == 0) {
    return Error{std::string("KV mode ") + KvTypeName(c.type) + " cannot hold head_dim " +
                 std::to_string(c.head_dim) +
                 ": block formats need head_dim below 32 and even, or a multiple of 32"};
  }
  return Status::Ok();
}

KvCache::KvCache(const KvCacheConfig& config)
    : config_(config), k_spec_(KSpec(config.type)), v_spec_(VSpec(config.type)) {
  LAMINA_CHECK(ValidateKvConfig(config).ok());
  k_head_bytes_ = KvRowBytes(k_spec_.format, config.head_dim);
  v_head_bytes_ = KvRowBytes(v_spec_.format, config.head_dim);
  const size_t head_rows =
      static_cast<size_t>(config.n_ctx) * config.n_layer * config.n_seq * config.n_kv_heads;
  k_.assign(head_rows * k_head_bytes_, 0);
  v_.assign(head_rows * v_head_bytes_, 0);
  lengths_.assign(static_cast<size_t>(config.n_seq) * config.n_layer, 0);
}

double KvCache::BitsPerElement() const {
  return 8.0 * (k_row_bytes() + v_row_bytes()) / (2.0 * row_elems());
}

size_t KvCache::BytesPerToken() const { return (k_row_bytes() + v_row_bytes()) * config_.n_layer; }

size_t KvCache::BytesTotal() const { return BytesPerToken() * config_.n_ctx * config_.n_seq; }

void KvCache::EncodeHead(const KvSideSpec& spec, bool stochastic, int layer, int seq, int pos,
                         int head, const float* src, std::vector<uint8_t>& buf, size_t head_bytes,
                         float* tmp) {
  const int hd = config_.head_dim;
  const float* x = src;
  if (spec.rotated) {
    std::copy_n(x, hd, tmp);
    Rotate(tmp, hd);
    x = tmp;
  }
  RoundingKey key{config_.seed, static_cast<uint32_t>(layer), static_cast<uint32_t>(pos),
                  static_cast<uint32_t>(head * hd)};
  EncodeKvRow(spec.format, x, hd, stochastic ? &key : nullptr,
              buf.data() + HeadIndex(layer, seq, head, pos) * head_bytes);
}

void KvCache::ZeroCells(int layer, int seq, int pos0, int n) {
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    std::memset(k_.data() + HeadIndex(layer, seq, h, pos0) * k_head_bytes_, 0, n * k_head_bytes_);
    std::memset(v_.data() + HeadIndex(layer, seq, h, pos0) * v_head_bytes_, 0, n * v_head_bytes_);
  }
}

const float* KvCache::BiasedForTesting(const float* v, std::vector<float>& out) const {
  const int hd = config_.head_dim;
  out.assign(v, v + row_elems());
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    float* x = out.data() + static_cast<int64_t>(h) * hd;
    float amax = 0.0f;
    for (int e = 0; e < hd; ++e) amax = std::max(amax, std::fabs(x[e]));
    for (int e = 0; e < hd; ++e) x[e] += amax / 8.0f;
  }
  return out.data();
}

void KvCache::Write(int layer, int seq, int pos0, int n, const float* k, const float* v,
                    ThreadPool* pool) {
  LAMINA_CHECK(layer >= 0 && layer < config_.n_layer);
  LAMINA_CHECK(seq >= 0 && seq < config_.n_seq);
  int& length = lengths_[Index(layer, seq)];
  LAMINA_CHECK(pos0 >= 0 && pos0 <= length && n >= 0 && pos0 + n <= config_.n_ctx);
  if (n == 1 && fault_ == Fault::kSkipSingleToken) {
    length = std::max(length, pos0 + n);
    return;
  }
  const int re = row_elems();
  // Non-finite rows are found first, in order, so the reported position is the first one.
  std::vector<char> finite(n, 1);
  for (int i = 0; i < n; ++i) {
    const float* krow = k + static_cast<int64_t>(i) * re;
    const float* vrow = v + static_cast<int64_t>(i) * re;
    for (int e = 0; e < re && finite[i]; ++e) finite[i] = std::isfinite(krow[e]) && std::isfinite(vrow[e]);
    if (!finite[i] && nonfinite_error_.empty()) {
      nonfinite_error_ = "non-finite K or V value at layer " + std::to_string(layer) +
                         ", position " + std::to_string(pos0 + i) + "; the cell was not stored";
    }
  }
  const bool v_stochastic = config_.v_rounding == KvRounding::kStochastic;
  const int hd = config_.head_dim;
  const int n_heads = config_.n_kv_heads;
  // Work items are (row, head) pairs, so even a single decoded token's heads spread over the pool.
  auto encode = [&](int64_t item0, int64_t item1) {
    std::vector<float> tmp(hd);     // [head_dim] rotation scratch
    std::vector<float> biased;      // [row_elems] only under Fault::kBiasedV
    for (int64_t item = item0; item < item1; ++item) {
      const int64_t i = item / n_heads;
      const int h = static_cast<int>(item % n_heads);
      const int pos = pos0 + static_cast<int>(i);
      if (!finite[i]) {
        if (h == 0) ZeroCells(layer, seq, pos, 1);
        continue;
      }
      const float* vrow = v + i * re;
      if (fault_ == Fault::kBiasedV) vrow = BiasedForTesting(vrow, biased);
      EncodeHead(k_spec_, /*stochastic=*/false, layer, seq, pos, h, k + i * re + h * hd, k_,
                 k_head_bytes_, tmp.data());
      EncodeHead(v_spec_, v_stochastic, layer, seq, pos, h, vrow + h * hd, v_, v_head_bytes_,
                 tmp.data());
    }
  };
  const int64_t n_items = static_cast<int64_t>(n) * n_heads;
  if (pool != nullptr && n_items > 1) {
    pool->ParallelFor(n_items, 1, encode);
  } else {
    encode(0, n_items);
  }
  if (n == 1 && fault_ == Fault::kCorruptSingleToken) {
    v_[HeadIndex(layer, seq, 0, pos0) * v_head_bytes_] ^= 0x5A;
  }
  length = std::max(length, pos0 + n);
}

void KvCache::Truncate(int seq, int n_keep) {
  LAMINA_CHECK(seq >= 0 && seq < config_.n_seq && n_keep >= 0);
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    int& length = lengths_[Index(layer, seq)];
    if (n_keep >= length) continue;
    // Zero the dropped cells so storage is a pure function of the surviving history.
    ZeroCells(layer, seq, n_keep, length - n_keep);
    length = n_keep;
  }
}

void KvCache::CopyPrefix(int src_seq, int dst_seq, int n) {
  LAMINA_CHECK(src_seq >= 0 && src_seq < config_.n_seq && dst_seq >= 0 && dst_seq < config_.n_seq);
  if (src_seq == dst_seq) return;
  Truncate(dst_seq, 0);
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    LAMINA_CHECK(n >= 0 && n <= Length(src_seq, layer));
    for (int h = 0; h < config_.n_kv_heads; ++h) {
      std::memcpy(k_.data() + HeadIndex(layer, dst_seq, h, 0) * k_head_bytes_,
                  KHead(layer, src_seq, h, 0), k_head_bytes_ * n);
      std::memcpy(v_.data() + HeadIndex(layer, dst_seq, h, 0) * v_head_bytes_,
                  VHead(layer, src_seq, h, 0), v_head_bytes_ * n);
    }
    lengths_[Index(layer, dst_seq)] = n;
  }
}

}  // namespace lamina
