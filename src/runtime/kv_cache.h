// The KV cache. One write operation (Write) is the only code that touches cell storage: every
// path — prompt batch, single-token decode, verify windows, several sequences — goes through
// it, so all paths produce identical bytes by construction. Truncate and CopyPrefix are the
// other mutations. Attention reads encoded head rows through KHead/VHead and the row formats,
// and f16, int8 and q4_0 keys through KTile: they are stored as tiles of 16 cells (kv_format.h),
// which the writer fills slot by slot from each cell's row, so every path still stores the same
// bytes.
//
// Modes (K | V): f32 | f32, f16 | f16, int8 | int8, q4_0 rotated | q4_0 rotated,
// k8v4 = int8 unrotated | q4_0 rotated. Formats are defined in kernels/kv_format.h.
//
// Anchored keys (q4_0 mode): trained models' keys share a large per-channel component that a
// 4-bit block spends its range on. The first cell of a sequence fixes an anchor a per layer and
// KV head (its key, rotated back to position 0); a key cell at position p may then store
// k - R(p) a instead of k, R(p) being the model's RoPE at p, so the offset follows the keys'
// rotation. The writer encodes both, keeps the one with the smaller error and records the choice
// in a per-cell flag; attention adds q . R(p) a back to the score of every flagged cell, so
// the result is exact up to the quantization of what is stored.
//
// Sliding-window layers (KvCacheConfig::sliding_window, unless swa_full) keep a ring of their
// recent cells instead of all n_ctx: a query at p reads keys p - window + 1 .. p only, so the
// layer stores layer_cells() = window + kKvWindowSlack cells (rounded up to kKvRingAlign) per
// sequence and KV head, position p in slot p % layer_cells(). The writer, Truncate, CopyPrefix
// and the accessors index through the ring; ExactKeep reports the prefixes a ring can no
// longer serve (their window's cells were overwritten), so callers evaluate those again.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/kv_format.h"
#include "kernels/ops.h"
#include "runtime/write_observer.h"
#include "util/huge_pages.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace lamina {

// The KV modes, in the order of their rows in kKvModes (the enumerators are stored in session
// files: append, never reorder).
enum class KvType { kF32, kF16, kInt8, kQ4_0, kK8V4, kK8V4Nl };

enum class KvRounding { kNearest, kStochastic };
Result<KvRounding> ParseKvRounding(const std::string& name);
const char* KvRoundingName(KvRounding rounding);

struct KvSideSpec {
  KvRowFormat format;
  bool rotated;  // Walsh-Hadamard rotated before encoding (the query, or the output, follows)
};

// One row per KV mode: everything the cache, attention, the CLI, session files and the probe
// know about a mode. A new mode is one row here (and its enumerator above); nothing else
// switches on the mode.
struct KvMode {
  KvType type;
  const char* name;  // as --kv spells it
  KvSideSpec k;      // key head rows (after RoPE)
  KvSideSpec v;      // value head rows
  bool k_anchored;   // keys stored relative to the sequence's anchor, with a flag per cell
  bool quantized;    // lossy: takes --kv-v-round, and the probe crosses it with the roundings
  double bits;       // bits per element (K + V) / 2 at head_dim a multiple of 32, flags excluded
  int window;        // default recent full-precision window (cells; --kv-window), 0 if lossless
};

// Row sides: a format, and whether it is rotated first.
inline constexpr KvSideSpec kSideF32{KvRowFormat::kF32, false};
inline constexpr KvSideSpec kSideF16{KvRowFormat::kF16, false};
inline constexpr KvSideSpec kSideInt8{KvRowFormat::kInt8, false};
inline constexpr KvSideSpec kSideQ4_0Rotated{KvRowFormat::kQ4_0, true};
inline constexpr KvSideSpec kSideQ4NlRotated{KvRowFormat::kQ4Nl, true};

// clang-format off
inline constexpr KvMode kKvModes[] = {
    // type         name    K                  V                  anchored lossy  bits  window
    {KvType::kF32,  "f32",  kSideF32,          kSideF32,          false,   false, 32.0, 0},
    {KvType::kF16,  "f16",  kSideF16,          kSideF16,          false,   false, 16.0, 0},
    {KvType::kInt8, "int8", kSideInt8,         kSideInt8,         false,   true,  8.5,  32},
    {KvType::kQ4_0, "q4_0", kSideQ4_0Rotated,  kSideQ4_0Rotated,  true,    true,  4.5,  32},
    {KvType::kK8V4, "k8v4", kSideInt8,         kSideQ4_0Rotated,  false,   true,  6.5,  32},
    // k8v4 with Lloyd-Max levels for the rotated V rows (kv_format.h, q4_nl)
    {KvType::kK8V4Nl, "k8v4nl", kSideInt8,     kSideQ4NlRotated,  false,   true,  6.5,  32},
};
// clang-format on
inline constexpr int kKvModeCount = static_cast<int>(std::size(kKvModes));

constexpr bool KvModesInEnumOrder() {
  for (int i = 0; i < kKvModeCount; ++i) {
    if (static_cast<int>(kKvModes[i].type) != i) return false;
  }
  return true;
}
static_assert(KvModesInEnumOrder(), "kKvModes rows must follow the KvType enumerators");

// The row of a mode.
constexpr const KvMode& KvModeOf(KvType type) { return kKvModes[static_cast<int>(type)]; }
inline const char* KvTypeName(KvType type) { return KvModeOf(type).name; }
// The mode named `name` (a row's name); the error lists the names.
Result<KvType> ParseKvType(const std::string& name);
// "f32, f16, int8, q4_0, k8v4 or k8v4nl": the names of every row, for help texts and errors.
std::string KvModeNames();
// The one check of a mode against a model: whether its K and V formats can hold head_dim; the
// error names the mode, the head_dim and what the mode needs.
Status ValidateKvMode(KvType type, int head_dim);

inline KvSideSpec KSpec(KvType type) { return KvModeOf(type).k; }
inline KvSideSpec VSpec(KvType type) { return KvModeOf(type).v; }

// The recent full-precision window (lossy modes): a query at position t reads cells
// [t - window + 1, t] from an exact f16 copy (in the side's rotated frame) and older cells from
// the encoded storage. Every cell is encoded by the writer when it is written, so the encoded
// storage is the same with or without a window; the copy is a ring of window + kKvWindowSlack
// cells per (sequence, layer, KV head), position p in slot p % ring. The slack lets a Truncate
// move back by up to kKvWindowSlack cells (rejected drafts) and a batch write up to that many
// cells of one sequence before attention reads them (the session splits longer batches).
inline constexpr int kKvWindowSlack = 64;
// A sliding-window layer's ring holds a multiple of this many cells, so that attention's
// tiles (kCellTile cells at multiples of it) never wrap around the ring.
inline constexpr int kKvRingAlign = 64;

struct KvCacheConfig {
  int n_layer = 0;
  int n_ctx = 0;  // cells per sequence
  int n_kv_heads = 0;
  int head_dim = 0;
  int n_seq = 1;
  KvType type = KvType::kF16;
  KvRounding v_rounding = KvRounding::kNearest;
  uint64_t seed = 0;  // keys stochastic rounding
  // The model's RoPE, which anchored keys' offsets follow (n_rot == 0: a plain offset).
  RopeParams rope;
  // Optional hook of planted faults (OnWrite, the window's; write_observer.h); not owned, must
  // outlive the cache. nullptr: none, and Write does no extra work.
  const WriteObserver* write_observer = nullptr;
  // Recent cells read from an exact copy (see kKvWindowSlack); 0: none. Lossless modes keep
  // no copy whatever this says (window() is 0).
  int window = 0;
  // Per layer ([n_layer], or empty for none): the layer's sliding attention window (0: the
  // layer attends to every cell). A sliding-window layer keeps a ring of its recent cells (see
  // the top of this file) unless swa_full, or unless the ring would not be smaller than n_ctx.
  std::vector<int> sliding_window;
  bool swa_full = false;  // keep every cell of sliding-window layers (--swa-full)
  // The cells' arena in transparent huge pages where the kernel gives them (util/huge_pages.h);
  // false: ordinary pages (the same bytes; for measuring the difference).
  bool huge_pages = true;
};

// Cells per sequence and KV head that layer `layer` of a cache with this config stores: n_ctx,
// or a sliding-window layer's ring (window + kKvWindowSlack rounded up to kKvRingAlign) when
// that is smaller.
int KvLayerCells(const KvCacheConfig& config, int layer);

// Whether the mode stores anchored keys (see above): q4_0 only.
inline bool KAnchored(KvType type) { return KvModeOf(type).k_anchored; }
// Positions per anchor-angle run: a position's angle is composed from the exact angle at the
// start of its run and the exact angle of its offset within the run (both tabulated once).
inline constexpr int kAnchorAngleRun = 64;
// Rotated pairs an anchor keeps (those of largest energy in it; the others are zeroed): the
// score correction costs two multiply-adds per kept pair, cell and query.
inline constexpr int kAnchorMaxPairs = 8;

// Checks the shape and the mode (ValidateKvMode); the error says why not.
Status ValidateKvConfig(const KvCacheConfig& config);

// Bytes a KvCache with this (valid) config allocates for its cells, anchors and flags,
// computed without allocating (saturating at UINT64_MAX), for the memory guard.
uint64_t KvCacheBytes(const KvCacheConfig& config);

class KvCache {
 public:
  // The config must pass ValidateKvConfig (checked).
  explicit KvCache(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  const KvSideSpec& k_spec() const { return k_spec_; }
  const KvSideSpec& v_spec() const { return v_spec_; }
  int row_elems() const { return config_.n_kv_heads * config_.head_dim; }
  double BitsPerElement() const;  // (K + V) / 2, scales and anchor flags included
  // K + V (and anchor flags) per cell of one sequence, over the layers that keep every cell
  // (ring layers cost a fixed RingBytes() instead).
  size_t BytesPerToken() const;
  // The cells, flags, anchors and exact copies of all sequences, as allocated.
  size_t BytesTotal() const;
  // Cells and flags of the sliding-window layers' rings, all sequences (0 without rings).
  size_t RingBytes() const;

  // The single writer: K and V rows for positions [pos0, pos0 + n) of sequence `seq` in
  // `layer`. k, v: [n, n_kv_heads * head_dim] f32 (k after RoPE). Positions must continue the
  // sequence (pos0 <= Length(seq, layer)), so rewriting after Truncate is allowed.
  // Writing position 0 sets the sequence's key anchor (q4_0); cells past the written span, if
  // any, belong to an older history and are only meaningful after they are rewritten too.
  // Non-finite input is not stored: the cells are written as zeros and the first such event is
  // kept in nonfinite_error() for the session to report.
  // The encoding of the n rows runs on `pool` when given (each row lands in its own bytes, so
  // the result is the same on any number of threads). Calls for different sequences may run
  // at the same time (a decode step's sequences spread over threads) when no write observer is
  // set and every row is finite: a sequence's cells, window copies, ring, length and anchor are
  // its own, and only a non-finite row or an observer touches state the sequences share.
  void Write(int layer, int seq, int pos0, int n, const float* k, const float* v,
             ThreadPool* pool = nullptr);

  // Drops cells at positions >= n_keep in every layer (rollback of rejected tokens). With a
  // window, cells before n_keep whose exact copy the ring no longer holds (a cut more than
  // kKvWindowSlack cells back) are read from their encoded form until they leave the window;
  // a sliding-window ring no longer holds them at all (ExactKeep says where that matters).
  void Truncate(int seq, int n_keep);
  // Makes dst's first n cells a copy of src's (every layer; of a ring layer, the cells src
  // still holds).
  void CopyPrefix(int src_seq, int dst_seq, int n);

  int Length(int seq, int layer = 0) const { return lengths_[Index(layer, seq)]; }

  // The encoded cells of one sequence, for session files. Layout: per layer, (a ring layer) an
  // i32: the first position m0 it holds, then per KV head the K head rows of cells [f, n), then
  // the V head rows, then (anchored keys) one flag byte per cell, f being 0, or n -
  // min(layer_cells, n) for a ring layer (rows and flags below m0 are zeros); after all layers
  // (anchored keys) the anchors [n_layer, n_kv_heads, head_dim] f32; then (with a window) per layer
  // an i32: the first position m0 the copy holds, and per KV head the exact K rows then V rows of
  // positions [n - m, n), m = min(window_ring(), n), f16 (rows below m0 are zeros).
  uint64_t SequenceStateBytes(int n) const;
  // Writes sequence seq's first n cells (every layer must hold at least n) to out
  // ([SequenceStateBytes(n)] bytes).
  void ExportSequence(int seq, int n, uint8_t* out) const;
  // Replaces sequence seq by n cells read from `in` ([SequenceStateBytes(n)] bytes, as
  // ExportSequence writes them); every layer then holds n cells.
  void ImportSequence(int seq, int n, const uint8_t* in);
  // Checks n cells in ExportSequence's layout for what the writer never stores (a NaN in a
  // decoded K or V row, an anchor flag other than 0 or 1, a non-finite anchor; a ring layer's
  // or the KV window's first held cell outside [n - held, n], data before it, a NaN); the
  // error names the layer, KV head and cell. Untrusted state must pass it before ImportSequence,
  // and state that passes is exported again byte for byte.
  Status CheckSequenceState(int n, const uint8_t* in) const;

  // Encoded head rows. Storage is head-major per (sequence, layer): the rows of one KV head
  // for consecutive cells are contiguous, so attention streams one head's cells sequentially
  // and can decode a whole tile of cells in one call. Each head's cells are allocated in a
  // multiple of kKvTileCells (n_ctx rounded up; rings are multiples of 64 already).
  // Of a ring layer, only positions the ring holds are meaningful, and consecutive positions
  // are contiguous up to a multiple of layer_cells(layer).
  // f16, int8 and q4_0 keys (k_tiled(): every mode but f32) are stored as tiles of
  // kKvTileCells consecutive cells (kernels/kv_format.h: f16, int8 or q4_0 tiles) in the same bytes
  // as those cells' rows: read them through KTile (scorers, decoders) or KRow (one cell's row),
  // never through KHead.
  bool k_tiled() const { return k_tiled_; }
  const uint8_t* KHead(int layer, int seq, int head, int pos) const {
    return k_.data() + HeadIndex(layer, seq, head, pos) * k_head_bytes_;
  }
  const uint8_t* VHead(int layer, int seq, int head, int pos) const {
    return v_.data() + HeadIndex(layer, seq, head, pos) * v_head_bytes_;
  }
  // The one accessor of tiled keys: the tile holding position pos of (layer, seq, head) and
  // pos's cell in it. The tiles of consecutive positions are contiguous up to a multiple of
  // layer_cells(layer) (tiles never wrap around a ring).
  struct KTileRef {
    const uint8_t* tile;  // [kKvTileCells * k_head_bytes()] one f16, int8 or q4_0 tile
    int cell;             // < kKvTileCells
  };
  KTileRef KTile(int layer, int seq, int head, int pos) const {
    const size_t at = HeadIndex(layer, seq, head, pos);
    const int cell = static_cast<int>(at % kKvTileCells);  // head bases are whole tiles
    return {k_.data() + (at - cell) * k_head_bytes_, cell};
  }
  // One cell's encoded K row ([k_head_bytes()], the row format's layout whatever the storage:
  // the bytes session files hold).
  void KRow(int layer, int seq, int head, int pos, uint8_t* out) const;
  size_t k_head_bytes() const { return k_head_bytes_; }
  size_t v_head_bytes() const { return v_head_bytes_; }
  size_t k_row_bytes() const { return k_head_bytes_ * config_.n_kv_heads; }
  size_t v_row_bytes() const { return v_head_bytes_ * config_.n_kv_heads; }

  // Whole storage of one layer and sequence ([n_kv_heads, layer_cells(layer) rounded up to
  // kKvTileCells] head rows, or tiles), for tests comparing write paths byte by byte.
  const uint8_t* KStorage(int layer, int seq) const {
    return k_.data() + HeadIndex(layer, seq, 0, 0) * k_head_bytes_;
  }
  const uint8_t* VStorage(int layer, int seq) const { return VHead(layer, seq, 0, 0); }

  // Anchored keys (q4_0 mode; see the top of this file).
  bool k_anchored() const { return k_anchored_; }
  // The anchor of one head ([head_dim], position-0 frame; zeros before the first write).
  const float* KAnchor(int layer, int seq, int head) const {
    return k_anchor_.data() + (Index(layer, seq) * config_.n_kv_heads + head) * config_.head_dim;
  }
  // One byte per cell of one head ([layer_cells], from position pos's slot): 1 when the cell
  // stores k - R(p) a.
  const uint8_t* KAnchorFlags(int layer, int seq, int head, int pos = 0) const {
    return k_anchor_flag_.data() + HeadIndex(layer, seq, head, pos);
  }
  // cos and sin of rotated pair `pair`'s RoPE angle (without the attention factor) at
  // positions [pos0, pos0 + n), composed as run start (x) offset from the two tables below.
  void AnchorCosSin(int pair, int pos0, int n, float* cos_out, float* sin_out) const;
  // Run-start table: cos, sin of every pair's angle at position run * kAnchorAngleRun
  // ([n_rot / 2][2] for that run).
  const float* AnchorRunStart(int run) const {
    return anchor_run_cs_.data() + static_cast<size_t>(run) * config_.rope.n_rot;
  }
  // Offset table of one pair: cos then sin of its angle at offsets 0..kAnchorAngleRun-1
  // ([2][kAnchorAngleRun]).
  const float* AnchorOffsetCosSin(int pair) const {
    return anchor_offset_cs_.data() + static_cast<size_t>(pair) * 2 * kAnchorAngleRun;
  }
  // RoPE's attention factor (the magnitude RopeCache multiplies cos and sin by).
  float anchor_mscale() const { return anchor_mscale_; }
  // Dimensions (x, y) that RoPE rotates together as pair j.
  int PairX(int j) const { return config_.rope.style == RopeStyle::kNormal ? 2 * j : j; }
  int PairY(int j) const {
    return config_.rope.style == RopeStyle::kNormal ? 2 * j + 1 : j + config_.rope.n_rot / 2;
  }
  // The offset R(p) a of one head's anchor at position pos ([head_dim]).
  void AnchorOffset(const float* anchor, int pos, float* out) const;

  // K (side 0) or V (side 1) rows of one head at positions [0, n) as attention reads them:
  // decoded, rotation undone, anchor offsets restored (of a ring layer: the rows of positions it
  // no longer holds are whatever their slots hold). out: [n, head_dim].
  void ReadHeadRows(int side, int layer, int seq, int head, int n, float* out) const;

  // The most cells of sequence seq, at most n, that can be kept with their windows intact: n
  // when the exact-copy ring still holds the copies of the window before n and every
  // sliding-window ring the cells the query at n reads (a cut at most kKvWindowSlack cells
  // back, or anything without rings), else 0. Session::Truncate and CopyPrefix keep that many,
  // so a kept prefix always reads as a fresh evaluation would.
  int ExactKeep(int seq, int n) const;
  // Cells per sequence and KV head that layer `layer` stores (KvLayerCells).
  int layer_cells(int layer) const { return cells_[layer]; }
  // Whether layer `layer` keeps a ring of its recent cells rather than all n_ctx.
  bool ring_layer(int layer) const { return cells_[layer] < config_.n_ctx; }
  bool has_rings() const { return ring_cells_ > 0; }
  // The ring layers' capacity (0: none), for session files.
  int ring_cells() const { return ring_cells_; }
  // The sliding attention window of layer `layer` (0: none), whether kept as a ring or not.
  int sliding_window(int layer) const {
    return config_.sliding_window.empty() ? 0 : config_.sliding_window[layer];
  }
  // The first position a ring layer still holds for sequence seq (0 for other layers).
  int RingFirstHeld(int layer, int seq) const {
    return ring_layer(layer) ? std::max(ring_floor_[Index(layer, seq)],
                                        std::max(0, Length(seq, layer) - cells_[layer]))
                             : 0;
  }
  // The recent full-precision window (see kKvWindowSlack); 0: none.
  int window() const { return window_; }
  int window_ring() const { return ring_; }
  // The first cell a query at position pos of (layer, seq) reads from the exact copy (pos + 1
  // without a window): pos - window + 1, or later where the ring no longer holds a cell.
  int WindowBegin(int layer, int seq, int pos) const {
    if (window_ == 0) return pos + 1;
    const int lo = std::max(window_floor_[Index(layer, seq)], Length(seq, layer) - ring_);
    return std::max({0, pos - window_ + 1, lo});
  }
  // The exact copy of one head row at position pos: f16 [head_dim], in the side's rotated
  // frame; the rows of consecutive positions are contiguous up to a multiple of window_ring().
  const uint8_t* WindowK(int layer, int seq, int head, int pos) const {
    return wk_.data() + RingIndex(layer, seq, head, pos) * ring_row_bytes_;
  }
  const uint8_t* WindowV(int layer, int seq, int head, int pos) const {
    return wv_.data() + RingIndex(layer, seq, head, pos) * ring_row_bytes_;
  }
  size_t window_row_bytes() const { return ring_row_bytes_; }
  // Bytes of the exact copies for all sequences (not per token: a fixed cost).
  size_t WindowBytes() const { return wk_.size() + wv_.size(); }

  // First non-finite K/V value seen by Write ("" if none); ClearNonfinite resets it.
  const std::string& nonfinite_error() const { return nonfinite_error_; }
  void ClearNonfinite() { nonfinite_error_.clear(); }

 private:
  size_t Index(int layer, int seq) const {
    return static_cast<size_t>(seq) * config_.n_layer + layer;
  }
  // Head rows are [n_seq][n_layer][n_kv_heads][head_cells] (layer_base_: a layer's offset
  // within a sequence's seq_cells_ rows; head_cells_: layer_cells rounded up to kKvTileCells, so
  // every head starts a tile); a ring layer's position p is in slot p % cells.
  size_t HeadIndex(int layer, int seq, int head, int pos) const {
    return static_cast<size_t>(seq) * seq_cells_ + layer_base_[layer] +
           static_cast<size_t>(head) * head_cells_[layer] +
           static_cast<size_t>(pos % cells_[layer]);
  }
  // Stores one cell's encoded K row (k_head_bytes_) into its row or tile slot.
  void StoreKRow(int layer, int seq, int head, int pos, const uint8_t* row);
  // Zeroes, or copies from src_seq, the K cells [p0, p0 + m) of one head (within one turn of a
  // ring): whole tiles at once, the cells of partial tiles one by one.
  void ZeroKCells(int layer, int seq, int head, int p0, int m);
  void CopyKCells(int layer, int src_seq, int dst_seq, int head, int p0, int m);
  // Encodes one head row (head_dim values at src) of one side into dst.
  void EncodeHead(const KvSideSpec& spec, bool stochastic, int layer, int pos, int head,
                  const float* src, uint8_t* dst, float* tmp) const;
  // Squared error of an encoded row against its source (tmp: [head_dim]).
  float EncodedError(const KvSideSpec& spec, const uint8_t* row, const float* src,
                     float* tmp) const;
  // Encodes one key head row plainly and anchored into out (a row, [k_head_bytes_]), keeps the
  // better one and sets its flag. scratch: [3 * head_dim]; alt: [k_head_bytes_].
  void EncodeAnchoredK(int layer, int seq, int pos, int head, const float* k, float* scratch,
                       uint8_t* alt, uint8_t* out);
  void ZeroCells(int layer, int seq, int pos0, int n);
  size_t RingIndex(int layer, int seq, int head, int pos) const {
    return (Index(layer, seq) * config_.n_kv_heads + head) * ring_ +
           static_cast<size_t>(pos % ring_);
  }
  // Stores the exact copy of one head row (src: head_dim values) of K (side 0) or V (side 1).
  void WriteWindowRow(int side, int layer, int seq, int head, int pos, const float* src,
                      float* tmp);
  // The first position of a prefix of n cells that a ring of `ring` cells with floor `floor`
  // still holds, (layer, seq) being Length(seq, layer) long.
  int FirstHeld(int layer, int seq, int n, int ring, int floor) const {
    return std::min(n, std::max({0, n - ring, floor, Length(seq, layer) - ring}));
  }
  // The first position whose exact copy (layer, seq) holds, for a prefix of n cells.
  int WindowFirstHeld(int layer, int seq, int n) const {
    return FirstHeld(layer, seq, n, ring_, window_floor_[Index(layer, seq)]);
  }
  // The first cell of a prefix of n a ring layer still holds (0 for other layers).
  int CellsFirstHeld(int layer, int seq, int n) const {
    return ring_layer(layer)
               ? FirstHeld(layer, seq, n, cells_[layer], ring_floor_[Index(layer, seq)])
               : 0;
  }
  // The first cell of a prefix of n that session state holds for a layer (ExportSequence).
  int StateFirstCell(int layer, int n) const {
    return ring_layer(layer) ? n - std::min(cells_[layer], n) : 0;
  }

  KvCacheConfig config_;
  KvSideSpec k_spec_;
  KvSideSpec v_spec_;
  size_t k_head_bytes_ = 0;
  size_t v_head_bytes_ = 0;
  bool k_tiled_ = false;            // f16, int8 or q4_0 keys in tiles (kv_format.h)
  std::vector<int> cells_;          // [n_layer] cells per KV head (KvLayerCells)
  std::vector<int> head_cells_;     // [n_layer] cells_ rounded up to kKvTileCells
  std::vector<size_t> layer_base_;  // [n_layer] first head row of a layer within a sequence
  size_t seq_cells_ = 0;            // head rows per sequence, all layers
  int ring_cells_ = 0;              // the ring layers' cells (0: none)
  std::vector<int> ring_floor_;     // [n_seq, n_layer] a ring layer holds no cell below this
  // The cells' bytes, in huge pages where the kernel gives them (KvCacheConfig::huge_pages).
  using CellBytes = std::vector<uint8_t, HugePageAllocator<uint8_t>>;
  // [n_seq, n_layer, n_kv_heads, head_cells] x k_head_bytes_ (rows, or key tiles)
  CellBytes k_;
  CellBytes v_;               // [n_seq, n_layer, n_kv_heads, head_cells] x v_head_bytes_
  std::vector<int> lengths_;  // [n_seq, n_layer]
  bool k_anchored_ = false;
  float anchor_mscale_ = 1.0f;
  std::vector<float> anchor_run_cs_;     // [n_ctx / kAnchorAngleRun (rounded up), n_rot / 2, 2]
  std::vector<float> anchor_offset_cs_;  // [n_rot / 2, 2, kAnchorAngleRun]
  std::vector<float> k_anchor_;          // [n_seq, n_layer, n_kv_heads, head_dim]
  std::vector<uint8_t> k_anchor_flag_;   // [n_seq, n_layer, n_kv_heads, head_cells] (anchored)
  int window_ = 0;                       // effective window (0 for lossless modes)
  int ring_ = 0;                         // window_ + kKvWindowSlack (0 without a window)
  size_t ring_row_bytes_ = 0;            // one f16 head row
  std::vector<uint8_t> wk_;              // [n_seq, n_layer, n_kv_heads, ring_] f16 head rows
  std::vector<uint8_t> wv_;              // [n_seq, n_layer, n_kv_heads, ring_] f16 head rows
  std::vector<int> window_floor_;        // [n_seq, n_layer] no exact copy below this position
  std::string nonfinite_error_;
};

}  // namespace lamina
