// AVX-512 (F/BW/VL/DQ/VNNI) integer K scorers and fused V accumulation, twins of the scalar
// ones in kv_decode.cpp (the plain row decoders are in kv_decode_hwy.cpp).
//
// Scorer layout: a block of 16 cells is expanded once and reused by every query of the call.
// Both K formats are multiplied as unsigned bytes by the int8 query (put back in element order
// once per call) with vpdpbusd: int8 codes shifted by +128 (one xor), q4_0 nibbles as they are
// (low nibbles: the group's run 0, high nibbles: run 1, in element order); the group's zero
// point comes off as 128 (int8) or 8 (q4_0) times the query's group sum, once per query and
// group. The codes are transposed per 16-cell block (a 4x4 dword transpose within each 128-bit
// lane) so that each dword lane is one cell and a cell's group sum needs no reduction across
// lanes; its lanes come out as lane 4j + m = cell 4m + j, an involution that one vpermd undoes
// before the store. The cache's int8 and q4_0 keys are stored as tiles already in that order
// (kv_format.h, lane = cell): the tile scorer (ScoreTiles) loads each 4-dim chunk of 16 cells as
// it is, so an int8 group is 8 loads and 8 xors and a q4_0 group 4 loads, 8 ands and 4 shifts,
// shared by every query, and no transpose or permute.
// GCC 12's AVX-512 headers build some intrinsics from _mm512_undefined_*(), which its
// uninitialized-value analysis reports at every use.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/attention_kernels.h"
#include "kernels/kv_decode.h"

namespace lamina {

namespace {

constexpr int kGroup = 32;       // values per scale
constexpr int kBlockCells = 16;  // cells expanded at once
constexpr int kMaxHeadDim = 512;

// Rows this far ahead of the one being read are prefetched: the hardware prefetcher stops at
// each 4 KiB page, and a KV head's rows are one long run of pages. Not for f16 rows and tiles:
// there the hardware's own stream is faster without them (2 threads, 16K cells: f16 attention
// 517-580 us per layer with the prefetches, 381-428 without, 4 KiB and huge pages alike; the
// int8 and 4-bit formats' V sums lose 20-40% without theirs; docs/PERFORMANCE.md).
constexpr int kPrefetchCells = 64;

// Prefetches rows [j, j + n) where they exist.
inline void PrefetchAhead(const uint8_t* rows, int n_rows, size_t row_bytes, int j, int n) {
  if (j >= n_rows) return;
  const uint8_t* b = rows + j * row_bytes;
  const uint8_t* e = rows + std::min(n_rows, j + n) * row_bytes;
  for (const uint8_t* p = b; p < e; p += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}

// Four 16-byte runs (one per cell, `stride` bytes apart) as one zmm, cell c in lane c.
inline __m512i LoadRuns4(const uint8_t* p, size_t stride) {
  __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + stride)), 1);
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * stride)), 2);
  return _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 3 * stride)),
                            3);
}

constexpr int kMaxByteQueries = 32;  // queries put in element order at once (int8 and q4_0 K)

// One group of a 16-cell block expanded for vpdpbusd: w[t] holds dword position t of the group's
// codes as unsigned bytes (one cell per dword lane, lane 4j + m = cell 4m + j), dk the cells'
// K scales in the same lane order.
struct ByteGroup {
  __m512i w[8];
  __m512 dk;
};

// The group's 16 f16 scales (2 bytes at the start of each cell's group, `row_bytes` apart) in
// lane order. By scalar moves: a 16-lane gather cost ~10% more of the q4_0 scorer on an AMD
// EPYC (Zen 5); docs/PERFORMANCE.md "q4_0 K by vpdpbusd".
inline __m512 LoadGroupScales(const uint8_t* grp, size_t row_bytes) {
  alignas(32) uint16_t ds[16];  // lane 4j + m: cell 4m + j
  for (int j = 0; j < 4; ++j) {
    for (int m = 0; m < 4; ++m) std::memcpy(&ds[4 * j + m], grp + (4 * m + j) * row_bytes, 2);
  }
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(ds)));
}

// The 4x4 dword transpose within each 128-bit lane of v[0..3] (cell quad m: cell 4m + j in
// 128-bit lane j): u[t] lane 4j + m = dword t of cell 4m + j.
inline void TransposeDwords(const __m512i* v, __m512i* u) {
  const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
  u[0] = _mm512_unpacklo_epi64(t0, t2);
  u[1] = _mm512_unpackhi_epi64(t0, t2);
  u[2] = _mm512_unpacklo_epi64(t1, t3);
  u[3] = _mm512_unpackhi_epi64(t1, t3);
}

// int8 codes of group `grp` (each cell's { fp16 d; int8 q[32] }) as unsigned bytes, +128 by one
// xor: w[4h + t] = dword t of bytes 16h..16h+15.
[[gnu::always_inline]] inline void ExpandGroupInt8(const uint8_t* grp, size_t row_bytes,
                                                   ByteGroup* out) {
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  out->dk = LoadGroupScales(grp, row_bytes);
  for (int h = 0; h < 2; ++h) {
    __m512i v[4], u[4];  // cell quad m: cell 4m + j in 128-bit lane j
    for (int m = 0; m < 4; ++m) v[m] = LoadRuns4(grp + 4 * m * row_bytes + 2 + 16 * h, row_bytes);
    TransposeDwords(v, u);
    for (int t = 0; t < 4; ++t) out->w[4 * h + t] = _mm512_xor_si512(u[t], bias);
  }
}

// q4_0 nibbles of group `grp` (each cell's { fp16 d; uint8 qs[16] }) as bytes: w[t] the low
// nibbles of dword t (elements 4t..4t+3), w[4 + t] the high ones (16+4t..16+4t+3).
[[gnu::always_inline]] inline void ExpandGroupQ4(const uint8_t* grp, size_t row_bytes,
                                                 ByteGroup* out) {
  const __m512i nib = _mm512_set1_epi8(0x0F);
  out->dk = LoadGroupScales(grp, row_bytes);
  __m512i v[4], u[4];  // cell quad m: cell 4m + j in 128-bit lane j
  for (int m = 0; m < 4; ++m) v[m] = LoadRuns4(grp + 4 * m * row_bytes + 2, row_bytes);
  TransposeDwords(v, u);
  for (int t = 0; t < 4; ++t) {
    out->w[t] = _mm512_and_si512(u[t], nib);
    out->w[4 + t] = _mm512_and_si512(_mm512_srli_epi16(u[t], 4), nib);
  }
}

// Group `grp` of an int8 tile (kv_format.h): its 16 scales in cell order and its 8 chunks of 4
// dims, one cell per dword lane already, as unsigned bytes (+128 by one xor); lane = cell.
[[gnu::always_inline]] inline void ExpandTileGroupInt8(const uint8_t* grp, size_t /*row_bytes*/,
                                                       ByteGroup* out) {
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  out->dk = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp)));
  for (int t = 0; t < 8; ++t) {
    out->w[t] =
        _mm512_xor_si512(_mm512_loadu_si512(grp + 2 * kBlockCells + 4 * kBlockCells * t), bias);
  }
}

// Group `grp` of a q4_0 tile (kv_format.h): its 16 scales in cell order and its 4 chunks of 4
// code bytes, one cell per dword lane already: w[t] the low nibbles of chunk t (dims 4t..4t+3),
// w[4 + t] the high ones (dims 16+4t..16+4t+3), as ExpandGroupQ4 gives them but in cell order.
[[gnu::always_inline]] inline void ExpandTileGroupQ4(const uint8_t* grp, size_t /*row_bytes*/,
                                                     ByteGroup* out) {
  const __m512i nib = _mm512_set1_epi8(0x0F);
  out->dk = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp)));
  for (int t = 0; t < 4; ++t) {
    const __m512i v = _mm512_loadu_si512(grp + 2 * kBlockCells + 4 * kBlockCells * t);
    out->w[t] = _mm512_and_si512(v, nib);
    out->w[4 + t] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
  }
}

using ExpandGroupFn = void (*)(const uint8_t* grp, size_t row_bytes, ByteGroup* out);

// Group g of kNq queries against an expanded group: s[k] = fma(float(dot_g), dk * qd, s[k]).
// Two chains per query (the group's two halves of 4 dwords); the zero point (zq, negated)
// starts the first. The query dwords are broadcast from memory, the codes stay in registers.
template <int kNq>
inline void DotGroup(const ByteGroup& e, const int32_t* qv, int q_stride, const int32_t* zq,
                     const float* qs, int n_groups, __m512* s) {
  for (int k = 0; k < kNq; ++k) {
    const int32_t* q = qv + k * q_stride;
    __m512i lo = _mm512_set1_epi32(zq[k * n_groups]), hi = _mm512_setzero_si512();
    for (int t = 0; t < 4; ++t) {
      lo = _mm512_dpbusd_epi32(lo, e.w[t], _mm512_set1_epi32(q[t]));
      hi = _mm512_dpbusd_epi32(hi, e.w[4 + t], _mm512_set1_epi32(q[4 + t]));
    }
    const __m512 f = _mm512_mul_ps(e.dk, _mm512_set1_ps(qs[k * n_groups]));
    s[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), f, s[k]);
  }
}

// Queries [q0, q0 + kNq) of a block: groups outer, each group expanded once (q0 == 0; kept in
// `keep` when later query chunks reuse it) or taken back from `keep`, and met by every query of
// the chunk while its codes are in registers. kHd > 0: head_dim (and so every row offset) known
// at compile time; 0: head_dim at run time. kTiled: an int8 tile (groups 16 cells wide, lane =
// cell), else 16 rows (lanes transposed, put back in cell order before the store).
template <int kHd, int kGroupBytes, int kNq, ExpandGroupFn kExpand, bool kTiled = false>
[[gnu::always_inline]] inline void ScoreBlockChunk(const uint8_t* rows, int head_dim, int q0,
                                                   bool store, ByteGroup* keep, const int32_t* q32,
                                                   const int32_t* zero, const float* qd,
                                                   float scale, float* out, int64_t out_stride,
                                                   __mmask16 store_mask) {
  const int n_groups = (kHd > 0 ? kHd : head_dim) / kGroup;
  const size_t row_bytes = static_cast<size_t>(n_groups) * kGroupBytes;
  const int q_stride = n_groups * kGroup / 4;
  __m512 s[kNq];
  for (int k = 0; k < kNq; ++k) s[k] = _mm512_setzero_ps();
  for (int g = 0; g < n_groups; ++g) {
    ByteGroup e;
    if (q0 == 0) {
      kExpand(rows + g * (kTiled ? kBlockCells : 1) * kGroupBytes, row_bytes, &e);
      if (store) keep[g] = e;
    } else {
      e = keep[g];
    }
    DotGroup<kNq>(e, q32 + static_cast<int64_t>(q0) * q_stride + 8 * g, q_stride,
                  zero + static_cast<int64_t>(q0) * n_groups + g, qd + q0 * n_groups + g, n_groups,
                  s);
  }
  const __m512i lane_cell = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int k = 0; k < kNq; ++k) {
    const __m512 v = _mm512_mul_ps(s[k], vscale);
    _mm512_mask_storeu_ps(out + (q0 + k) * out_stride, store_mask,
                          kTiled ? v : _mm512_permutexvar_ps(lane_cell, v));
  }
}

// int8 or q4_0 rows of a 16-cell block against int8 queries: q32 [nq][head_dim / 4] the codes in
// element order, four to a dword; zero [nq][n_groups] = -kZero * each group's code sum (128:
// int8 codes as unsigned bytes, 8: q4_0 nibbles). The block's codes are transposed so that each
// dword lane is one cell: per group 8 zmm, one per dword position, each meeting its query dword
// broadcast, so a cell's group sum needs no reduction across lanes. Queries in chunks of 4,
// each chunk's scores in registers; the first chunk expands each group, later ones reuse it.
// kTiled: an int8 tile, store_mask the wanted cells (else the first n_valid).
template <int kHd, int kGroupBytes, ExpandGroupFn kExpand, bool kTiled = false>
[[gnu::always_inline]] inline void ScoreBlockBytes(const uint8_t* rows, int head_dim, int nq,
                                                   const int32_t* q32, const int32_t* zero,
                                                   const float* qd, float scale, float* out,
                                                   int64_t out_stride, int n_valid,
                                                   __mmask16 tile_mask = 0) {
  alignas(64) ByteGroup keep[kMaxHeadDim / kGroup];  // [group] expanded codes when nq > 4
  const __mmask16 store_mask = kTiled ? tile_mask : static_cast<__mmask16>((1u << n_valid) - 1);
  const bool store = nq > 4;
  for (int q0 = 0; q0 < nq; q0 += 4) {
    switch (std::min(4, nq - q0)) {
      case 4:
        ScoreBlockChunk<kHd, kGroupBytes, 4, kExpand, kTiled>(
            rows, head_dim, q0, store, keep, q32, zero, qd, scale, out, out_stride, store_mask);
        break;
      case 3:
        ScoreBlockChunk<kHd, kGroupBytes, 3, kExpand, kTiled>(
            rows, head_dim, q0, store, keep, q32, zero, qd, scale, out, out_stride, store_mask);
        break;
      case 2:
        ScoreBlockChunk<kHd, kGroupBytes, 2, kExpand, kTiled>(
            rows, head_dim, q0, store, keep, q32, zero, qd, scale, out, out_stride, store_mask);
        break;
      default:
        ScoreBlockChunk<kHd, kGroupBytes, 1, kExpand, kTiled>(
            rows, head_dim, q0, store, keep, q32, zero, qd, scale, out, out_stride, store_mask);
        break;
    }
  }
}

// The blocks of 16 cells of rows [0, n_rows) for one chunk of queries (the tail through a
// zero-padded copy, so the block code never reads past the rows), with the block code inlined:
// the address arithmetic of the 16 rows is set up once per call, not per block.
template <int kHd, int kGroupBytes, ExpandGroupFn kExpand>
void ScoreBlocks(const uint8_t* rows, int n_rows, int head_dim, int nq, const int32_t* q32,
                 const int32_t* zero, const float* qd, float scale, float* out,
                 int64_t out_stride) {
  const size_t row_bytes = static_cast<size_t>((kHd > 0 ? kHd : head_dim) / kGroup) * kGroupBytes;
  int j = 0;
  for (; j + kBlockCells <= n_rows; j += kBlockCells) {
    PrefetchAhead(rows, n_rows, row_bytes, j + kPrefetchCells, kBlockCells);
    ScoreBlockBytes<kHd, kGroupBytes, kExpand>(rows + j * row_bytes, head_dim, nq, q32, zero, qd,
                                               scale, out + j, out_stride, kBlockCells);
  }
  if (j < n_rows) {
    alignas(64) uint8_t pad[kBlockCells * (kMaxHeadDim + 2 * kMaxHeadDim / kGroup)];
    const size_t bytes = (n_rows - j) * row_bytes;
    std::memcpy(pad, rows + j * row_bytes, bytes);
    std::memset(pad + bytes, 0, kBlockCells * row_bytes - bytes);
    ScoreBlockBytes<kHd, kGroupBytes, kExpand>(pad, head_dim, nq, q32, zero, qd, scale, out + j,
                                               out_stride, n_rows - j);
  }
}

// Queries qq [n][head_dim] (QuantizeQueryInt16's order) put in element order as int8, four to a
// dword: q32 [n][head_dim / 4]; zero [n][n_groups] = -kZero times each group's code sum.
inline void PrepareByteQueries(const int16_t* qq, int n, int head_dim, int kZero, int32_t* q32,
                               int32_t* zero) {
  const int n_groups = head_dim / kGroup;
  for (int qi = 0; qi < n; ++qi) {
    const int16_t* src = qq + static_cast<int64_t>(qi) * head_dim;
    int32_t* dst = q32 + static_cast<int64_t>(qi) * (head_dim / 4);
    // QuantizeQueryInt16 keeps each run of 16 as evens then odds; codes are in [-127, 127],
    // so the pack never saturates.
    for (int g = 0; g < n_groups; ++g) {
      __m128i sum = _mm_setzero_si128();  // int16 lanes: |sum| <= 4 * 127
      for (int k = 2 * g; k < 2 * g + 2; ++k) {
        const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * k));
        const __m128i o = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * k + 8));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 4 * k),
                         _mm_packs_epi16(_mm_unpacklo_epi16(e, o), _mm_unpackhi_epi16(e, o)));
        sum = _mm_add_epi16(sum, _mm_add_epi16(e, o));
      }
      __m128i s32 = _mm_madd_epi16(sum, _mm_set1_epi16(1));
      s32 = _mm_add_epi32(s32, _mm_shuffle_epi32(s32, 0x4E));
      s32 = _mm_add_epi32(s32, _mm_shuffle_epi32(s32, 0xB1));
      zero[qi * n_groups + g] = -kZero * _mm_cvtsi128_si32(s32);
    }
  }
}

// int8 and q4_0 scores: queries in chunks of kMaxByteQueries, each put in element order as int8
// with its groups' zero-point terms (-kZero times the group's code sum: 128 for int8 codes taken
// as unsigned bytes, 8 for q4_0 nibbles), then the blocks of 16 cells (the tail through a
// zero-padded copy, so the block code never reads past the rows).
template <KvRowFormat F, int kZero, int kGroupBytes, ExpandGroupFn kExpand>
void ScoreBytes(const uint8_t* rows, int n_rows, int head_dim, int nq, const int16_t* qq,
                const float* qd, float scale, float* out, int64_t out_stride) {
  if (head_dim > kMaxHeadDim) {
    ScalarKvScorer(F)(rows, n_rows, head_dim, nq, qq, qd, scale, out, out_stride);
    return;
  }
  static_assert(kGroupBytes == (F == KvRowFormat::kInt8 ? 2 + kGroup : 2 + kGroup / 2));
  const int n_groups = head_dim / kGroup;
  alignas(64) int32_t q32[kMaxByteQueries * kMaxHeadDim / 4];        // [query][head_dim / 4]
  alignas(64) int32_t zero[kMaxByteQueries * kMaxHeadDim / kGroup];  // [query][group]
  for (int q0 = 0; q0 < nq; q0 += kMaxByteQueries) {
    const int n = std::min(kMaxByteQueries, nq - q0);
    PrepareByteQueries(qq + static_cast<int64_t>(q0) * head_dim, n, head_dim, kZero, q32, zero);
    const float* qdc = qd + static_cast<int64_t>(q0) * n_groups;
    float* oc = out + q0 * out_stride;
    // Head dims of common models with every row offset known at compile time.
    if (head_dim == 64) {
      ScoreBlocks<64, kGroupBytes, kExpand>(rows, n_rows, head_dim, n, q32, zero, qdc, scale, oc,
                                            out_stride);
    } else if (head_dim == 128) {
      ScoreBlocks<128, kGroupBytes, kExpand>(rows, n_rows, head_dim, n, q32, zero, qdc, scale, oc,
                                             out_stride);
    } else {
      ScoreBlocks<0, kGroupBytes, kExpand>(rows, n_rows, head_dim, n, q32, zero, qdc, scale, oc,
                                           out_stride);
    }
  }
}

// The tiles holding cells [first, first + n_cells) for one chunk of queries: each tile's groups
// are loaded as they are (lane = cell), its wanted cells stored through a mask.
template <int kHd, int kGroupBytes, ExpandGroupFn kExpand>
void ScoreTileRun(const uint8_t* tiles, int first, int n_cells, int head_dim, int nq,
                  const int32_t* q32, const int32_t* zero, const float* qd, float scale, float* out,
                  int64_t out_stride) {
  const size_t row_bytes = static_cast<size_t>((kHd > 0 ? kHd : head_dim) / kGroup) * kGroupBytes;
  const int end = first + n_cells;  // cells counted from the first tile's start
  for (int c = 0; c < end; c += kBlockCells) {
    PrefetchAhead(tiles, end, row_bytes, c + kPrefetchCells, kBlockCells);
    const int lo = std::max(first - c, 0), hi = std::min(end - c, kBlockCells);
    const auto mask = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
    // Lane l of the tile's scores goes to out[c + l - first] (masked lanes are not touched).
    ScoreBlockBytes<kHd, kGroupBytes, kExpand, true>(tiles + c * row_bytes, head_dim, nq, q32, zero,
                                                     qd, scale, out + (c - first), out_stride,
                                                     kBlockCells, mask);
  }
}

// int8 (kZero 128, groups of 34 bytes per cell) or q4_0 (kZero 8, 18 bytes) tiles.
template <KvRowFormat F, int kZero, int kGroupBytes, ExpandGroupFn kExpand>
void ScoreTiles(const uint8_t* tiles, int first, int n_cells, int head_dim, int nq,
                const int16_t* qq, const float* qd, float scale, float* out, int64_t out_stride) {
  if (head_dim > kMaxHeadDim) {
    ScalarKvTileScorer(F)(tiles, first, n_cells, head_dim, nq, qq, qd, scale, out, out_stride);
    return;
  }
  static_assert(kGroupBytes == (F == KvRowFormat::kInt8 ? 2 + kGroup : 2 + kGroup / 2));
  const int n_groups = head_dim / kGroup;
  alignas(64) int32_t q32[kMaxByteQueries * kMaxHeadDim / 4];        // [query][head_dim / 4]
  alignas(64) int32_t zero[kMaxByteQueries * kMaxHeadDim / kGroup];  // [query][group]
  for (int q0 = 0; q0 < nq; q0 += kMaxByteQueries) {
    const int n = std::min(kMaxByteQueries, nq - q0);
    PrepareByteQueries(qq + static_cast<int64_t>(q0) * head_dim, n, head_dim, kZero, q32, zero);
    const float* qdc = qd + static_cast<int64_t>(q0) * n_groups;
    float* oc = out + q0 * out_stride;
    if (head_dim == 64) {
      ScoreTileRun<64, kGroupBytes, kExpand>(tiles, first, n_cells, head_dim, n, q32, zero, qdc,
                                             scale, oc, out_stride);
    } else if (head_dim == 128) {
      ScoreTileRun<128, kGroupBytes, kExpand>(tiles, first, n_cells, head_dim, n, q32, zero, qdc,
                                              scale, oc, out_stride);
    } else {
      ScoreTileRun<0, kGroupBytes, kExpand>(tiles, first, n_cells, head_dim, n, q32, zero, qdc,
                                            scale, oc, out_stride);
    }
  }
}

// f16 K tiles (kv_format.h, kv_decode.h): per tile and dim, the 16 cells' halves are one
// 32-byte load and one vcvtph2ps (lane = cell), shared by up to 4 queries; each query's chain
// i % 4 takes one fma with its element i broadcast from memory. 4 queries x 4 chains are 16
// independent accumulators; the chains' sums and the scale are lane-wise, in the scalar twin's
// order, and the tile's wanted cells go out through a mask. kTail: head_dim % 4 != 0. The tail
// and a loop that may run zero times made GCC keep the 16 accumulators in a stack array (zeroed,
// stored and reloaded per tile); without them (a separate instance, a do-while where head_dim
// >= 4) they live in registers only: 3.9 -> 3.3 ns per cell and KV head.
template <int kNq, bool kTail>
inline void ScoreF16TileQueries(const uint8_t* tile, int head_dim, const float* q, __m512 vscale,
                                __mmask16 mask, float* out, int64_t out_stride) {
  __m512 acc[kNq][4];  // [query][chain]
  for (int m = 0; m < kNq; ++m) {
    for (int l = 0; l < 4; ++l) acc[m][l] = _mm512_setzero_ps();
  }
  const __m256i* k = reinterpret_cast<const __m256i*>(tile);  // [head_dim] 16 halves each
  int i = 0;
  auto four_dims = [&] {
    for (int l = 0; l < 4; ++l) {
      const __m512 kv = _mm512_cvtph_ps(_mm256_loadu_si256(k + i + l));
      for (int m = 0; m < kNq; ++m) {
        acc[m][l] = _mm512_fmadd_ps(_mm512_set1_ps(q[m * head_dim + i + l]), kv, acc[m][l]);
      }
    }
  };
  if constexpr (!kTail) {
    do {  // head_dim >= 4
      four_dims();
      i += 4;
    } while (i < head_dim);
  } else {
    for (; i + 4 <= head_dim; i += 4) four_dims();
    for (int l = 0; l < 4; ++l) {  // the last head_dim % 4 dims
      if (i + l >= head_dim) break;
      const __m512 kv = _mm512_cvtph_ps(_mm256_loadu_si256(k + i + l));
      for (int m = 0; m < kNq; ++m) {
        acc[m][l] = _mm512_fmadd_ps(_mm512_set1_ps(q[m * head_dim + i + l]), kv, acc[m][l]);
      }
    }
  }
  for (int m = 0; m < kNq; ++m) {
    const __m512 s =
        _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][2]), _mm512_add_ps(acc[m][1], acc[m][3]));
    _mm512_mask_storeu_ps(out + m * out_stride, mask, _mm512_mul_ps(s, vscale));
  }
}

template <bool kTail>
void ScoreF16TilesOf(const uint8_t* tiles, int first, int n_cells, int head_dim, int nq,
                     const float* q, float scale, float* out, int64_t out_stride) {
  const size_t row_bytes = KvRowBytes(KvRowFormat::kF16, head_dim);
  const __m512 vscale = _mm512_set1_ps(scale);
  const int end = first + n_cells;  // cells counted from the first tile's start
  for (int c = 0; c < end; c += kKvTileCells) {
    // No software prefetch (kPrefetchCells).
    const uint8_t* tile = tiles + c * row_bytes;
    const int lo = std::max(first - c, 0), hi = std::min(end - c, kKvTileCells);
    const auto mask = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
    // Lane l of the tile's scores goes to out[c + l - first] (masked lanes are not touched).
    float* o = out + (c - first);
    for (int q0 = 0; q0 < nq; q0 += 4) {
      const float* qv = q + static_cast<int64_t>(q0) * head_dim;
      float* oq = o + q0 * out_stride;
      switch (std::min(4, nq - q0)) {
        case 1:
          ScoreF16TileQueries<1, kTail>(tile, head_dim, qv, vscale, mask, oq, out_stride);
          break;
        case 2:
          ScoreF16TileQueries<2, kTail>(tile, head_dim, qv, vscale, mask, oq, out_stride);
          break;
        case 3:
          ScoreF16TileQueries<3, kTail>(tile, head_dim, qv, vscale, mask, oq, out_stride);
          break;
        default:
          ScoreF16TileQueries<4, kTail>(tile, head_dim, qv, vscale, mask, oq, out_stride);
          break;
      }
    }
  }
}

void ScoreF16Tiles(const uint8_t* tiles, int first, int n_cells, int head_dim, int nq,
                   const float* q, float scale, float* out, int64_t out_stride) {
  if (head_dim % 4 == 0) {
    ScoreF16TilesOf<false>(tiles, first, n_cells, head_dim, nq, q, scale, out, out_stride);
  } else {
    ScoreF16TilesOf<true>(tiles, first, n_cells, head_dim, nq, q, scale, out, out_stride);
  }
}

// Fused V accumulation. A block of up to 4 queries keeps its accumulators for 64 columns (or
// the last 32) in registers, 16 independent fma chains, while each row's codes are expanded
// once into 4 vectors of floats. Every value is the AVX-512 decoder's (one conversion, one
// multiply by the group's scale; the 4-bit formats look the products up in a 16-entry table
// of d * level, the same products) and every accumulator takes fma(p, x, a) in row order, as
// the AVX-512 accumulate_rows does: the bits of decode-then-accumulate. The group scales of
// the 4-bit and int8 rows are converted for 16 rows at once (TileScales).
constexpr int kAccQueries = 4;  // queries per register block
constexpr int kAccVectors = 4;  // column vectors (16 floats each) per register block

constexpr int kAccRows = 64;         // rows per pass (a longer call is split into passes)
constexpr int kMaxPassQueries = 64;  // queries per pass (their relative limits on the stack)

// The f16 scales of rows [0, n_rows) (n_rows <= kAccRows) as floats, sc[g * kAccRows + j] for
// group g of row j, so that a row's groups then cost one broadcast operand each instead of a
// conversion: 16 rows per gather.
inline void TileScales(const uint8_t* rows, int n_rows, size_t row_bytes, int n_groups, float* sc) {
  const size_t group_bytes = row_bytes / n_groups;
  const __m512i offsets =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(row_bytes)));
  for (int j = 0; j < n_rows; j += 16) {
    // Lanes past the rows read nothing (masked) and are never used.
    const __mmask16 m =
        static_cast<__mmask16>(n_rows - j >= 16 ? 0xFFFFu : (1u << (n_rows - j)) - 1);
    for (int g = 0; g < n_groups; ++g) {
      const uint8_t* base = rows + j * row_bytes + g * group_bytes;
      const __m512i d = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, offsets, base, 1);
      _mm512_storeu_ps(sc + g * kAccRows + j, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d)));
    }
  }
}

// What TileScales4Bit needs of a head's row layout, made once per call of the V sum.
struct Scales4BitPlan {
  __m512i pick;      // word i: word gw * i (the scale of group i from a group-aligned window)
  __m512i order[4];  // [group] word j: n_groups * j + group (row j's scale of that group)
  size_t row_bytes;
  int gw;  // words per group: 9
  int n_groups;
};

inline Scales4BitPlan MakeScales4BitPlan(size_t row_bytes, int n_groups) {
  Scales4BitPlan plan;
  plan.row_bytes = row_bytes;
  plan.n_groups = n_groups;
  plan.gw = static_cast<int>(row_bytes / n_groups) / 2;
  const __m512i iota = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17,
                                        16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  plan.pick = _mm512_mullo_epi16(iota, _mm512_set1_epi16(static_cast<int16_t>(plan.gw)));
  for (int g = 0; g < 4; ++g) {
    plan.order[g] = _mm512_add_epi16(_mm512_mullo_epi16(iota, _mm512_set1_epi16(n_groups)),
                                     _mm512_set1_epi16(static_cast<int16_t>(g)));
  }
  return plan;
}

// TileScales for 4-bit rows (the int16 V sums; more than 4 groups a row: TileScales), without
// gathers (a 16-lane gather took ~15% of the int16 V kernel on an AMD EPYC, Zen 5). A head's rows
// are contiguous whole groups, an f16 scale and 16 code bytes each, so the scales of 8 consecutive
// groups lie within 128 bytes: two loads and one word permute pick them out in row-major order
// ([row][group]), they are joined in registers (a store and reloads across them stalled on store
// forwarding), and one permute per group and 16 rows puts them in row order for the conversion. Not
// inlined: it changed the register allocation of the callers' row loops for the worse.
__attribute__((noinline)) void TileScales4Bit(const Scales4BitPlan& plan, const uint8_t* rows,
                                              int n_rows, float* sc) {
  const size_t row_bytes = plan.row_bytes;
  const int n_groups = plan.n_groups, gw = plan.gw;
  if (n_groups > 4) {
    TileScales(rows, n_rows, row_bytes, n_groups, sc);
    return;
  }
  const __m512i pick = plan.pick;
  const int n_blocks = n_rows * n_groups;
  const int64_t total = static_cast<int64_t>(n_rows) * static_cast<int64_t>(row_bytes);
  // The scales of groups [b, b + 8) in words 0..7 (none past the rows: zero).
  auto window = [&](int b) __attribute__((always_inline)) {
    if (b >= n_blocks) return _mm_setzero_si128();
    const uint8_t* src = rows + static_cast<size_t>(b) * 2 * gw;
    const int64_t left = total - static_cast<int64_t>(b) * 2 * gw;  // bytes from src on
    __m512i lo, hi;
    if (left >= 128) {
      lo = _mm512_loadu_si512(src);
      hi = _mm512_loadu_si512(src + 64);
    } else {  // the last groups: no byte past the rows is read
      auto bytes = [](int64_t n) { return n >= 64 ? ~0ull : n <= 0 ? 0ull : (1ull << n) - 1; };
      lo = _mm512_maskz_loadu_epi8(bytes(left), src);
      hi = _mm512_maskz_loadu_epi8(bytes(left - 64), src + 64);
    }
    return _mm512_castsi512_si128(_mm512_permutex2var_epi16(lo, pick, hi));
  };
  // Word j of the permute for group g: the scale of group g of row 16k + j, from the chunk's
  // scales in row-major order ([16 rows][n_groups], two vectors).
  const __m512i* order = plan.order;
  auto to_rows = [&](int k, __m512i v0, __m512i v1) __attribute__((always_inline)) {
    for (int g = 0; g < n_groups; ++g) {
      _mm512_store_ps(
          sc + g * kAccRows + 16 * k,
          _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(v0, order[g], v1))));
    }
  };
  auto four = [&](int b) __attribute__((always_inline)) {  // groups [b, b + 32)
    const __m256i y0 = _mm256_set_m128i(window(b + 8), window(b));
    const __m256i y1 = _mm256_set_m128i(window(b + 24), window(b + 16));
    return _mm512_inserti64x4(_mm512_castsi256_si512(y0), y1, 1);
  };
  for (int k = 0; 16 * k < n_rows; ++k) {
    const int b = 16 * k * n_groups;
    const __m512i v0 = four(b);
    to_rows(k, v0, n_groups > 2 ? four(b + 32) : v0);
  }
}

// The 16 levels of a 4-bit format as floats (q4_0: q - 8; q4_nl: kQ4NlLevels[q]).
template <KvRowFormat F>
inline __m512 Levels16() {
  if constexpr (F == KvRowFormat::kQ4Nl) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kQ4NlLevels))));
  } else {
    return _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  }
}

// Columns [col, col + 16 * kV) of one row (col a multiple of 32) as floats.
// sc: the row's group scales (TileScales, stride kAccRows).
template <KvRowFormat F, int kV>
inline void DecodeColumns(const uint8_t* row, const float* sc, int col, __m512 levels, __m512* v) {
  if constexpr (F == KvRowFormat::kF16) {
    for (int k = 0; k < kV; ++k) {
      v[k] = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * (col + 16 * k))));
    }
  } else if constexpr (F == KvRowFormat::kInt8) {
    for (int k = 0; k < kV; k += 2) {
      const uint8_t* grp = row + (col / kGroup + k / 2) * (2 + kGroup);  // [f16 d][32 int8]
      const __m512 d = _mm512_set1_ps(sc[(col / kGroup + k / 2) * kAccRows]);
      for (int h = 0; h < 2; ++h) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 2 + 16 * h));
        v[k + h] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
      }
    }
  } else {
    for (int k = 0; k < kV; k += 2) {
      const uint8_t* grp = row + (col / kGroup + k / 2) * (2 + kGroup / 2);  // [f16 d][16 bytes]
      const __m512 table =                                                   // d * level, by nibble
          _mm512_mul_ps(_mm512_set1_ps(sc[(col / kGroup + k / 2) * kAccRows]), levels);
      // vpermps reads the low 4 bits of each index: the low nibbles need no mask.
      const __m512i b =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 2)));
      v[k] = _mm512_permutexvar_ps(b, table);
      v[k + 1] = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
    }
  }
}

// kNq queries over rows [j0, j1), columns [col, col + 16 * kV). Query q's weights are
// p[q * p_stride + j] and its accumulators acc[q * acc_stride + c]: one base and one stride, not
// an array of pointers, so that GCC keeps every accumulator in a register (with 4 + 4 pointers it
// spilled two accumulators to the stack, a store-to-load chain per row that halved the loop).
template <KvRowFormat F, int kNq, int kV>
inline void AccumulateBlock(const uint8_t* rows, size_t row_bytes, const float* sc, int col, int j0,
                            int j1, const float* p, int64_t p_stride, float* acc,
                            int64_t acc_stride) {
  const __m512 levels = Levels16<F>();
  __m512 a[kNq][kV];
  for (int q = 0; q < kNq; ++q) {
    for (int k = 0; k < kV; ++k) a[q][k] = _mm512_loadu_ps(acc + q * acc_stride + col + 16 * k);
  }
  const uint8_t* row = rows + static_cast<size_t>(j0) * row_bytes;
  for (int j = j0; j < j1; ++j, row += row_bytes) {
    __m512 v[kV];
    DecodeColumns<F, kV>(row, sc + j, col, levels, v);
    for (int q = 0; q < kNq; ++q) {
      const __m512 pj = _mm512_set1_ps(p[q * p_stride + j]);
      for (int k = 0; k < kV; ++k) a[q][k] = _mm512_fmadd_ps(pj, v[k], a[q][k]);
    }
  }
  for (int q = 0; q < kNq; ++q) {
    for (int k = 0; k < kV; ++k) _mm512_storeu_ps(acc + q * acc_stride + col + 16 * k, a[q][k]);
  }
}

// Queries [0, n) of a block (n <= kAccQueries), their weights and accumulators as in
// AccumulateBlock; rows [0, common) are every query's, query q's own run up to end[q].
template <KvRowFormat F, int kV>
inline void AccumulateColumns(const uint8_t* rows, size_t row_bytes, const float* sc, int col,
                              int n, int common, const int* end, const float* p, int64_t p_stride,
                              float* acc, int64_t acc_stride) {
  switch (n) {
    case 1:
      AccumulateBlock<F, 1, kV>(rows, row_bytes, sc, col, 0, common, p, p_stride, acc, acc_stride);
      break;
    case 2:
      AccumulateBlock<F, 2, kV>(rows, row_bytes, sc, col, 0, common, p, p_stride, acc, acc_stride);
      break;
    case 3:
      AccumulateBlock<F, 3, kV>(rows, row_bytes, sc, col, 0, common, p, p_stride, acc, acc_stride);
      break;
    default:
      AccumulateBlock<F, 4, kV>(rows, row_bytes, sc, col, 0, common, p, p_stride, acc, acc_stride);
      break;
  }
  // Each query's own rows past the common ones, in the same row order.
  for (int q = 0; q < n; ++q) {
    if (end[q] > common) {
      AccumulateBlock<F, 1, kV>(rows, row_bytes, sc, col, common, end[q], p + q * p_stride,
                                p_stride, acc + q * acc_stride, acc_stride);
    }
  }
}

// Rows [0, n_rows) (n_rows <= kAccRows): lim and p relative to the first row.
template <KvRowFormat F>
void AccumulatePass(const uint8_t* rows, int n_rows, int head_dim, int nq, const float* p,
                    int64_t p_stride, const int* lim, float* acc) {
  const size_t row_bytes = KvRowBytes(F, head_dim);
  alignas(64) float sc[kMaxHeadDim / kGroup * kAccRows];  // [group][row] the rows' scales
  if constexpr (F != KvRowFormat::kF16) {
    TileScales(rows, n_rows, row_bytes, head_dim / kGroup, sc);
  }
  for (int q0 = 0; q0 < nq; q0 += kAccQueries) {
    const int n = std::min(kAccQueries, nq - q0);
    const float* pq = p + q0 * p_stride;                    // [n][p_stride]
    float* aq = acc + static_cast<int64_t>(q0) * head_dim;  // [n][head_dim]
    int end[kAccQueries];
    int common = n_rows;  // rows every query of the block reads
    for (int q = 0; q < n; ++q) {
      end[q] = std::clamp(lim[q0 + q], 0, n_rows);
      common = std::min(common, end[q]);
    }
    int col = 0;
    for (; col + 16 * kAccVectors <= head_dim; col += 16 * kAccVectors) {
      AccumulateColumns<F, kAccVectors>(rows, row_bytes, sc, col, n, common, end, pq, p_stride, aq,
                                        head_dim);
    }
    if (col < head_dim) {
      AccumulateColumns<F, 2>(rows, row_bytes, sc, col, n, common, end, pq, p_stride, aq, head_dim);
    }
  }
}

// Rows whose groups are not whole vectors (head_dim < 32): the AVX-512 decoder and
// accumulate_rows, passes of kAccRows rows, so that they keep the bits of the tile path.
template <KvRowFormat F>
void AccumulateDecoded(const uint8_t* rows, int n_rows, int head_dim, int nq, const float* p,
                       int64_t p_stride, const int* lim, float* acc) {
  // Chosen once: asking Highway for the CPU's targets is a CPUID, slow on a VM.
  static const KvRowDecodeFn decode = Avx512KvRowDecoder(F);
  static const AttentionRowKernels* const rk = Avx512AttentionRowKernels();
  if (decode == nullptr || rk == nullptr || head_dim >= kGroup) {
    ScalarKvAccumulator(F)(rows, n_rows, head_dim, nq, p, p_stride, lim, acc);
    return;
  }
  const size_t row_bytes = KvRowBytes(F, head_dim);
  alignas(64) float x[kAccRows * kGroup];  // [kAccRows][head_dim] one pass's decoded rows
  for (int j0 = 0; j0 < n_rows; j0 += kAccRows) {
    const int nr = std::min(kAccRows, n_rows - j0);
    decode(rows + j0 * row_bytes, nr, head_dim, x);
    for (int q = 0; q < nq; ++q) {
      const int m = std::clamp(lim[q] - j0, 0, nr);
      if (m > 0) {
        rk->accumulate_rows(p + q * p_stride + j0, x, m, head_dim,
                            acc + static_cast<int64_t>(q) * head_dim);
      }
    }
  }
}

template <KvRowFormat F>
void Accumulate(const uint8_t* rows, int n_rows, int head_dim, int nq, const float* p,
                int64_t p_stride, const int* lim, float* acc) {
  if (head_dim % kGroup != 0 || head_dim > kMaxHeadDim) {
    AccumulateDecoded<F>(rows, n_rows, head_dim, nq, p, p_stride, lim, acc);
    return;
  }
  const size_t row_bytes = KvRowBytes(F, head_dim);
  // The caller's next tile of rows usually follows these (a hint: it never faults); not f16's
  // (kPrefetchCells).
  if constexpr (F != KvRowFormat::kF16) PrefetchAhead(rows, 2 * n_rows, row_bytes, n_rows, n_rows);
  // Passes of kAccRows rows in row order: every accumulator still takes its rows in order.
  int rel[kMaxPassQueries];  // [nq] the limits relative to the pass
  for (int j0 = 0; j0 < n_rows; j0 += kAccRows) {
    const int nr = std::min(kAccRows, n_rows - j0);
    for (int q0 = 0; q0 < nq; q0 += kMaxPassQueries) {
      const int n = std::min(kMaxPassQueries, nq - q0);
      for (int q = 0; q < n; ++q) rel[q] = lim[q0 + q] - j0;
      AccumulatePass<F>(rows + j0 * row_bytes, nr, head_dim, n, p + q0 * p_stride + j0, p_stride,
                        rel, acc + static_cast<int64_t>(q0) * head_dim);
    }
  }
}

// Integer V sums in int16 pairs of rows (kv_decode.h). Per pass of up to kIntAccRows rows, each
// block of up to 4 queries first quantizes its weights p * d per group to int16 (the row's sign
// included), two rows to a dword ([query][group][row pair]): the (query, group) slots 8 at a time,
// so that one reduction tree and one division serve 8 maxima and the slots' chains overlap. Then,
// per row pair and group, both rows' 16 code bytes are zero-extended to dwords, the second
// row's shifted to the high words, and split into nibbles, so that dword lane c holds column c's
// level of the two rows (low nibbles: the group's columns 0..15, high: 16..31), and vpdpwssd
// multiplies them by each query's broadcast weight pair: 4 queries x 2 halves = 8 independent
// chains per group. (Two groups at once, 16 chains, measured slower: GCC 12 copied the
// accumulators between registers every row pair.)
static_assert(kIntAccRows == kAccRows, "a pass's scales fill one [group][kAccRows] table");
constexpr int kInt16Queries = 4;  // queries per register block
constexpr int kInt16Pairs = kIntAccRows / 2;

// The levels of two rows' nibbles, one group: a and b the rows' 16 code bytes; lo / hi dword
// lane c = (row a, row b) levels of column c / 16 + c as int16. Each row's bytes are
// zero-extended to dwords (one load-and-extend each), row b's moved to the high words.
// int8 rows: a and b the rows' 32 codes, each sign-extended to words (one load-and-extend) and
// the two rows' words interleaved within 128-bit lanes, so that dword lane 4l + i of lo / hi
// holds column 8l + i / 8l + 4 + i (l, i < 4): Int8PairOrder puts the sums back in column order.
template <KvRowFormat F>
inline void PairLevels(const uint8_t* a, const uint8_t* b, __m512i table, __m512i* lo,
                       __m512i* hi) {
  if constexpr (F == KvRowFormat::kInt8) {
    const __m512i wa =
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
    const __m512i wb =
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    *lo = _mm512_unpacklo_epi16(wa, wb);
    *hi = _mm512_unpackhi_epi16(wa, wb);
    return;
  }
  const __m512i wa = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
  const __m512i wb = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
  const __m512i w = _mm512_or_si512(wa, _mm512_slli_epi32(wb, 16));  // word 2c + r: byte c of r
  const __m512i l = _mm512_and_si512(w, _mm512_set1_epi16(0x0F));
  const __m512i h = _mm512_srli_epi16(w, 4);
  if constexpr (F == KvRowFormat::kQ4Nl) {
    *lo = _mm512_permutexvar_epi16(l, table);
    *hi = _mm512_permutexvar_epi16(h, table);
  } else {
    *lo = _mm512_sub_epi16(l, table);  // table: 8 in every word
    *hi = _mm512_sub_epi16(h, table);
  }
}

// An int8 group's two sums from PairLevels' lane order to columns 0..15 (*lo) and 16..31 (*hi).
inline void Int8PairOrder(__m512i* lo, __m512i* hi) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  const __m512i a = _mm512_permutex2var_epi32(*lo, first, *hi);
  *hi = _mm512_permutex2var_epi32(*lo, second, *hi);
  *lo = a;
}

// kNq queries, groups [g, g + kG): row pairs [0, n_pairs) of a pass of n_rows rows; wq the
// queries' weight pairs [query][group][pair]; accumulates into acc[q] + 32 g.. unless step is 0
// (NaN: the group's sums become NaN).
template <KvRowFormat F, int kNq, int kG>
inline void Int16Dots(const uint8_t* rows, int n_rows, size_t row_bytes, size_t group_bytes, int g,
                      int n_pairs, const int32_t (*wq)[kMaxHeadDim / kGroup][kInt16Pairs],
                      const float (*step)[kMaxHeadDim / kGroup], float* const* acc) {
  const __m512i table = F == KvRowFormat::kQ4Nl
                            ? _mm512_cvtepi8_epi16(_mm256_castsi128_si256(
                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(kQ4NlLevels))))
                            : _mm512_set1_epi16(8);
  __m512i a[kNq][kG][2];  // [query][group][low, high nibbles] exact int32 sums
#pragma GCC unroll 8
  for (int q = 0; q < kNq; ++q) {
#pragma GCC unroll 8
    for (int gi = 0; gi < kG; ++gi) a[q][gi][0] = a[q][gi][1] = _mm512_setzero_si512();
  }
  for (int k = 0; k < n_pairs; ++k) {
    const uint8_t* r0 = rows + 2 * k * row_bytes + g * group_bytes + 2;
    // A missing second row (an odd pass) repeats the first: its weight is 0.
    const uint8_t* r1 = 2 * k + 1 < n_rows ? r0 + row_bytes : r0;
    __m512i lv[kG][2];  // [group][low, high nibbles]
#pragma GCC unroll 8
    for (int gi = 0; gi < kG; ++gi) {
      PairLevels<F>(r0 + gi * group_bytes, r1 + gi * group_bytes, table, &lv[gi][0], &lv[gi][1]);
    }
#pragma GCC unroll 8
    for (int q = 0; q < kNq; ++q) {
#pragma GCC unroll 8
      for (int gi = 0; gi < kG; ++gi) {
        const __m512i b = _mm512_set1_epi32(wq[q][g + gi][k]);
        a[q][gi][0] = _mm512_dpwssd_epi32(a[q][gi][0], lv[gi][0], b);
        a[q][gi][1] = _mm512_dpwssd_epi32(a[q][gi][1], lv[gi][1], b);
      }
    }
  }
#pragma GCC unroll 8
  for (int q = 0; q < kNq; ++q) {
#pragma GCC unroll 8
    for (int gi = 0; gi < kG; ++gi) {
      const float s = step[q][g + gi];
      if (s == 0.0f) continue;
      float* ag = acc[q] + (g + gi) * kGroup;
      if (s != s) {  // a weight not finite
        std::fill(ag, ag + kGroup, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      if constexpr (F == KvRowFormat::kInt8) Int8PairOrder(&a[q][gi][0], &a[q][gi][1]);
#pragma GCC unroll 8
      for (int h = 0; h < 2; ++h) {
        _mm512_storeu_ps(ag + 16 * h,
                         _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[q][gi][h]), _mm512_set1_ps(s),
                                         _mm512_loadu_ps(ag + 16 * h)));
      }
    }
  }
}

// Not inlined: inside the pass, GCC 12 copied the 8 accumulators between registers every row
// pair (16 extra moves per 8 vpdpwssd).
template <KvRowFormat F, int kNq>
__attribute__((noinline)) void Int16DotsAllGroups(
    const uint8_t* rows, int n_rows, size_t row_bytes, size_t group_bytes, int n_groups,
    int n_pairs, const int32_t (*wq)[kMaxHeadDim / kGroup][kInt16Pairs],
    const float (*step)[kMaxHeadDim / kGroup], float* const* acc) {
  for (int g = 0; g < n_groups; ++g) {
    Int16Dots<F, kNq, 1>(rows, n_rows, row_bytes, group_bytes, g, n_pairs, wq, step, acc);
  }
}

// One query's weights of a pass: rows below m loaded, the rest zero; a negative weight is 0
// (max with the zero first keeps a NaN).
inline void LoadTileWeights(const float* p_row, int m, __mmask16* mk, __m512* pv) {
  const uint64_t rows = m >= 64 ? ~0ull : (1ull << m) - 1;  // bit j: row j (0 <= m <= 64)
  for (int k = 0; k < 4; ++k) {
    mk[k] = static_cast<__mmask16>(rows >> (16 * k));
    pv[k] = _mm512_max_ps(_mm512_setzero_ps(), _mm512_maskz_loadu_ps(mk[k], p_row + 16 * k));
  }
}

// A group's signed weights p·d per row (sc_g: the pass's scales d of that group), the lane
// maxima of |p·d| in *amax_v, and the mask of lanes whose weight is not finite. |p·d| is
// p·|d| bit for bit: a product's rounding does not depend on its sign. kFull: the query reads
// every row of a whole pass (mk unused; the same products, no masked loads).
template <bool kFull = false>
inline __mmask16 GroupWeights(const __mmask16* mk, const __m512* pv, const float* sc_g, __m512* w,
                              __m512* amax_v) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const __m512 flt_max = _mm512_set1_ps(std::numeric_limits<float>::max());
  __m512 amax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int k = 0; k < 4; ++k) {
    if constexpr (kFull) {
      w[k] = _mm512_mul_ps(pv[k], _mm512_load_ps(sc_g + 16 * k));
    } else {
      w[k] = _mm512_maskz_mul_ps(mk[k], pv[k], _mm512_maskz_load_ps(mk[k], sc_g + 16 * k));
    }
    const __m512 a = _mm512_and_ps(w[k], abs_mask);
    amax = _mm512_max_ps(amax, a);
    bad |= _mm512_cmp_ps_mask(a, flt_max, _CMP_NLE_UQ);
  }
  *amax_v = amax;
  return bad;
}

// The codes of one group's signed weights w [4][16 rows] at inv = kInt16AccWeightMax / amax,
// rounded half even (|w| <= amax keeps them within +-kInt16AccWeightMax; the sign is the
// row's), stored two rows to a dword in row order: wq[k] = (row 2k, row 2k + 1).
inline void StoreWeightCodes(const __m512* w, __m512 inv, int32_t* wq) {
  // Word i of a pair of dword vectors (x, y): the low half of x[i] for i < 16, else of y[i - 16].
  const __m512i even =
      _mm512_setr_epi32(0x00020000, 0x00060004, 0x000A0008, 0x000E000C, 0x00120010, 0x00160014,
                        0x001A0018, 0x001E001C, 0x00220020, 0x00260024, 0x002A0028, 0x002E002C,
                        0x00320030, 0x00360034, 0x003A0038, 0x003E003C);
  __m512i c[4];
  for (int k = 0; k < 4; ++k) c[k] = _mm512_cvtps_epi32(_mm512_mul_ps(w[k], inv));
  _mm512_store_si512(wq, _mm512_permutex2var_epi16(c[0], even, c[1]));
  _mm512_store_si512(wq + 16, _mm512_permutex2var_epi16(c[2], even, c[3]));
}

// One (pass, query block)'s prepared weights: what its dot loop reads.
struct Int16Block {
  alignas(64) int32_t wq[kInt16Queries][kMaxHeadDim / kGroup][kInt16Pairs];  // weight pairs
  // [query][group] the step; 0: nothing to add; NaN: a weight not finite (the sums become NaN)
  float step[kInt16Queries][kMaxHeadDim / kGroup];
  float* aq[kInt16Queries];  // [n] the queries' accumulators
  const uint8_t* rows;       // the pass's first row
  int n_rows;                // rows of the pass
  int n;                     // queries of the block
  int n_pairs;               // row pairs some query of the block reads (0: none)
};

// Quantizes the weights of queries [q0, q0 + n) (n <= kInt16Queries) over rows [0, n_rows)
// (n_rows <= kIntAccRows) of a call whose first row is j0 rows earlier: a query reads rows below
// lim[qi] - j0; p points at the pass's first weight; sc the pass's scales [group][row]. One
// (query, group) slot at a time, its weights in registers from the products to the codes, its
// maximum and divisions its own: slots batched 8 at a time (one reduction tree and one vector
// division for the batch, the weights kept on the stack between) ran the int16 V sums 3-6% slower
// on an AMD EPYC (Zen 5).
template <KvRowFormat F>
void PrepareInt16Block(const uint8_t* rows, int n_rows, int head_dim, int q0, int n, const float* p,
                       int64_t p_stride, const int* lim, int j0, const float* sc, float* acc,
                       Int16Block* blk) {
  const int n_groups = head_dim / kGroup;
  blk->rows = rows;
  blk->n_rows = n_rows;
  blk->n = n;
  int m_max = 0;
  for (int qq = 0; qq < n; ++qq) {
    const int qi = q0 + qq;
    blk->aq[qq] = acc + static_cast<int64_t>(qi) * head_dim;
    const int m = std::clamp(lim[qi] - j0, 0, n_rows);
    m_max = std::max(m_max, m);
    __mmask16 mk[4];  // [16-row chunk] rows below the query's limit
    __m512 pv[4];     // [16-row chunk] its weights
    // A query that reads the whole pass (every pass of a decode step but the last) takes no masks:
    // its masked loads and products cost the int16 V sums 4-9% on an AMD EPYC (Zen 5).
    const bool full = m == kIntAccRows;
    if (full) {
      for (int k = 0; k < 4; ++k) {
        pv[k] = _mm512_max_ps(_mm512_setzero_ps(), _mm512_loadu_ps(p + qi * p_stride + 16 * k));
      }
    } else {
      LoadTileWeights(p + qi * p_stride, m, mk, pv);
    }
    for (int g = 0; g < n_groups; ++g) {
      __m512 w[4];  // [16-row chunk] the signed weights p·d
      __m512 amax_v;
      const __mmask16 bad = full ? GroupWeights<true>(mk, pv, sc + g * kAccRows, w, &amax_v)
                                 : GroupWeights(mk, pv, sc + g * kAccRows, w, &amax_v);
      float& step = blk->step[qq][g];
      step = 0.0f;
      if (bad != 0) {
        step = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const float a = _mm512_reduce_max_ps(amax_v);
      if (!(a >= 1e-30f)) continue;
      step = a / static_cast<float>(kInt16AccWeightMax);
      StoreWeightCodes(w, _mm512_set1_ps(static_cast<float>(kInt16AccWeightMax) / a),
                       blk->wq[qq][g]);
    }
  }
  blk->n_pairs = (m_max + 1) / 2;
}

// The dot loop of a prepared block: its sums added to the queries' accumulators (NaN where a
// weight was not finite).
template <KvRowFormat F>
void RunInt16Block(const Int16Block& blk, int head_dim) {
  if (blk.n_pairs == 0) return;
  const size_t row_bytes = KvRowBytes(F, head_dim);
  const int n_groups = head_dim / kGroup;
  const size_t group_bytes = row_bytes / n_groups;
  switch (blk.n) {
    case 1:
      Int16DotsAllGroups<F, 1>(blk.rows, blk.n_rows, row_bytes, group_bytes, n_groups, blk.n_pairs,
                               blk.wq, blk.step, blk.aq);
      break;
    case 2:
      Int16DotsAllGroups<F, 2>(blk.rows, blk.n_rows, row_bytes, group_bytes, n_groups, blk.n_pairs,
                               blk.wq, blk.step, blk.aq);
      break;
    case 3:
      Int16DotsAllGroups<F, 3>(blk.rows, blk.n_rows, row_bytes, group_bytes, n_groups, blk.n_pairs,
                               blk.wq, blk.step, blk.aq);
      break;
    default:
      Int16DotsAllGroups<F, 4>(blk.rows, blk.n_rows, row_bytes, group_bytes, n_groups, blk.n_pairs,
                               blk.wq, blk.step, blk.aq);
      break;
  }
}

// Passes of kIntAccRows rows from the first, query blocks of kInt16Queries within each, as one
// sequence of blocks whose weights are prepared one block ahead: block i + 1's preparation (a
// chain of reductions, a division and conversions, independent of block i's sums) comes before
// block i's dot loop, so that the core runs the two side by side. Each block's sums are added in
// pass order as before, and a pass's scales are read when its first block is prepared, which
// also prefetches the next pass's rows (past the call: a hint for the caller's next rows).
template <KvRowFormat F>
void Int16Accumulate(const uint8_t* rows, int n_rows, int head_dim, int nq, const float* p,
                     int64_t p_stride, const int* lim, float* acc) {
  const size_t row_bytes = KvRowBytes(F, head_dim);
  if (head_dim % kGroup != 0) {
    // One float call per pass: it adds the same rows in the same order, and prefetches only
    // the next pass's rows.
    for (int j0 = 0; j0 < n_rows; j0 += kIntAccRows) {
      const int nr = std::min(kIntAccRows, n_rows - j0);
      int rel[kMaxPassQueries];  // [nq] the limits relative to the pass
      for (int q0 = 0; q0 < nq; q0 += kMaxPassQueries) {
        const int n = std::min(kMaxPassQueries, nq - q0);
        for (int q = 0; q < n; ++q) rel[q] = lim[q0 + q] - j0;
        Accumulate<F>(rows + j0 * row_bytes, nr, head_dim, n, p + q0 * p_stride + j0, p_stride, rel,
                      acc + static_cast<int64_t>(q0) * head_dim);
      }
    }
    return;
  }
  if (head_dim > kMaxHeadDim) {
    ScalarKvInt16Accumulator(F)(rows, n_rows, head_dim, nq, p, p_stride, lim, acc);
    return;
  }
  const int n_groups = head_dim / kGroup;
  const int n_blocks = (nq + kInt16Queries - 1) / kInt16Queries;
  const int n_passes = (n_rows + kIntAccRows - 1) / kIntAccRows;
  const int n_items = n_passes * n_blocks;
  alignas(64) float sc[kMaxHeadDim / kGroup * kAccRows];  // [group][row] one pass's scales d
  Int16Block blk[2];                                      // blocks i and i + 1
  const Scales4BitPlan plan = MakeScales4BitPlan(row_bytes, n_groups);
  int t = 0, b = 0;  // the next block to prepare: pass t, query block b
  auto prepare = [&](Int16Block* out) {
    const int j0 = t * kIntAccRows, nr = std::min(kIntAccRows, n_rows - j0);
    const uint8_t* pass = rows + j0 * row_bytes;
    if (b == 0) {
      PrefetchAhead(rows, j0 + 2 * nr, row_bytes, j0 + nr, nr);
      if constexpr (F == KvRowFormat::kInt8) {
        TileScales(pass, nr, row_bytes, n_groups, sc);
      } else {
        TileScales4Bit(plan, pass, nr, sc);
      }
    }
    const int q0 = b * kInt16Queries;
    PrepareInt16Block<F>(pass, nr, head_dim, q0, std::min(kInt16Queries, nq - q0), p + j0, p_stride,
                         lim, j0, sc, acc, out);
    if (++b == n_blocks) {
      b = 0;
      ++t;
    }
  };
  if (n_items == 0) return;
  prepare(&blk[0]);
  for (int i = 0; i < n_items; ++i) {
    if (i + 1 < n_items) prepare(&blk[(i + 1) & 1]);
    RunInt16Block<F>(blk[i & 1], head_dim);
  }
}
}  // namespace

KvAccumulateFn Avx512KvInt16Accumulator(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kInt8:
      return Int16Accumulate<KvRowFormat::kInt8>;
    case KvRowFormat::kQ4_0:
      return Int16Accumulate<KvRowFormat::kQ4_0>;
    case KvRowFormat::kQ4Nl:
      return Int16Accumulate<KvRowFormat::kQ4Nl>;
    default:
      return nullptr;
  }
}

KvAccumulateFn Avx512KvAccumulator(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kF16:
      return Accumulate<KvRowFormat::kF16>;
    case KvRowFormat::kInt8:
      return Accumulate<KvRowFormat::kInt8>;
    case KvRowFormat::kQ4_0:
      return Accumulate<KvRowFormat::kQ4_0>;
    case KvRowFormat::kQ4Nl:
      return Accumulate<KvRowFormat::kQ4Nl>;
    default:
      return nullptr;
  }
}

KvF16TileScoreFn Avx512KvF16TileScorer() { return ScoreF16Tiles; }

KvTileScoreFn Avx512KvTileScorer(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kInt8:
      return ScoreTiles<KvRowFormat::kInt8, 128, 34, ExpandTileGroupInt8>;
    case KvRowFormat::kQ4_0:
      return ScoreTiles<KvRowFormat::kQ4_0, 8, 18, ExpandTileGroupQ4>;
    default:
      return nullptr;
  }
}

KvScoreFn Avx512KvScorer(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kInt8:
      return ScoreBytes<KvRowFormat::kInt8, 128, 34, ExpandGroupInt8>;
    case KvRowFormat::kQ4_0:
      return ScoreBytes<KvRowFormat::kQ4_0, 8, 18, ExpandGroupQ4>;
    default:
      return nullptr;
  }
}

}  // namespace lamina
