// KV cache storage and its single writer.
#include "runtime/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kv_decode.h"
#include "util/check.h"
#include "util/memory.h"

namespace lamina {

Result<KvType> ParseKvType(const std::string& name) {
  for (const KvMode& m : kKvModes) {
    if (name == m.name) return m.type;
  }
  return Error{"unknown KV cache type \"" + name + "\" (expected " + KvModeNames() + ")"};
}

std::string KvModeNames() {
  std::string out;
  for (int i = 0; i < kKvModeCount; ++i) {
    if (i > 0) out += i + 1 == kKvModeCount ? " or " : ", ";
    out += kKvModes[i].name;
  }
  return out;
}

namespace {
// What a row format needs of head_dim ("" for any head_dim).
const char* HeadDimNeeds(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kF32:
    case KvRowFormat::kF16:
      return "";
    case KvRowFormat::kInt8:
    case KvRowFormat::kQ4_0:
    case KvRowFormat::kQ4Nl:
      return "head_dim below 32 and even, or a multiple of 32";
  }
  return "";
}
}  // namespace

Status ValidateKvMode(KvType type, int head_dim) {
  const KvMode& m = KvModeOf(type);
  for (const KvSideSpec* side : {&m.k, &m.v}) {
    if (KvRowBytes(side->format, head_dim) == 0) {
      return Error{std::string("KV mode ") + m.name + " cannot hold head_dim " +
                   std::to_string(head_dim) + ": its block formats need " +
                   HeadDimNeeds(side->format)};
    }
  }
  return Status::Ok();
}

Result<KvRounding> ParseKvRounding(const std::string& name) {
  if (name == "rtn") return KvRounding::kNearest;
  if (name == "stochastic") return KvRounding::kStochastic;
  return Error{"unknown V rounding \"" + name + "\" (expected rtn or stochastic)"};
}

const char* KvRoundingName(KvRounding r) {
  return r == KvRounding::kNearest ? "rtn" : "stochastic";
}

Status ValidateKvConfig(const KvCacheConfig& c) {
  if (c.n_layer <= 0 || c.n_ctx <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 || c.n_seq <= 0) {
    return Error{"invalid KV cache shape"};
  }
  if (c.window < 0) return Error{"negative KV window " + std::to_string(c.window)};
  if (!c.sliding_window.empty()) {
    if (static_cast<int>(c.sliding_window.size()) != c.n_layer) {
      return Error{"sliding windows given for " + std::to_string(c.sliding_window.size()) +
                   " layers, the cache has " + std::to_string(c.n_layer)};
    }
    for (int w : c.sliding_window) {
      if (w < 0) return Error{"negative sliding window " + std::to_string(w)};
    }
  }
  return ValidateKvMode(c.type, c.head_dim);
}

int KvLayerCells(const KvCacheConfig& c, int layer) {
  const int w = c.sliding_window.empty() ? 0 : c.sliding_window[layer];
  if (c.swa_full || w <= 0 || w >= c.n_ctx) return c.n_ctx;
  const int64_t ring =
      (static_cast<int64_t>(w) + kKvWindowSlack + kKvRingAlign - 1) / kKvRingAlign * kKvRingAlign;
  return ring < c.n_ctx ? static_cast<int>(ring) : c.n_ctx;
}

uint64_t KvCacheBytes(const KvCacheConfig& c) {
  uint64_t layer_cells = 0;              // cells per sequence and KV head, all layers
  for (int l = 0; l < c.n_layer; ++l) {  // each head's cells in whole tiles
    const uint64_t cells = KvLayerCells(c, l);
    layer_cells = SatAdd(layer_cells, (cells + kKvTileCells - 1) / kKvTileCells * kKvTileCells);
  }
  const uint64_t head_rows = SatMul(SatMul(layer_cells, c.n_seq), c.n_kv_heads);
  uint64_t per_row =
      KvRowBytes(KSpec(c.type).format, c.head_dim) + KvRowBytes(VSpec(c.type).format, c.head_dim);
  uint64_t extra = 0;
  if (KAnchored(c.type)) {
    per_row += 1;  // the anchor flag
    extra = SatMul(SatMul(static_cast<uint64_t>(c.n_seq) * c.n_layer, c.n_kv_heads),
                   static_cast<uint64_t>(c.head_dim) * sizeof(float));
  }
  if (KvModeOf(c.type).quantized && c.window > 0) {
    const int ring = std::min(c.window, c.n_ctx) + kKvWindowSlack;
    const uint64_t heads = SatMul(SatMul(static_cast<uint64_t>(c.n_seq), c.n_layer), c.n_kv_heads);
    extra =
        SatAdd(extra, SatMul(SatMul(heads, ring), 2 * KvRowBytes(KvRowFormat::kF16, c.head_dim)));
  }
  return SatAdd(SatMul(head_rows, per_row), extra);
}

KvCache::KvCache(const KvCacheConfig& config)
    : config_(config), k_spec_(KSpec(config.type)), v_spec_(VSpec(config.type)) {
  LAMINA_CHECK(ValidateKvConfig(config).ok());
  k_head_bytes_ = KvRowBytes(k_spec_.format, config.head_dim);
  v_head_bytes_ = KvRowBytes(v_spec_.format, config.head_dim);
  k_tiled_ = k_spec_.format == KvRowFormat::kInt8 || k_spec_.format == KvRowFormat::kQ4_0 ||
             k_spec_.format == KvRowFormat::kF16;
  cells_.resize(config.n_layer);
  head_cells_.resize(config.n_layer);
  layer_base_.resize(config.n_layer);
  for (int l = 0; l < config.n_layer; ++l) {
    cells_[l] = KvLayerCells(config, l);
    head_cells_[l] = (cells_[l] + kKvTileCells - 1) / kKvTileCells * kKvTileCells;
    layer_base_[l] = seq_cells_;
    seq_cells_ += static_cast<size_t>(head_cells_[l]) * config.n_kv_heads;
    if (cells_[l] < config.n_ctx) ring_cells_ = std::max(ring_cells_, cells_[l]);
  }
  ring_floor_.assign(static_cast<size_t>(config.n_seq) * config.n_layer, 0);
  const size_t head_rows = seq_cells_ * config.n_seq;
  k_ = CellBytes(HugePageAllocator<uint8_t>(config.huge_pages));
  v_ = CellBytes(HugePageAllocator<uint8_t>(config.huge_pages));
  k_.assign(head_rows * k_head_bytes_, 0);
  v_.assign(head_rows * v_head_bytes_, 0);
  lengths_.assign(static_cast<size_t>(config.n_seq) * config.n_layer, 0);
  if (KvModeOf(config.type).quantized && config.window > 0) {
    window_ = std::min(config.window, config.n_ctx);
    ring_ = window_ + kKvWindowSlack;
    ring_row_bytes_ = KvRowBytes(KvRowFormat::kF16, config.head_dim);
    const size_t ring_rows =
        static_cast<size_t>(config.n_seq) * config.n_layer * config.n_kv_heads * ring_;
    wk_.assign(ring_rows * ring_row_bytes_, 0);
    wv_.assign(ring_rows * ring_row_bytes_, 0);
    window_floor_.assign(static_cast<size_t>(config.n_seq) * config.n_layer, 0);
  }
  k_anchored_ = KAnchored(config.type);
  if (k_anchored_) {
    // An unusable rotary width (odd, or wider than the head) falls back to a plain offset.
    if (config_.rope.n_rot < 0 || config_.rope.n_rot > config.head_dim || config_.rope.n_rot % 2) {
      config_.rope.n_rot = 0;
    }
    const int nr = config_.rope.n_rot;
    if (nr > 0) {
      std::vector<float> at0(nr), at1(nr);
      RopeCache(config_.rope, 0, at0.data());
      RopeCache(config_.rope, 1, at1.data());
      anchor_mscale_ = at0[0] != 0.0f ? at0[0] : 1.0f;
      // Angles in double from each pair's step (RoPE's angles are linear in the position).
      const int n_runs = (config.n_ctx + kAnchorAngleRun - 1) / kAnchorAngleRun;
      anchor_run_cs_.resize(static_cast<size_t>(n_runs) * nr);
      anchor_offset_cs_.resize(static_cast<size_t>(nr) * kAnchorAngleRun);
      for (int j = 0; j < nr / 2; ++j) {
        const double theta = std::atan2(at1[2 * j + 1], at1[2 * j]);
        for (int r = 0; r < n_runs; ++r) {
          const double t = theta * r * kAnchorAngleRun;
          anchor_run_cs_[static_cast<size_t>(r) * nr + 2 * j] = static_cast<float>(std::cos(t));
          anchor_run_cs_[static_cast<size_t>(r) * nr + 2 * j + 1] = static_cast<float>(std::sin(t));
        }
        for (int k = 0; k < kAnchorAngleRun; ++k) {
          anchor_offset_cs_[(2 * j) * kAnchorAngleRun + k] =
              static_cast<float>(std::cos(theta * k));
          anchor_offset_cs_[(2 * j + 1) * kAnchorAngleRun + k] =
              static_cast<float>(std::sin(theta * k));
        }
      }
    }
    k_anchor_.assign(
        static_cast<size_t>(config.n_seq) * config.n_layer * config.n_kv_heads * config.head_dim,
        0.0f);
    k_anchor_flag_.assign(head_rows, 0);
  }
}

void KvCache::AnchorCosSin(int pair, int pos0, int n, float* cos_out, float* sin_out) const {
  const float* off = AnchorOffsetCosSin(pair);
  for (int i = 0; i < n; ++i) {
    const int p = pos0 + i, k = p % kAnchorAngleRun;
    const float* start = AnchorRunStart(p / kAnchorAngleRun) + 2 * pair;
    cos_out[i] = start[0] * off[k] - start[1] * off[kAnchorAngleRun + k];
    sin_out[i] = start[1] * off[k] + start[0] * off[kAnchorAngleRun + k];
  }
}

void KvCache::AnchorOffset(const float* anchor, int pos, float* out) const {
  std::copy_n(anchor, config_.head_dim, out);  // dimensions RoPE leaves alone
  for (int j = 0; j < config_.rope.n_rot / 2; ++j) {
    const int x = PairX(j), y = PairY(j);
    if (anchor[x] == 0.0f && anchor[y] == 0.0f) continue;  // a pair the anchor does not keep
    float c, s;
    AnchorCosSin(j, pos, 1, &c, &s);
    c *= anchor_mscale_;
    s *= anchor_mscale_;
    out[x] = anchor[x] * c - anchor[y] * s;
    out[y] = anchor[x] * s + anchor[y] * c;
  }
}

void KvCache::ReadHeadRows(int side, int layer, int seq, int head, int n, float* out) const {
  const KvSideSpec& spec = side == 0 ? k_spec_ : v_spec_;
  const int hd = config_.head_dim;
  const int cells = cells_[layer];
  for (int p0 = 0; p0 < n;) {  // runs within one turn of a ring
    const int p1 = std::min(n, (p0 / cells + 1) * cells);
    float* dst = out + static_cast<size_t>(p0) * hd;
    if (side == 0 && k_tiled_) {
      const KTileRef t = KTile(layer, seq, head, p0);
      DecodeKvTileCells(t.tile, t.cell, p1 - p0, hd, dst, k_spec_.format);
    } else {
      BestKvRowDecoder(spec.format)(
          side == 0 ? KHead(layer, seq, head, p0) : VHead(layer, seq, head, p0), p1 - p0, hd, dst);
    }
    p0 = p1;
  }
  if (spec.rotated) {
    for (int p = 0; p < n; ++p) InverseRotate(out + static_cast<size_t>(p) * hd, hd);
  }
  if (side != 0 || !k_anchored_) return;
  std::vector<float> offset(hd);  // [head_dim]
  for (int p = 0; p < n; ++p) {
    if (!*KAnchorFlags(layer, seq, head, p)) continue;
    AnchorOffset(KAnchor(layer, seq, head), p, offset.data());
    for (int e = 0; e < hd; ++e) out[static_cast<size_t>(p) * hd + e] += offset[e];
  }
}

void KvCache::KRow(int layer, int seq, int head, int pos, uint8_t* out) const {
  if (k_tiled_) {
    const KTileRef t = KTile(layer, seq, head, pos);
    UntileKvRow(t.tile, t.cell, config_.head_dim, out, k_spec_.format);
  } else {
    std::memcpy(out, KHead(layer, seq, head, pos), k_head_bytes_);
  }
}

void KvCache::StoreKRow(int layer, int seq, int head, int pos, const uint8_t* row) {
  const size_t at = HeadIndex(layer, seq, head, pos);
  if (k_tiled_) {
    const int cell = static_cast<int>(at % kKvTileCells);
    TileKvRow(row, config_.head_dim, k_.data() + (at - cell) * k_head_bytes_, cell, k_spec_.format);
  } else {
    std::memcpy(k_.data() + at * k_head_bytes_, row, k_head_bytes_);
  }
}

void KvCache::ZeroKCells(int layer, int seq, int head, int p0, int m) {
  if (!k_tiled_) {
    std::memset(k_.data() + HeadIndex(layer, seq, head, p0) * k_head_bytes_, 0, m * k_head_bytes_);
    return;
  }
  const std::vector<uint8_t> zero(k_head_bytes_, 0);  // [k_head_bytes_] an all-zero row
  for (int p = p0; p < p0 + m;) {
    const size_t at = HeadIndex(layer, seq, head, p);
    if (at % kKvTileCells == 0 && p + kKvTileCells <= p0 + m) {  // a whole tile
      std::memset(k_.data() + at * k_head_bytes_, 0, kKvTileCells * k_head_bytes_);
      p += kKvTileCells;
    } else {
      StoreKRow(layer, seq, head, p++, zero.data());
    }
  }
}

void KvCache::CopyKCells(int layer, int src_seq, int dst_seq, int head, int p0, int m) {
  if (!k_tiled_) {
    std::memcpy(k_.data() + HeadIndex(layer, dst_seq, head, p0) * k_head_bytes_,
                KHead(layer, src_seq, head, p0), m * k_head_bytes_);
    return;
  }
  std::vector<uint8_t> row(k_head_bytes_);  // [k_head_bytes_] one cell's row
  for (int p = p0; p < p0 + m;) {
    const size_t at = HeadIndex(layer, dst_seq, head, p);
    if (at % kKvTileCells == 0 && p + kKvTileCells <= p0 + m) {  // a whole tile
      std::memcpy(k_.data() + at * k_head_bytes_, KTile(layer, src_seq, head, p).tile,
                  kKvTileCells * k_head_bytes_);
      p += kKvTileCells;
    } else {
      KRow(layer, src_seq, head, p, row.data());
      StoreKRow(layer, dst_seq, head, p++, row.data());
    }
  }
}

double KvCache::BitsPerElement() const {
  const size_t flags = k_anchored_ ? config_.n_kv_heads : 0;
  return 8.0 * (k_row_bytes() + v_row_bytes() + flags) / (2.0 * row_elems());
}

size_t KvCache::BytesPerToken() const {
  const size_t flags = k_anchored_ ? config_.n_kv_heads : 0;
  int full_layers = 0;
  for (int l = 0; l < config_.n_layer; ++l) full_layers += ring_layer(l) ? 0 : 1;
  return (k_row_bytes() + v_row_bytes() + flags) * full_layers;
}

size_t KvCache::RingBytes() const {
  const size_t flags = k_anchored_ ? config_.n_kv_heads : 0;
  size_t cells = 0;  // ring cells per sequence, all ring layers
  for (int l = 0; l < config_.n_layer; ++l) cells += ring_layer(l) ? cells_[l] : 0;
  return (k_row_bytes() + v_row_bytes() + flags) * cells * config_.n_seq;
}

size_t KvCache::BytesTotal() const {
  return k_.size() + v_.size() + k_anchor_flag_.size() + k_anchor_.size() * sizeof(float) +
         WindowBytes();
}

int KvCache::ExactKeep(int seq, int n) const {
  if (n == 0) return n;
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    if (window_ > 0) {
      const int lo = std::max(window_floor_[Index(layer, seq)], Length(seq, layer) - ring_);
      if (lo > 0 && n - window_ < lo) return 0;
    }
    // The query at n reads cells n - sliding_window + 1 .. n - 1 of a ring layer.
    const int lo = RingFirstHeld(layer, seq);
    if (lo > 0 && n - sliding_window(layer) + 1 < lo) return 0;
  }
  return n;
}

void KvCache::EncodeHead(const KvSideSpec& spec, bool stochastic, int layer, int pos, int head,
                         const float* src, uint8_t* dst, float* tmp) const {
  const int hd = config_.head_dim;
  const float* x = src;
  if (spec.rotated) {
    std::copy_n(x, hd, tmp);
    Rotate(tmp, hd);
    x = tmp;
  }
  RoundingKey key{config_.seed, static_cast<uint32_t>(layer), static_cast<uint32_t>(pos),
                  static_cast<uint32_t>(head * hd)};
  EncodeKvRow(spec.format, x, hd, stochastic ? &key : nullptr, dst);
}

float KvCache::EncodedError(const KvSideSpec& spec, const uint8_t* row, const float* src,
                            float* tmp) const {
  const int hd = config_.head_dim;
  DecodeKvRow(spec.format, row, hd, tmp);
  if (spec.rotated) InverseRotate(tmp, hd);
  double err = 0;
  for (int e = 0; e < hd; ++e) err += static_cast<double>(tmp[e] - src[e]) * (tmp[e] - src[e]);
  return static_cast<float>(err);
}

void KvCache::EncodeAnchoredK(int layer, int seq, int pos, int head, const float* k, float* scratch,
                              uint8_t* alt, uint8_t* out) {
  const int hd = config_.head_dim;
  float* offset = scratch;        // [head_dim]
  float* residual = offset + hd;  // [head_dim]
  float* tmp = residual + hd;     // [head_dim]
  AnchorOffset(KAnchor(layer, seq, head), pos, offset);
  bool finite = true;  // an anchor restored from a file may be huge: then the plain form
  for (int e = 0; e < hd; ++e) {
    residual[e] = k[e] - offset[e];
    finite = finite && std::isfinite(residual[e]);
  }
  const size_t at = HeadIndex(layer, seq, head, pos);
  EncodeHead(k_spec_, /*stochastic=*/false, layer, pos, head, k, out, tmp);
  if (!finite) {
    k_anchor_flag_[at] = 0;
    return;
  }
  const float plain_error = EncodedError(k_spec_, out, k, tmp);
  EncodeHead(k_spec_, /*stochastic=*/false, layer, pos, head, residual, alt, tmp);
  const float anchored_error = EncodedError(k_spec_, alt, residual, tmp);
  // Ties go to the anchored form: the first cell's residual is zero and encodes exactly.
  const bool anchored = anchored_error <= plain_error;
  if (anchored) std::memcpy(out, alt, k_head_bytes_);
  k_anchor_flag_[at] = anchored ? 1 : 0;
}

void KvCache::ZeroCells(int layer, int seq, int pos0, int n) {
  const int cells = cells_[layer];
  n = std::min(n, cells);                // a ring's slots, each once
  for (int p0 = pos0; p0 < pos0 + n;) {  // runs within one turn of a ring
    const int m = std::min(pos0 + n, (p0 / cells + 1) * cells) - p0;
    for (int h = 0; h < config_.n_kv_heads; ++h) {
      ZeroKCells(layer, seq, h, p0, m);
      std::memset(v_.data() + HeadIndex(layer, seq, h, p0) * v_head_bytes_, 0, m * v_head_bytes_);
      if (k_anchored_) std::memset(k_anchor_flag_.data() + HeadIndex(layer, seq, h, p0), 0, m);
    }
    p0 += m;
  }
}

void KvCache::WriteWindowRow(int side, int layer, int seq, int head, int pos, const float* src,
                             float* tmp) {
  const int hd = config_.head_dim;
  std::copy_n(src, hd, tmp);
  if ((side == 0 ? k_spec_ : v_spec_).rotated) Rotate(tmp, hd);
  uint8_t* dst =
      (side == 0 ? wk_ : wv_).data() + RingIndex(layer, seq, head, pos) * ring_row_bytes_;
  EncodeKvRow(KvRowFormat::kF16, tmp, hd, nullptr, dst);
}

namespace {

// What a write observer (write_observer.h) made of one write.
struct ObservedWrite {
  bool store = true;        // false: the observer vetoed the write
  std::vector<float> k, v;  // [n, row_elems] each: the rows to store instead of the given ones
  // Planted window faults, asked once per single-token write to a cache with a window.
  bool skip_windowed_encode = false;
  bool encode_windowed_twice = false;
};

ObservedWrite ObserveWrite(const WriteObserver& observer, const KvWriteSpan& span, const float* k,
                           const float* v, bool windowed) {
  ObservedWrite w;
  const int64_t n_values = static_cast<int64_t>(span.n) * span.n_kv_heads * span.head_dim;
  w.k.assign(k, k + n_values);
  w.v.assign(v, v + n_values);
  if (!observer.OnWrite(span, w.k.data(), w.v.data())) {
    w.store = false;
    return w;
  }
  if (span.n == 1 && windowed) {
    w.skip_windowed_encode = observer.SkipWindowedEncode(span);
    w.encode_windowed_twice = observer.EncodeWindowedTwice(span);
  }
  return w;
}

// (*finite)[i]: whether rows i of k and v (n rows of re values each) are all finite. Returns
// the first row that is not, or -1.
int MarkFiniteRows(const float* k, const float* v, int n, int re, std::vector<char>* finite) {
  int first_nonfinite = -1;
  for (int i = 0; i < n; ++i) {
    const float* krow = k + static_cast<int64_t>(i) * re;
    const float* vrow = v + static_cast<int64_t>(i) * re;
    char& ok = (*finite)[i];
    for (int e = 0; e < re && ok; ++e) ok = std::isfinite(krow[e]) && std::isfinite(vrow[e]);
    if (!ok && first_nonfinite < 0) first_nonfinite = i;
  }
  return first_nonfinite;
}

// Sets one head's anchor a [head_dim] from the first cell's key k [head_dim] (nullptr for a
// non-finite cell: zeros), rotated back to position 0 (RoPE at 0 only scales the rotated
// dimensions by the attention factor).
void SetAnchor(const KvCache& cache, const float* k, float* a) {
  const int hd = cache.config().head_dim;
  const int n_rot = cache.config().rope.n_rot;
  for (int e = 0; e < hd; ++e) {
    const float x = k != nullptr ? k[e] : 0.0f;
    a[e] = e < n_rot ? x / cache.anchor_mscale() : x;
  }
  // Keep the kAnchorMaxPairs rotated pairs of largest energy (ties: the lower pair).
  const int n_pairs = n_rot / 2;
  if (n_pairs > kAnchorMaxPairs) {
    std::vector<int> order(n_pairs);
    for (int j = 0; j < n_pairs; ++j) order[j] = j;
    auto energy = [&](int j) {
      const int x = cache.PairX(j), y = cache.PairY(j);
      return a[x] * a[x] + a[y] * a[y];
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](int i, int j) { return energy(i) > energy(j); });
    for (int r = kAnchorMaxPairs; r < n_pairs; ++r) {
      a[cache.PairX(order[r])] = a[cache.PairY(order[r])] = 0.0f;
    }
  }
}

}  // namespace

void KvCache::Write(int layer, int seq, int pos0, int n, const float* k, const float* v,
                    ThreadPool* pool) {
  LAMINA_CHECK(layer >= 0 && layer < config_.n_layer);
  LAMINA_CHECK(seq >= 0 && seq < config_.n_seq);
  int& length = lengths_[Index(layer, seq)];
  LAMINA_CHECK(pos0 >= 0 && pos0 <= length && n >= 0 && pos0 + n <= config_.n_ctx);
  const int re = row_elems();
  ObservedWrite observed;  // its rows only with an observer
  if (const WriteObserver* observer = config_.write_observer; observer != nullptr) {
    const KvWriteSpan span{layer, seq, pos0, n, config_.n_kv_heads, config_.head_dim};
    observed = ObserveWrite(*observer, span, k, v, window_ > 0);
    if (!observed.store) {
      length = std::max(length, pos0 + n);
      return;
    }
    k = observed.k.data();
    v = observed.v.data();
  }
  const bool skip_windowed_encode = observed.skip_windowed_encode;
  const bool encode_windowed_twice = observed.encode_windowed_twice;
  // Non-finite rows are found first, in order, so the reported position is the first one.
  std::vector<char> finite(n, 1);
  if (const int bad = MarkFiniteRows(k, v, n, re, &finite); bad >= 0 && nonfinite_error_.empty()) {
    nonfinite_error_ = "non-finite K or V value at layer " + std::to_string(layer) + ", position " +
                       std::to_string(pos0 + bad) + "; the cell was not stored";
  }
  const bool v_stochastic = config_.v_rounding == KvRounding::kStochastic;
  const int hd = config_.head_dim;
  const int n_heads = config_.n_kv_heads;
  if (k_anchored_ && pos0 == 0 && n > 0) {
    // The first cell fixes the anchor.
    for (int h = 0; h < n_heads; ++h) {
      SetAnchor(*this, finite[0] ? k + h * hd : nullptr,
                k_anchor_.data() + (Index(layer, seq) * n_heads + h) * hd);
    }
  }
  const int first_stored = pos0 + n - cells_[layer];
  // Work items are (row, head) pairs, so even a single decoded token's heads spread over the pool.
  auto encode = [&](int64_t item0, int64_t item1) {
    std::vector<float> tmp(hd);                // [head_dim] rotation scratch
    std::vector<uint8_t> krow(k_head_bytes_);  // [k_head_bytes_] one encoded key row
    // anchored keys: [3 * head_dim + n_rot] scratch and one alternative encoded row
    std::vector<float> anchor_scratch(k_anchored_ ? 3 * hd : 0);
    std::vector<uint8_t> alt(k_anchored_ ? k_head_bytes_ : 0);
    for (int64_t item = item0; item < item1; ++item) {
      const int64_t i = item / n_heads;
      const int h = static_cast<int>(item % n_heads);
      const int pos = pos0 + static_cast<int>(i);
      // A ring layer stores only the last layer_cells positions of the span (earlier ones would
      // share their slots).
      if (pos < first_stored) continue;
      // Only the last ring_ positions of the span keep an exact copy (earlier ones would share
      // their slots).
      const bool in_ring = window_ > 0 && pos >= pos0 + n - ring_;
      if (!finite[i]) {
        if (h == 0) ZeroCells(layer, seq, pos, 1);
        if (in_ring) {
          std::memset(wk_.data() + RingIndex(layer, seq, h, pos) * ring_row_bytes_, 0,
                      ring_row_bytes_);
          std::memset(wv_.data() + RingIndex(layer, seq, h, pos) * ring_row_bytes_, 0,
                      ring_row_bytes_);
        }
        continue;
      }
      if (in_ring) {
        WriteWindowRow(0, layer, seq, h, pos, k + i * re + h * hd, tmp.data());
        WriteWindowRow(1, layer, seq, h, pos, v + i * re + h * hd, tmp.data());
        if (skip_windowed_encode) continue;
      }
      const float* vrow = v + i * re;
      // Encoded as a row, then stored into its row or tile slot.
      if (k_anchored_) {
        EncodeAnchoredK(layer, seq, pos, h, k + i * re + h * hd, anchor_scratch.data(), alt.data(),
                        krow.data());
      } else {
        EncodeHead(k_spec_, /*stochastic=*/false, layer, pos, h, k + i * re + h * hd, krow.data(),
                   tmp.data());
      }
      StoreKRow(layer, seq, h, pos, krow.data());
      EncodeHead(v_spec_, v_stochastic, layer, pos, h, vrow + h * hd,
                 v_.data() + HeadIndex(layer, seq, h, pos) * v_head_bytes_, tmp.data());
      if (in_ring && encode_windowed_twice) {
        // The planted fault: the cell is encoded a second time, from its own decoded form.
        uint8_t* slot = v_.data() + HeadIndex(layer, seq, h, pos) * v_head_bytes_;
        DecodeKvRow(v_spec_.format, slot, hd, tmp.data());
        EncodeKvRow(v_spec_.format, tmp.data(), hd, nullptr, slot);
      }
    }
  };
  const int64_t n_items = static_cast<int64_t>(n) * n_heads;
  // A decode step's or a short window's few rows are encoded inline: splitting them over the
  // pool costs a fork and join (two threads waking on each other) for microseconds of work.
  constexpr int64_t kMinParallelElems = 4096;
  if (pool != nullptr && n_items > 1 && n_items * config_.head_dim >= kMinParallelElems) {
    pool->ParallelFor(n_items, 1, encode);
  } else {
    encode(0, n_items);
  }
  length = std::max(length, pos0 + n);
}

void KvCache::Truncate(int seq, int n_keep) {
  LAMINA_CHECK(seq >= 0 && seq < config_.n_seq && n_keep >= 0);
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    int& length = lengths_[Index(layer, seq)];
    if (n_keep >= length) continue;
    // Zero the dropped cells so storage is a pure function of the surviving history (of a
    // ring, the dropped cells it holds; it then holds [length - cells, n_keep) at most).
    if (ring_layer(layer)) {
      const int cells = cells_[layer];
      const int from = std::max(n_keep, length - cells);
      ZeroCells(layer, seq, from, length - from);
      int& floor = ring_floor_[Index(layer, seq)];
      floor = n_keep == 0 ? 0 : std::min(std::max(floor, length - cells), n_keep);
    } else {
      ZeroCells(layer, seq, n_keep, length - n_keep);
    }
    if (window_ > 0) {
      int& floor = window_floor_[Index(layer, seq)];
      for (int p = std::max(n_keep, length - ring_); p < length; ++p) {
        for (int h = 0; h < config_.n_kv_heads; ++h) {
          std::memset(wk_.data() + RingIndex(layer, seq, h, p) * ring_row_bytes_, 0,
                      ring_row_bytes_);
          std::memset(wv_.data() + RingIndex(layer, seq, h, p) * ring_row_bytes_, 0,
                      ring_row_bytes_);
        }
      }
      // The ring still holds positions [length - ring_, n_keep); a deeper cut loses some.
      floor = n_keep == 0 ? 0 : std::min(std::max(floor, length - ring_), n_keep);
    }
    length = n_keep;
    if (k_anchored_ && n_keep == 0) {
      std::fill_n(k_anchor_.begin() + Index(layer, seq) * row_elems(), row_elems(), 0.0f);
    }
  }
}

uint64_t KvCache::SequenceStateBytes(int n) const {
  n = std::max(0, n);
  const uint64_t per_cell = k_head_bytes_ + v_head_bytes_ + (k_anchored_ ? 1 : 0);
  uint64_t cells = 0;  // state cells per KV head, all layers
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    cells += static_cast<uint64_t>(n - StateFirstCell(layer, n));
  }
  int ring_layers = 0;
  for (int layer = 0; layer < config_.n_layer; ++layer) ring_layers += ring_layer(layer) ? 1 : 0;
  const uint64_t heads = static_cast<uint64_t>(config_.n_layer) * config_.n_kv_heads;
  const uint64_t anchors =
      k_anchored_ ? heads * static_cast<uint64_t>(config_.head_dim) * sizeof(float) : 0;
  uint64_t window = 0;
  if (window_ > 0) {
    const uint64_t m = static_cast<uint64_t>(std::min(ring_, n));
    window = config_.n_layer * sizeof(int32_t) + SatMul(SatMul(heads, m), 2 * ring_row_bytes_);
  }
  const uint64_t encoded = SatAdd(SatMul(SatMul(cells, config_.n_kv_heads), per_cell),
                                  static_cast<uint64_t>(ring_layers) * sizeof(int32_t));
  return SatAdd(SatAdd(encoded, anchors), window);
}

void KvCache::ExportSequence(int seq, int n, uint8_t* out) const {
  LAMINA_CHECK(seq >= 0 && seq < config_.n_seq && n >= 0 && n <= config_.n_ctx);
  const std::vector<uint8_t> zeros(std::max(k_head_bytes_, v_head_bytes_), 0);
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    LAMINA_CHECK(Length(seq, layer) >= n);
    const int f = StateFirstCell(layer, n);
    const int32_t m0 = CellsFirstHeld(layer, seq, n);  // 0 for a layer that keeps every cell
    if (ring_layer(layer)) {
      std::memcpy(out, &m0, sizeof(m0));
      out += sizeof(m0);
    }
    for (int h = 0; h < config_.n_kv_heads; ++h) {
      for (int p = f; p < n; ++p, out += k_head_bytes_) {  // rows, whatever the storage
        if (p >= m0) {
          KRow(layer, seq, h, p, out);
        } else {
          std::memcpy(out, zeros.data(), k_head_bytes_);
        }
      }
      for (int p = f; p < n; ++p, out += v_head_bytes_) {
        std::memcpy(out, p >= m0 ? VHead(layer, seq, h, p) : zeros.data(), v_head_bytes_);
      }
      if (k_anchored_) {
        for (int p = f; p < n; ++p, ++out) *out = p >= m0 ? *KAnchorFlags(layer, seq, h, p) : 0;
      }
    }
  }
  if (k_anchored_) {
    for (int layer = 0; layer < config_.n_layer; ++layer) {
      const size_t bytes = static_cast<size_t>(row_elems()) * sizeof(float);
      std::memcpy(out, k_anchor_.data() + Index(layer, seq) * row_elems(), bytes);
      out += bytes;
    }
  }
  if (window_ > 0) {
    const int m = std::min(ring_, n);
    for (int layer = 0; layer < config_.n_layer; ++layer) {
      const int32_t m0 = WindowFirstHeld(layer, seq, n);
      std::memcpy(out, &m0, sizeof(m0));
      out += sizeof(m0);
      for (int h = 0; h < config_.n_kv_heads; ++h) {
        for (int side = 0; side < 2; ++side) {
          for (int p = n - m; p < n; ++p) {
            const uint8_t* row = side == 0 ? WindowK(layer, seq, h, p) : WindowV(layer, seq, h, p);
            if (p >= m0) {
              std::memcpy(out, row, ring_row_bytes_);
            } else {
              std::memset(out, 0, ring_row_bytes_);
            }
            out += ring_row_bytes_;
          }
        }
      }
    }
  }
}

void KvCache::ImportSequence(int seq, int n, const uint8_t* in) {
  LAMINA_CHECK(seq >= 0 && seq < config_.n_seq && n >= 0 && n <= config_.n_ctx);
  Truncate(seq, 0);
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    const int f = StateFirstCell(layer, n);
    if (ring_layer(layer)) {
      int32_t m0;
      std::memcpy(&m0, in, sizeof(m0));
      in += sizeof(m0);
      ring_floor_[Index(layer, seq)] = std::clamp(static_cast<int>(m0), f, n);
    }
    for (int h = 0; h < config_.n_kv_heads; ++h) {
      for (int p = f; p < n; ++p, in += k_head_bytes_) StoreKRow(layer, seq, h, p, in);
      for (int p = f; p < n; ++p, in += v_head_bytes_) {
        std::memcpy(v_.data() + HeadIndex(layer, seq, h, p) * v_head_bytes_, in, v_head_bytes_);
      }
      if (k_anchored_) {
        for (int p = f; p < n; ++p, ++in) k_anchor_flag_[HeadIndex(layer, seq, h, p)] = *in;
      }
    }
    lengths_[Index(layer, seq)] = n;
  }
  if (k_anchored_) {
    for (int layer = 0; layer < config_.n_layer; ++layer) {
      const size_t bytes = static_cast<size_t>(row_elems()) * sizeof(float);
      std::memcpy(k_anchor_.data() + Index(layer, seq) * row_elems(), in, bytes);
      in += bytes;
    }
  }
  if (window_ > 0) {
    const int m = std::min(ring_, n);
    for (int layer = 0; layer < config_.n_layer; ++layer) {
      int32_t m0;
      std::memcpy(&m0, in, sizeof(m0));
      in += sizeof(m0);
      window_floor_[Index(layer, seq)] = std::max(n - m, std::min(n, static_cast<int>(m0)));
      for (int h = 0; h < config_.n_kv_heads; ++h) {
        for (int side = 0; side < 2; ++side) {
          for (int p = n - m; p < n; ++p) {
            uint8_t* base = (side == 0 ? wk_ : wv_).data();
            std::memcpy(base + RingIndex(layer, seq, h, p) * ring_row_bytes_, in, ring_row_bytes_);
            in += ring_row_bytes_;
          }
        }
      }
    }
  }
}

Status KvCache::CheckSequenceState(int n, const uint8_t* in) const {
  const int hd = config_.head_dim;
  std::vector<float> row(hd);  // [head_dim] one decoded head row
  auto where = [](int layer, int h, int cell) {
    return "layer " + std::to_string(layer) + ", KV head " + std::to_string(h) + ", cell " +
           std::to_string(cell);
  };
  auto has_nan = [&](KvRowFormat format, const uint8_t* bytes) {
    DecodeKvRow(format, bytes, hd, row.data());
    return std::any_of(row.begin(), row.end(), [](float x) { return std::isnan(x); });
  };
  auto zero = [](const uint8_t* bytes, size_t size) {
    return std::all_of(bytes, bytes + size, [](uint8_t x) { return x == 0; });
  };
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    const int f = StateFirstCell(layer, n);
    int32_t m0 = 0;  // rows before it are zeros (a ring layer's cells it no longer held)
    if (ring_layer(layer)) {
      std::memcpy(&m0, in, sizeof(m0));
      in += sizeof(m0);
      if (m0 < f || m0 > n) {
        return Error{"sliding-window ring of layer " + std::to_string(layer) + " starts at cell " +
                     std::to_string(m0) + ", outside [" + std::to_string(f) + ", " +
                     std::to_string(n) + "]"};
      }
    }
    for (int h = 0; h < config_.n_kv_heads; ++h) {
      for (int c = f; c < n; ++c, in += k_head_bytes_) {
        if (c < m0 ? !zero(in, k_head_bytes_) : has_nan(k_spec_.format, in)) {
          return Error{
              std::string(c < m0 ? "K row before the ring's start holds data" : "K row holds NaN") +
              " at " + where(layer, h, c)};
        }
      }
      for (int c = f; c < n; ++c, in += v_head_bytes_) {
        if (c < m0 ? !zero(in, v_head_bytes_) : has_nan(v_spec_.format, in)) {
          return Error{
              std::string(c < m0 ? "V row before the ring's start holds data" : "V row holds NaN") +
              " at " + where(layer, h, c)};
        }
      }
      if (k_anchored_) {
        for (int c = f; c < n; ++c, ++in) {
          if (*in > (c < m0 ? 0 : 1))
            return Error{"anchor flag " + std::to_string(*in) + " at " + where(layer, h, c)};
        }
      }
    }
  }
  if (k_anchored_) {
    for (int layer = 0; layer < config_.n_layer; ++layer) {
      for (int e = 0; e < row_elems(); ++e, in += sizeof(float)) {
        float a;
        std::memcpy(&a, in, sizeof(float));
        if (!std::isfinite(a)) {
          return Error{"non-finite key anchor in layer " + std::to_string(layer) + " (element " +
                       std::to_string(e) + ")"};
        }
      }
    }
  }
  if (window_ > 0) {
    // What ExportSequence writes: per layer the first position the ring holds, in
    // [n - m, n], then each head's K and V copies of the last m positions, zeros below it.
    const int m = std::min(ring_, n);
    for (int layer = 0; layer < config_.n_layer; ++layer) {
      int32_t m0;
      std::memcpy(&m0, in, sizeof(m0));
      in += sizeof(m0);
      if (m0 < n - m || m0 > n) {
        return Error{"KV window of layer " + std::to_string(layer) + " starts at cell " +
                     std::to_string(m0) + ", outside [" + std::to_string(n - m) + ", " +
                     std::to_string(n) + "]"};
      }
      for (int h = 0; h < config_.n_kv_heads; ++h) {
        for (int side = 0; side < 2; ++side) {
          for (int p = n - m; p < n; ++p, in += ring_row_bytes_) {
            const char* what = side == 0 ? "exact K copy" : "exact V copy";
            if (p < m0) {
              if (std::any_of(in, in + ring_row_bytes_, [](uint8_t b) { return b != 0; })) {
                return Error{std::string(what) + " before the window's start holds data at " +
                             where(layer, h, p)};
              }
            } else if (has_nan(KvRowFormat::kF16, in)) {
              return Error{std::string(what) + " holds NaN at " + where(layer, h, p)};
            }
          }
        }
      }
    }
  }
  return Status::Ok();
}

void KvCache::CopyPrefix(int src_seq, int dst_seq, int n) {
  LAMINA_CHECK(src_seq >= 0 && src_seq < config_.n_seq && dst_seq >= 0 && dst_seq < config_.n_seq);
  if (src_seq == dst_seq) return;
  Truncate(dst_seq, 0);
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    LAMINA_CHECK(n >= 0 && n <= Length(src_seq, layer));
    // A ring layer: the cells src still holds, each in its slot (which is dst's slot too).
    const int c0 = CellsFirstHeld(layer, src_seq, n);
    if (ring_layer(layer)) ring_floor_[Index(layer, dst_seq)] = c0;
    for (int p0 = c0; p0 < n;) {  // runs within one turn of a ring
      const int m = std::min(n, (p0 / cells_[layer] + 1) * cells_[layer]) - p0;
      for (int h = 0; h < config_.n_kv_heads; ++h) {
        CopyKCells(layer, src_seq, dst_seq, h, p0, m);
        std::memcpy(v_.data() + HeadIndex(layer, dst_seq, h, p0) * v_head_bytes_,
                    VHead(layer, src_seq, h, p0), v_head_bytes_ * m);
        if (k_anchored_) {
          std::memcpy(k_anchor_flag_.data() + HeadIndex(layer, dst_seq, h, p0),
                      KAnchorFlags(layer, src_seq, h, p0), m);
        }
      }
      p0 += m;
    }
    if (k_anchored_ && n > 0) {
      std::copy_n(k_anchor_.begin() + Index(layer, src_seq) * row_elems(), row_elems(),
                  k_anchor_.begin() + Index(layer, dst_seq) * row_elems());
    }
    if (window_ > 0) {
      const int m0 = WindowFirstHeld(layer, src_seq, n);
      for (int h = 0; h < config_.n_kv_heads; ++h) {
        for (int p = m0; p < n; ++p) {
          std::memcpy(wk_.data() + RingIndex(layer, dst_seq, h, p) * ring_row_bytes_,
                      WindowK(layer, src_seq, h, p), ring_row_bytes_);
          std::memcpy(wv_.data() + RingIndex(layer, dst_seq, h, p) * ring_row_bytes_,
                      WindowV(layer, src_seq, h, p), ring_row_bytes_);
        }
      }
      window_floor_[Index(layer, dst_seq)] = m0;
    }
    lengths_[Index(layer, dst_seq)] = n;
  }
}

}  // namespace lamina
