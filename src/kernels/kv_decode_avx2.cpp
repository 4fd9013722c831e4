// AVX2 + F16C integer K scorers and fused V accumulation (twins of the scalar ones in
// kv_decode.cpp; the plain row decoders are in kv_decode_hwy.cpp).
//
// Scorer layout: a block of 8 cells is expanded once into int16 codes in natural order (an
// L1-resident buffer shared by every query of the call); each query, put back into natural
// order once per call, meets them with vpmaddwd, so each cell's group dot is an exact int32
// whatever the summation order. Eight cells' partial-sum vectors reduce to one vector of 8
// cell sums by an hadd tree, and the float steps (fma with d_k * d_q per group, then the
// scale) are the scalar twin's, lane by lane, so the results agree bit for bit.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/kv_decode.h"

namespace lamina {

namespace {
// q4_nl: nibbles to their int8 levels with one byte shuffle.
inline __m128i Q4NlLevelBytes(__m128i nibbles) {
  const __m128i lut = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kQ4NlLevels));
  return _mm_shuffle_epi8(lut, nibbles);
}

constexpr int kGroup = 32;      // values per scale
constexpr int kBlockCells = 8;  // cells expanded at once
constexpr int kMaxHeadDim = 512;
constexpr int kMaxQueries = 32;  // queries de-interleaved at once

// Lane j = the sum of the 8 int32 lanes of a[j].
inline __m256i ReduceCells8(const __m256i a[8]) {
  const __m256i s01 = _mm256_hadd_epi32(a[0], a[1]);
  const __m256i s23 = _mm256_hadd_epi32(a[2], a[3]);
  const __m256i s45 = _mm256_hadd_epi32(a[4], a[5]);
  const __m256i s67 = _mm256_hadd_epi32(a[6], a[7]);
  const __m256i s0123 = _mm256_hadd_epi32(s01, s23);
  const __m256i s4567 = _mm256_hadd_epi32(s45, s67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20),
                          _mm256_permute2x128_si256(s0123, s4567, 0x31));
}

// codes [kBlockCells][head_dim] int16 in natural element order, dk [n_groups][kBlockCells].
template <KvRowFormat F>
void ExpandBlock(const uint8_t* rows, size_t row_bytes, int head_dim, int n_valid, int16_t* codes,
                 float* dk) {
  const int n_groups = head_dim / kGroup;
  const size_t group_bytes = row_bytes / n_groups;
  for (int c = 0; c < kBlockCells; ++c) {
    int16_t* out = codes + static_cast<size_t>(c) * head_dim;
    if (c >= n_valid) {  // padding cells score 0 and are never stored
      std::memset(out, 0, sizeof(int16_t) * head_dim);
      for (int g = 0; g < n_groups; ++g) dk[g * kBlockCells + c] = 0.0f;
      continue;
    }
    const uint8_t* row = rows + c * row_bytes;
    for (int g = 0; g < n_groups; ++g) {
      const uint8_t* grp = row + g * group_bytes;
      fp16_t d16;
      std::memcpy(&d16, grp, 2);
      dk[g * kBlockCells + c] = _cvtsh_ss(d16);
      __m128i lo, hi;  // elements 0..15 and 16..31 as signed bytes
      if constexpr (F == KvRowFormat::kInt8) {
        lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 2));
        hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 18));
      } else {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 2));
        const __m128i nib = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
        lo = _mm_sub_epi8(_mm_and_si128(b, nib), eight);
        hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), nib), eight);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + g * kGroup), _mm256_cvtepi8_epi16(lo));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + g * kGroup + 16),
                          _mm256_cvtepi8_epi16(hi));
    }
  }
}

template <KvRowFormat F>
void ScoreQueries(const uint8_t* rows, int n_rows, int head_dim, int nq, const int16_t* qq,
                  const float* qd, float scale, float* out, int64_t out_stride) {
  const int n_groups = head_dim / kGroup;
  const size_t row_bytes = KvRowBytes(F, head_dim);
  // Queries in natural order: [nq][head_dim] (QuantizeQueryInt16 stores evens, then odds).
  alignas(32) int16_t qn[kMaxQueries * kMaxHeadDim];
  for (int qi = 0; qi < nq; ++qi) {
    for (int k = 0; k < head_dim; k += 16) {
      const int16_t* src = qq + static_cast<int64_t>(qi) * head_dim + k;
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      const __m128i o = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 8));
      int16_t* dst = qn + static_cast<int64_t>(qi) * head_dim + k;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_unpacklo_epi16(e, o));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 8), _mm_unpackhi_epi16(e, o));
    }
  }
  alignas(32) int16_t codes[kBlockCells * kMaxHeadDim];      // [cell][head_dim]
  alignas(32) float dk[kMaxHeadDim / kGroup * kBlockCells];  // [group][cell]
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int j = 0; j < n_rows; j += kBlockCells) {
    const int n_valid = std::min(kBlockCells, n_rows - j);
    ExpandBlock<F>(rows + j * row_bytes, row_bytes, head_dim, n_valid, codes, dk);
    for (int qi = 0; qi < nq; ++qi) {
      const int16_t* qv = qn + static_cast<int64_t>(qi) * head_dim;
      const float* qs = qd + static_cast<int64_t>(qi) * n_groups;
      __m256 s = _mm256_setzero_ps();
      for (int g = 0; g < n_groups; ++g) {
        const __m256i q0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(qv + g * kGroup));
        const __m256i q1 =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(qv + g * kGroup + 16));
        __m256i acc[kBlockCells];
        for (int c = 0; c < kBlockCells; ++c) {
          const int16_t* cc = codes + c * head_dim + g * kGroup;
          acc[c] = _mm256_add_epi32(
              _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(cc)), q0),
              _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(cc + 16)), q1));
        }
        const __m256 f = _mm256_mul_ps(_mm256_load_ps(dk + g * kBlockCells), _mm256_set1_ps(qs[g]));
        s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ReduceCells8(acc)), f, s);
      }
      s = _mm256_mul_ps(s, vscale);
      float* o = out + qi * out_stride + j;
      if (n_valid == kBlockCells) {
        _mm256_storeu_ps(o, s);
      } else {
        alignas(32) float tmp[kBlockCells];
        _mm256_store_ps(tmp, s);
        std::memcpy(o, tmp, sizeof(float) * n_valid);
      }
    }
  }
}
template <KvRowFormat F>
void Score(const uint8_t* rows, int n_rows, int head_dim, int nq, const int16_t* qq,
           const float* qd, float scale, float* out, int64_t out_stride) {
  if (head_dim > kMaxHeadDim) {
    ScalarKvScorer(F)(rows, n_rows, head_dim, nq, qq, qd, scale, out, out_stride);
    return;
  }
  // Queries are independent: chunks of kMaxQueries give each one the same bits.
  for (int q0 = 0; q0 < nq; q0 += kMaxQueries) {
    ScoreQueries<F>(rows, n_rows, head_dim, std::min(kMaxQueries, nq - q0),
                    qq + static_cast<int64_t>(q0) * head_dim, qd + q0 * (head_dim / kGroup), scale,
                    out + q0 * out_stride, out_stride);
  }
}
// int8 tiles (kv_format.h): per tile, half (8 cells, one per dword lane) and group, each chunk
// of 4 dims is one 32-byte load. vpmaddubsw takes the codes' magnitudes as unsigned bytes (at
// most 128) and the broadcast query chunk with the codes' signs (|q| <= 127), so a pair sums to
// at most 2 * 128 * 127 and never saturates; vpmaddwd by ones widens each cell's 4 products to
// one int32, so the group dot is exact and the float steps are the scalar twin's, lane by lane.
// (An unsigned query q + 128 against the signed codes would save the vpsignb, but a pair can
// reach 2 * 255 * 127 > 32767 and saturate, so the signs stay on the query.) Up to 4 queries
// meet each loaded chunk (its load and vpabsb shared), their dots and scores kept in registers
// for the whole half tile; per chunk and query: a broadcast load, vpsignb, vpmaddubsw,
// vpmaddwd, vpaddd.
constexpr int kTileQueries = 4;  // queries per register block

// Scores of the 8 cells of half h of one tile against kNq queries: q32 [kNq][head_dim / 4]
// (int8 codes in element order, four to a dword), qd [kNq][n_groups], stored at out (cell 0 of
// the half) where mask is set (every lane when mask is null).
template <int kNq>
inline void ScoreTileHalf(const uint8_t* tile, size_t tile_group, int h, int n_groups,
                          const int32_t* q32, int64_t q32_stride, const float* qd, __m256 vscale,
                          const __m256i* mask, float* out, int64_t out_stride) {
  constexpr int kTile = kKvTileCells;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 s[kNq];  // per query: its scores of the 8 cells
  for (int qi = 0; qi < kNq; ++qi) s[qi] = _mm256_setzero_ps();
  for (int g = 0; g < n_groups; ++g) {
    const uint8_t* grp = tile + g * tile_group;
    const uint8_t* codes = grp + 2 * kTile + 4 * kBlockCells * h;  // chunk t at 64 t
    __m256i dot[kNq];
    for (int qi = 0; qi < kNq; ++qi) dot[qi] = _mm256_setzero_si256();
    for (int t = 0; t < kGroup / 4; ++t) {
      const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 4 * kTile * t));
      const __m256i a = _mm256_abs_epi8(k);
      for (int qi = 0; qi < kNq; ++qi) {
        const __m256i q = _mm256_set1_epi32(q32[qi * q32_stride + g * (kGroup / 4) + t]);
        const __m256i p = _mm256_maddubs_epi16(a, _mm256_sign_epi8(q, k));
        dot[qi] = _mm256_add_epi32(dot[qi], _mm256_madd_epi16(p, ones));
      }
    }
    const __m256 dk = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 2 * kBlockCells * h)));
    for (int qi = 0; qi < kNq; ++qi) {
      const __m256 f = _mm256_mul_ps(dk, _mm256_set1_ps(qd[qi * n_groups + g]));
      s[qi] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[qi]), f, s[qi]);
    }
  }
  for (int qi = 0; qi < kNq; ++qi) {
    const __m256 v = _mm256_mul_ps(s[qi], vscale);
    if (mask == nullptr) {
      _mm256_storeu_ps(out + qi * out_stride, v);
    } else {
      _mm256_maskstore_ps(out + qi * out_stride, *mask, v);
    }
  }
}

// Queries in element order as int8, four to a dword: q32 [nq][head_dim / 4]. Each run of 16
// int16 codes in qq holds evens first, then odds (QuantizeQueryInt16): interleaved back and
// packed (|code| <= 127). q32 is 16-byte aligned; head_dim a multiple of 16.
inline void PackQueryBytes(const int16_t* qq, int nq, int head_dim, int32_t* q32) {
  const int q32_stride = head_dim / 4;
  for (int qi = 0; qi < nq; ++qi) {
    for (int k = 0; k < head_dim; k += 16) {
      const int16_t* src = qq + static_cast<int64_t>(qi) * head_dim + k;
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      const __m128i o = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 8));
      const __m128i b = _mm_packs_epi16(_mm_unpacklo_epi16(e, o), _mm_unpackhi_epi16(e, o));
      _mm_store_si128(reinterpret_cast<__m128i*>(q32 + qi * q32_stride + k / 4), b);
    }
  }
}

// Calls half(tile, h, m, o) for each half tile (kBlockCells cells; h = 0, 1) holding a cell of
// [first, first + n_cells), counted from the first tile's start: tile is the tile's index, o the
// half's first cell's offset from `first` (may be negative), m the wanted lanes' mask (first <=
// cell < first + n_cells), nullptr when every lane is wanted.
template <typename HalfFn>
inline void ForEachHalfTile(int first, int n_cells, HalfFn&& half) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int end = first + n_cells;
  for (int c = 0; c < end; c += kKvTileCells) {
    for (int h = 0; h < 2; ++h) {
      const int base = c + kBlockCells * h;  // cell of lane 0
      if (base + kBlockCells <= first || base >= end) continue;
      const __m256i cell = _mm256_add_epi32(lane, _mm256_set1_epi32(base));
      const __m256i mask = _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(first), cell),
                                               _mm256_cmpgt_epi32(_mm256_set1_epi32(end), cell));
      half(c / kKvTileCells, h, base >= first && base + kBlockCells <= end ? nullptr : &mask,
           base - first);
    }
  }
}

void ScoreTilesQueries(const uint8_t* tiles, int first, int n_cells, int head_dim, int nq,
                       const int16_t* qq, const float* qd, float scale, float* out,
                       int64_t out_stride) {
  constexpr int kTile = kKvTileCells;
  const int n_groups = head_dim / kGroup;
  const size_t tile_group = static_cast<size_t>(kTile) * (2 + kGroup);
  const size_t tile_bytes = tile_group * n_groups;
  const int q32_stride = head_dim / 4;
  alignas(32) int32_t q32[kMaxQueries * kMaxHeadDim / 4];  // [nq][head_dim / 4] int8 x 4
  PackQueryBytes(qq, nq, head_dim, q32);
  const __m256 vscale = _mm256_set1_ps(scale);
  ForEachHalfTile(first, n_cells, [&](int t, int h, const __m256i* m, int offset) {
    const uint8_t* tile = tiles + t * tile_bytes;
    float* o = out + offset;
    for (int q0 = 0; q0 < nq; q0 += kTileQueries) {
      const int32_t* qv = q32 + q0 * q32_stride;
      const float* qs = qd + q0 * n_groups;
      float* oq = o + q0 * out_stride;
      switch (std::min(kTileQueries, nq - q0)) {
        case 1:
          ScoreTileHalf<1>(tile, tile_group, h, n_groups, qv, q32_stride, qs, vscale, m, oq,
                           out_stride);
          break;
        case 2:
          ScoreTileHalf<2>(tile, tile_group, h, n_groups, qv, q32_stride, qs, vscale, m, oq,
                           out_stride);
          break;
        case 3:
          ScoreTileHalf<3>(tile, tile_group, h, n_groups, qv, q32_stride, qs, vscale, m, oq,
                           out_stride);
          break;
        default:
          ScoreTileHalf<4>(tile, tile_group, h, n_groups, qv, q32_stride, qs, vscale, m, oq,
                           out_stride);
          break;
      }
    }
  });
}

void ScoreTiles(const uint8_t* tiles, int first, int n_cells, int head_dim, int nq,
                const int16_t* qq, const float* qd, float scale, float* out, int64_t out_stride) {
  if (head_dim > kMaxHeadDim) {
    ScalarKvTileScorer()(tiles, first, n_cells, head_dim, nq, qq, qd, scale, out, out_stride);
    return;
  }
  for (int q0 = 0; q0 < nq; q0 += kMaxQueries) {
    ScoreTilesQueries(tiles, first, n_cells, head_dim, std::min(kMaxQueries, nq - q0),
                      qq + static_cast<int64_t>(q0) * head_dim, qd + q0 * (head_dim / kGroup),
                      scale, out + q0 * out_stride, out_stride);
  }
}

// q4_0 tiles (kv_format.h): per tile, half (8 cells, one per dword lane) and group, each chunk of
// 4 code bytes is one 32-byte load whose low nibbles are dims 4t..4t+3 and high nibbles dims
// 16+4t..16+4t+3, as unsigned bytes for vpmaddubsw against the broadcast query chunk. A pair
// sums to at most 2 * 15 * 127 and the 8 products of a group to 30,480 in int16, so the int16
// sum is exact; one vpmaddwd by ones widens it to each cell's int32, and the zero point comes off
// as 8 times the query's group sum: the scalar twin's exact group dot, then its float steps.
void ScoreQ4TilesQueries(const uint8_t* tiles, int first, int n_cells, int head_dim, int nq,
                         const int16_t* qq, const float* qd, float scale, float* out,
                         int64_t out_stride) {
  constexpr int kTile = 16, kCodeBytes = kGroup / 2;
  const int n_groups = head_dim / kGroup;
  const size_t tile_group = static_cast<size_t>(kTile) * (2 + kCodeBytes);
  const size_t tile_bytes = tile_group * n_groups;
  // Queries in element order as int8, four to a dword: [nq][head_dim / 4]; zero [nq][n_groups]
  // = -8 times each group's code sum.
  alignas(32) int32_t q32[kMaxQueries * kMaxHeadDim / 4];
  int32_t zero[kMaxQueries * kMaxHeadDim / kGroup];
  PackQueryBytes(qq, nq, head_dim, q32);
  for (int qi = 0; qi < nq; ++qi) {
    const auto* codes =
        reinterpret_cast<const int8_t*>(q32 + static_cast<int64_t>(qi) * (head_dim / 4));
    for (int g = 0; g < n_groups; ++g) {
      int32_t sum = 0;
      for (int i = g * kGroup; i < (g + 1) * kGroup; ++i) sum += codes[i];
      zero[qi * n_groups + g] = -8 * sum;
    }
  }
  const __m256i ones = _mm256_set1_epi16(1), nib = _mm256_set1_epi8(0x0F);
  const __m256 vscale = _mm256_set1_ps(scale);
  const int end = first + n_cells;  // cells counted from the first tile's start
  for (int c = 0; c < end; c += kTile) {
    const uint8_t* tile = tiles + (c / kTile) * tile_bytes;
    for (int h = 0; h < 2; ++h) {
      const int base = c + kBlockCells * h;  // cell of lane 0
      if (base + kBlockCells <= first || base >= end) continue;
      alignas(32) int32_t want[kBlockCells];
      for (int l = 0; l < kBlockCells; ++l) want[l] = base + l >= first && base + l < end ? -1 : 0;
      const __m256i mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(want));
      __m256 s[kMaxQueries];  // per query: its scores of the 8 cells
      for (int qi = 0; qi < nq; ++qi) s[qi] = _mm256_setzero_ps();
      for (int g = 0; g < n_groups; ++g) {
        const uint8_t* grp = tile + g * tile_group;
        const uint8_t* codes = grp + 2 * kTile + 4 * kBlockCells * h;  // chunk t at 64 t
        // The group's nibbles as bytes, once for every query: k[t] dims 4t..4t+3 (t < 8).
        __m256i k[kGroup / 4];
        for (int t = 0; t < kCodeBytes / 4; ++t) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * t));
          k[t] = _mm256_and_si256(v, nib);
          k[4 + t] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
        }
        const __m256 dk = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 2 * kBlockCells * h)));
        for (int qi = 0; qi < nq; ++qi) {
          const int32_t* qv = q32 + static_cast<int64_t>(qi) * (head_dim / 4) + g * kGroup / 4;
          __m256i p[kGroup / 4];  // summed as a tree (the int16 sum is exact in any order)
          for (int t = 0; t < kGroup / 4; ++t) {
            p[t] = _mm256_maddubs_epi16(k[t], _mm256_set1_epi32(qv[t]));
          }
          for (int w = kGroup / 8; w > 0; w /= 2) {
            for (int t = 0; t < w; ++t) p[t] = _mm256_add_epi16(p[t], p[t + w]);
          }
          const __m256i p16 = p[0];
          const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(p16, ones),
                                               _mm256_set1_epi32(zero[qi * n_groups + g]));
          const __m256 f = _mm256_mul_ps(dk, _mm256_set1_ps(qd[qi * n_groups + g]));
          s[qi] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), f, s[qi]);
        }
      }
      for (int qi = 0; qi < nq; ++qi) {
        _mm256_maskstore_ps(out + qi * out_stride + (base - first), mask,
                            _mm256_mul_ps(s[qi], vscale));
      }
    }
  }
}

void ScoreQ4Tiles(const uint8_t* tiles, int first, int n_cells, int head_dim, int nq,
                  const int16_t* qq, const float* qd, float scale, float* out, int64_t out_stride) {
  if (head_dim > kMaxHeadDim) {
    ScalarKvTileScorer(KvRowFormat::kQ4_0)(tiles, first, n_cells, head_dim, nq, qq, qd, scale, out,
                                           out_stride);
    return;
  }
  for (int q0 = 0; q0 < nq; q0 += kMaxQueries) {
    ScoreQ4TilesQueries(tiles, first, n_cells, head_dim, std::min(kMaxQueries, nq - q0),
                        qq + static_cast<int64_t>(q0) * head_dim, qd + q0 * (head_dim / kGroup),
                        scale, out + q0 * out_stride, out_stride);
  }
}

// Fused V decode + weighted accumulation: 16 columns of each row are decoded into registers
// once and meet up to 4 queries' weights, so the row is never written out as floats. The
// values and the fma order per accumulator are those of DecodeInt8 / DecodeQ4 / DecodeF16
// followed by the AVX2 accumulate_rows, so the result is the same bits.
constexpr int kAccQueries = 4;  // queries per register block (8 accumulators)

// Columns [col, col + 16) of one row as floats.
template <KvRowFormat F>
inline void DecodeColumns16(const uint8_t* row, int head_dim, int col, __m256* v0, __m256* v1) {
  if constexpr (F == KvRowFormat::kF16) {
    const uint8_t* h = row + 2 * col;
    *v0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
    *v1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 16)));
  } else {
    constexpr int g = kGroup;  // head_dim % 32 == 0 here
    const uint8_t* grp = row + (col / g) * (2 + (F == KvRowFormat::kInt8 ? g : g / 2));
    static_assert(F == KvRowFormat::kInt8 || F == KvRowFormat::kQ4_0 || F == KvRowFormat::kQ4Nl);
    fp16_t d16;
    std::memcpy(&d16, grp, 2);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(d16));
    __m256i a, b;
    if constexpr (F == KvRowFormat::kInt8) {
      const int8_t* q = reinterpret_cast<const int8_t*>(grp + 2 + col % g);
      a = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
      b = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8)));
    } else if constexpr (F == KvRowFormat::kQ4Nl) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 2));
      const __m128i nib = col % g == 0
                              ? _mm_and_si128(bytes, _mm_set1_epi8(0x0F))
                              : _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
      const __m128i lv = Q4NlLevelBytes(nib);
      a = _mm256_cvtepi8_epi32(lv);
      b = _mm256_cvtepi8_epi32(_mm_srli_si128(lv, 8));
    } else {
      const uint8_t* qs = grp + 2;
      const __m256i eight = _mm256_set1_epi32(8), low_mask = _mm256_set1_epi32(0x0F);
      a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
      b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
      if (col % g == 0) {
        a = _mm256_sub_epi32(_mm256_and_si256(a, low_mask), eight);
        b = _mm256_sub_epi32(_mm256_and_si256(b, low_mask), eight);
      } else {
        a = _mm256_sub_epi32(_mm256_srli_epi32(a, 4), eight);
        b = _mm256_sub_epi32(_mm256_srli_epi32(b, 4), eight);
      }
    }
    *v0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(a));
    *v1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(b));
  }
}

// kNq queries (1..4) over rows [j0, j1) of 16 columns.
template <KvRowFormat F, int kNq>
inline void AccumulateBlock(const uint8_t* rows, size_t row_bytes, int head_dim, int col, int j0,
                            int j1, const float* const* p, float* const* acc) {
  __m256 a[kNq][2];
  for (int q = 0; q < kNq; ++q) {
    a[q][0] = _mm256_loadu_ps(acc[q] + col);
    a[q][1] = _mm256_loadu_ps(acc[q] + col + 8);
  }
  for (int j = j0; j < j1; ++j) {
    __m256 v0, v1;
    DecodeColumns16<F>(rows + j * row_bytes, head_dim, col, &v0, &v1);
    for (int q = 0; q < kNq; ++q) {
      const __m256 pj = _mm256_broadcast_ss(p[q] + j);
      a[q][0] = _mm256_fmadd_ps(pj, v0, a[q][0]);
      a[q][1] = _mm256_fmadd_ps(pj, v1, a[q][1]);
    }
  }
  for (int q = 0; q < kNq; ++q) {
    _mm256_storeu_ps(acc[q] + col, a[q][0]);
    _mm256_storeu_ps(acc[q] + col + 8, a[q][1]);
  }
}

template <KvRowFormat F>
void AccumulateEncoded(const uint8_t* rows, int n_rows, int head_dim, int nq, const float* p,
                       int64_t p_stride, const int* lim, float* acc) {
  if (head_dim % 32 != 0) {
    ScalarKvAccumulator(F)(rows, n_rows, head_dim, nq, p, p_stride, lim, acc);
    return;
  }
  const size_t row_bytes = KvRowBytes(F, head_dim);
  for (int q0 = 0; q0 < nq; q0 += kAccQueries) {
    const int n = std::min(kAccQueries, nq - q0);
    const float* pq[kAccQueries];
    float* aq[kAccQueries];
    int common = n_rows;  // rows every query of the block reads
    for (int q = 0; q < n; ++q) {
      pq[q] = p + (q0 + q) * p_stride;
      aq[q] = acc + static_cast<int64_t>(q0 + q) * head_dim;
      common = std::min(common, std::max(0, std::min(lim[q0 + q], n_rows)));
    }
    for (int col = 0; col < head_dim; col += 16) {
      switch (n) {
        case 1:
          AccumulateBlock<F, 1>(rows, row_bytes, head_dim, col, 0, common, pq, aq);
          break;
        case 2:
          AccumulateBlock<F, 2>(rows, row_bytes, head_dim, col, 0, common, pq, aq);
          break;
        case 3:
          AccumulateBlock<F, 3>(rows, row_bytes, head_dim, col, 0, common, pq, aq);
          break;
        default:
          AccumulateBlock<F, 4>(rows, row_bytes, head_dim, col, 0, common, pq, aq);
          break;
      }
      // Each query's own rows past the common ones, in the same row order.
      for (int q = 0; q < n; ++q) {
        const int end = std::min(lim[q0 + q], n_rows);
        if (end > common) {
          AccumulateBlock<F, 1>(rows, row_bytes, head_dim, col, common, end, pq + q, aq + q);
        }
      }
    }
  }
}

// f16 K tiles (kv_format.h, kv_decode.h): per half tile (8 cells, lane = cell) and dim, one
// 16-byte load and one vcvtph2ps shared by up to 3 queries; each query's chain i % 4 takes one
// fma with its element i broadcast. 3 queries x 4 chains are 12 independent accumulators (16
// ymm registers hold 4 queries' 16 only with nothing left for K); the chains' sums and the
// scale are lane-wise, in the scalar twin's order. kTail: head_dim % 4 != 0, its own instance
// (as the AVX-512 scorer's: the tail and a loop that may run zero times made GCC keep the
// accumulators in a stack array, stored every 4 dims).
constexpr int kF16Queries = 3;

template <int kNq, bool kTail>
inline void ScoreF16HalfQueries(const uint8_t* half, int head_dim, const float* q, __m256 vscale,
                                const __m256i* mask, float* out, int64_t out_stride) {
  __m256 acc[kNq][4];  // [query][chain]
  for (int m = 0; m < kNq; ++m) {
    for (int l = 0; l < 4; ++l) acc[m][l] = _mm256_setzero_ps();
  }
  // Dim i of the half tile's 8 cells: 16 bytes at 32 i.
  auto load = [&](int i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(half + 32 * i)));
  };
  int i = 0;
  auto four_dims = [&] {
    for (int l = 0; l < 4; ++l) {
      const __m256 kv = load(i + l);
      for (int m = 0; m < kNq; ++m) {
        acc[m][l] = _mm256_fmadd_ps(_mm256_broadcast_ss(q + m * head_dim + i + l), kv, acc[m][l]);
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
      const __m256 kv = load(i + l);
      for (int m = 0; m < kNq; ++m) {
        acc[m][l] = _mm256_fmadd_ps(_mm256_broadcast_ss(q + m * head_dim + i + l), kv, acc[m][l]);
      }
    }
  }
  for (int m = 0; m < kNq; ++m) {
    const __m256 s =
        _mm256_add_ps(_mm256_add_ps(acc[m][0], acc[m][2]), _mm256_add_ps(acc[m][1], acc[m][3]));
    const __m256 r = _mm256_mul_ps(s, vscale);
    if (mask == nullptr) {
      _mm256_storeu_ps(out + m * out_stride, r);
    } else {
      _mm256_maskstore_ps(out + m * out_stride, *mask, r);
    }
  }
}

template <bool kTail>
void ScoreF16TilesOf(const uint8_t* tiles, int first, int n_cells, int head_dim, int nq,
                     const float* q, float scale, float* out, int64_t out_stride) {
  constexpr int kTile = kKvTileCells;
  const size_t tile_bytes = KvRowBytes(KvRowFormat::kF16, head_dim) * kTile;
  const __m256 vscale = _mm256_set1_ps(scale);
  ForEachHalfTile(first, n_cells, [&](int t, int h, const __m256i* m, int offset) {
    const uint8_t* tile = tiles + t * tile_bytes;
    float* o = out + offset;
    const uint8_t* half = tile + 2 * kBlockCells * h;
    // Runs of 3 queries; 4 left go as 2 + 2 (8 chains each) rather than 3 + 1 (4 chains).
    for (int q0 = 0, run; q0 < nq; q0 += run) {
      run = nq - q0 == 4 ? 2 : std::min(kF16Queries, nq - q0);
      const float* qv = q + static_cast<int64_t>(q0) * head_dim;
      float* oq = o + q0 * out_stride;
      switch (run) {
        case 1:
          ScoreF16HalfQueries<1, kTail>(half, head_dim, qv, vscale, m, oq, out_stride);
          break;
        case 2:
          ScoreF16HalfQueries<2, kTail>(half, head_dim, qv, vscale, m, oq, out_stride);
          break;
        default:
          ScoreF16HalfQueries<3, kTail>(half, head_dim, qv, vscale, m, oq, out_stride);
          break;
      }
    }
  });
}

void ScoreF16Tiles(const uint8_t* tiles, int first, int n_cells, int head_dim, int nq,
                   const float* q, float scale, float* out, int64_t out_stride) {
  if (head_dim % 4 == 0) {
    ScoreF16TilesOf<false>(tiles, first, n_cells, head_dim, nq, q, scale, out, out_stride);
  } else {
    ScoreF16TilesOf<true>(tiles, first, n_cells, head_dim, nq, q, scale, out, out_stride);
  }
}

}  // namespace

KvAccumulateFn Avx2KvAccumulator(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kF16:
      return AccumulateEncoded<KvRowFormat::kF16>;
    case KvRowFormat::kInt8:
      return AccumulateEncoded<KvRowFormat::kInt8>;
    case KvRowFormat::kQ4_0:
      return AccumulateEncoded<KvRowFormat::kQ4_0>;
    case KvRowFormat::kQ4Nl:
      return AccumulateEncoded<KvRowFormat::kQ4Nl>;
    default:
      return nullptr;
  }
}

KvTileScoreFn Avx2KvTileScorer(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kInt8:
      return ScoreTiles;
    case KvRowFormat::kQ4_0:
      return ScoreQ4Tiles;
    default:
      return nullptr;
  }
}

KvF16TileScoreFn Avx2KvF16TileScorer() { return ScoreF16Tiles; }

KvScoreFn Avx2KvScorer(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kInt8:
      return Score<KvRowFormat::kInt8>;
    case KvRowFormat::kQ4_0:
      return Score<KvRowFormat::kQ4_0>;
    default:
      return nullptr;
  }
}

}  // namespace lamina
