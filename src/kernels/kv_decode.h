// Fast decoders of KV head rows (see kv_format.h for the layouts): a scalar twin and one Highway
// source compiled for AVX2 + F16C and for AVX-512 (kv_decode_hwy.cpp), same signature, chosen
// once.
//
// Integer scores: int8 and q4_0 K rows can be scored against a query without decoding them to
// floats. The query is quantized once per 32-value group (QuantizeQueryInt16) and each group's
// dot product with the stored codes is an exact int32; a cell's score is then
//   s = 0; for each group g: s = fma(float(dot_g), d_k[g] * d_q[g], s); out = s * scale
// in that order, so the scalar twin and the SIMD variant agree bit for bit and a score depends
// only on the query and the cell. The query codes span int8, [-127, 127] (GGML's own q8_0
// query for Q8_0 and Q4_0 keys: a step of 1/127 of the group's largest value), which lets the
// AVX-512 scorer multiply the stored codes as unsigned bytes with vpdpbusd: int8 codes shifted
// by +128, dot_g = sum q_i (c_i + 128) - 128 sum q_i; q4_0 nibbles as stored,
// dot_g = sum q_i c_i - 8 sum q_i; the second sum once per query and group. (int8 K took int16
// query codes, ~15 bits per group, until the scorer moved to vpdpbusd; docs/KV.md.)
#pragma once

#include <cstdint>

#include "kernels/kv_format.h"

namespace lamina {

// Decodes n_rows consecutive head rows (each KvRowBytes(format, head_dim) bytes) into
// out [n_rows, head_dim].
using KvRowDecodeFn = void (*)(const uint8_t* rows, int n_rows, int head_dim, float* out);

KvRowDecodeFn ScalarKvRowDecoder(KvRowFormat format);
KvRowDecodeFn Avx2KvRowDecoder(KvRowFormat format);    // nullptr when none
KvRowDecodeFn Avx512KvRowDecoder(KvRowFormat format);  // nullptr when none
KvRowDecodeFn BestKvRowDecoder(KvRowFormat format);

// Weighted sum of encoded rows: acc[qi * head_dim + i] += sum_{j < lim[qi]} p[qi * p_stride + j]
// * row_j[i] for qi < nq (lim[qi] clamped to [0, n_rows]), each accumulator updated in row
// order with the decoder's values. The scalar twin decodes each row and adds p * x; the SIMD
// variants decode columns into registers and fuse the multiply-add, giving the bits of the
// same ISA's decoder followed by its attention accumulate_rows.
using KvAccumulateFn = void (*)(const uint8_t* rows, int n_rows, int head_dim, int nq,
                                const float* p, int64_t p_stride, const int* lim, float* acc);

KvAccumulateFn ScalarKvAccumulator(KvRowFormat format);
KvAccumulateFn Avx2KvAccumulator(KvRowFormat format);    // nullptr when none
KvAccumulateFn Avx512KvAccumulator(KvRowFormat format);  // nullptr when none
// The widest fused kernel the CPU runs, else nullptr (no SIMD, or f32 rows): the caller
// decodes tiles and accumulates them with the attention row kernels.
KvAccumulateFn BestKvAccumulator(KvRowFormat format);

// Integer V sums of int8 and 4-bit rows (int8, q4_0, q4_nl; head_dim a multiple of 32, else
// the float accumulator above): the KvAccumulateFn contract for softmax weights (p >= 0; a negative
// weight, -inf included, counts as 0) with each query's weights quantized. Rows are taken in
// passes of kIntAccRows from the first; per pass, query and 32-column group:
//   w_j = max(p_j, 0) * |d_j| (float; d_j the row's group scale; rows j < the query's limit)
//   amax = max_j w_j; nothing is added when amax < 1e-30, NaN when a w_j is not finite
//   c_j = clamp(round_half_even(w_j * (kInt16AccWeightMax / amax)), 0, kInt16AccWeightMax)
//   for each column: v = sum_j c_j * s_j * L_j (exact int32; L_j the stored level, int8: the
//   code, q4_0: the nibble - 8, q4_nl: kQ4NlLevels[nibble]; s_j the sign of d_j; at most
//   64 rows x 32767 x 128 < 2^28 in size, well inside int32)
//   acc = fma(float(v), amax / kInt16AccWeightMax, acc)
// A weight keeps 15 bits relative to the largest of its pass and group, and its code with the
// row's sign, c_j * s_j, is an int16. The AVX-512 kernel rounds the signed products p_j * d_j
// (|p_j * d_j| is w_j bit for bit, and rounding half even is symmetric), widens the levels of
// two rows to int16 once per pass (the same words for every query) and multiplies them by both
// rows' weights at once with vpdpwssd: per 2 rows, query and 32 columns 2 instructions where the
// float kernel runs 8 fma (int8 rows: both rows' 32 codes sign-extended to words and
// interleaved, the sums put back in column order once per pass). It gives the scalar twin's
// bits; BestKvAccumulator chooses it for int8, q4_0 and q4_nl rows on AVX-512 (the 2e-3
// attention bound holds; docs/KV.md "Integer V sums in int16 pairs"). (An 8-bit variant, vpdpbusd
// on byte weights, missed that bound and was removed.) A query's result depends only on its own
// weights and the rows it reads.
constexpr int kIntAccRows = 64;
constexpr int kInt16AccWeightMax = 32767;
// nullptr unless int8 / q4_0 / q4_nl
KvAccumulateFn ScalarKvInt16Accumulator(KvRowFormat format);
KvAccumulateFn Avx512KvInt16Accumulator(KvRowFormat format);  // nullptr when none

// Integer scoring needs int8 or q4_0 rows of whole 32-value groups (head_dim % 32 == 0).
bool KvIntScoreSupported(KvRowFormat format, int head_dim);

// The largest query code the scorer of K rows in `format` takes: 127 (int8 and q4_0).
int KvQueryCodeMax(KvRowFormat format);

// q [head_dim] -> qq [head_dim] int16 codes in [-KvQueryCodeMax(format), KvQueryCodeMax(format)]
// and qd [head_dim / 32] scales, q ≈ qd[g] * code, for scoring K rows in `format`.
// Within each run of 16 values the codes are stored evens first, then odds
// (qq[16k + m] = code(16k + 2m), qq[16k + 8 + m] = code(16k + 2m + 1), m < 8): the order in
// which the int16 SIMD scorers pair them with the row codes.
void QuantizeQueryInt16(KvRowFormat format, const float* q, int head_dim, int16_t* qq, float* qd);

// out[qi * out_stride + j] = score of query qi (qq + qi * head_dim, qd + qi * head_dim / 32,
// from QuantizeQueryInt16 with the rows' format) against row j, for qi < nq and j < n_rows
// (formula above).
using KvScoreFn = void (*)(const uint8_t* rows, int n_rows, int head_dim, int nq, const int16_t* qq,
                           const float* qd, float scale, float* out, int64_t out_stride);

KvScoreFn ScalarKvScorer(KvRowFormat format);  // nullptr unless int8 / q4_0
KvScoreFn Avx2KvScorer(KvRowFormat format);    // nullptr when none
KvScoreFn Avx512KvScorer(KvRowFormat format);  // nullptr when none
// The AVX-512 scorer when the CPU has AVX-512 VNNI, else the AVX2 one (vpmaddwd), else nullptr:
// without SIMD the decode-to-f32 path is faster than scalar integer scoring. Every variant
// gives the scalar twin's bits.
KvScoreFn BestKvScorer(KvRowFormat format);

// Integer scores of K tiles (kv_format.h; the cache's int8 and q4_0 keys): cells [first,
// first + n_cells) of the consecutive tiles at `tiles` (first < kKvTileCells: where scoring starts
// in the first tile), out[qi * out_stride + j] = the score of cell first + j against query qi, by
// the formula above: bit for bit what the row scorers give for the same cell's row. Whole tiles
// are read (never a tile past the one holding the last wanted cell); only wanted cells are
// written. head_dim a multiple of 32 (KvIntScoreSupported). The factories take the tiles' row
// format (int8 or q4_0; nullptr for others).
using KvTileScoreFn = void (*)(const uint8_t* tiles, int first, int n_cells, int head_dim, int nq,
                               const int16_t* qq, const float* qd, float scale, float* out,
                               int64_t out_stride);

KvTileScoreFn ScalarKvTileScorer(KvRowFormat format = KvRowFormat::kInt8);
// vpmaddubsw / vpmaddwd over 8 cells per ymm
KvTileScoreFn Avx2KvTileScorer(KvRowFormat format = KvRowFormat::kInt8);
// vpdpbusd over 16 cells per zmm (needs VNNI)
KvTileScoreFn Avx512KvTileScorer(KvRowFormat format = KvRowFormat::kInt8);
// The AVX-512 scorer when the CPU has AVX-512 VNNI, else the AVX2 one, else nullptr (as
// BestKvScorer: without SIMD attention decodes tiles to f32).
KvTileScoreFn BestKvTileScorer(KvRowFormat format = KvRowFormat::kInt8);

// f16 K scores of f16 tiles (kv_format.h; the cache's f16 keys) against float queries: cells
// [first, first + n_cells) of the consecutive tiles at `tiles` (first < kKvTileCells),
// out[qi * out_stride + j] = the score of cell first + j against query qi (q + qi * head_dim,
// [nq][head_dim]), any head_dim > 0. The canonical order, per query and cell: four fma chains
// over the dims i = 4t + l (chain l < 4, t ascending),
//   s_l = fma(q[i], k[i], s_l) from 0; out = ((s_0 + s_2) + (s_1 + s_3)) * scale
// with each step rounded as written. It depends on neither the number of queries nor the ISA,
// so every variant gives the scalar twin's bits and a score depends only on the query and the
// cell. The SIMD kernels hold one dim of 16 (AVX-512) or 8 (AVX2, each half of a tile) cells in
// the lanes of a vector, converted once, and run the four chains of up to 4 (AVX2: 3) queries at
// once, one fma per query and dim with the query element broadcast from memory: 16 (12)
// independent chains hide the fma latency, and the chains' sums are lane-wise adds. Whole tiles
// are read (never one past the tile holding the last wanted cell); only wanted cells are written.
using KvF16TileScoreFn = void (*)(const uint8_t* tiles, int first, int n_cells, int head_dim,
                                  int nq, const float* q, float scale, float* out,
                                  int64_t out_stride);

KvF16TileScoreFn ScalarKvF16TileScorer();
KvF16TileScoreFn Avx2KvF16TileScorer();    // nullptr when none
KvF16TileScoreFn Avx512KvF16TileScorer();  // nullptr when none
// The widest kernel the CPU (and LAMINA_ISA) allow, else the scalar twin: f16 keys are always
// scored from their tiles, so f16 attention gives the same bits on every ISA.
KvF16TileScoreFn BestKvF16TileScorer();

// Anchored keys' score corrections (runtime/kv_cache.h) over a run of n_cells cells in tiles
// of kAnchorTileCells (tile i: cells [64 i, 64 i + 64), its weights w_i = w + i * w_tile_stride):
// for each query qi < nq and flagged cell c = 64 i + k (flags[c] != 0) below
// min(lim[qi], n_cells),
//   sum = rest[qi]; for t < n_terms: sum = fma(w_i[t * nq + qi], tables[t * 64 + k], sum);
//   score = scores[qi * score_stride + c]; score = fma(scale * float(flags[c]), sum, score)
// with each step rounded as written (the sum is the fma chain accumulate_rows runs down one
// column; the last step one fma, as the AVX2 / AVX-512 kernels always computed it), so every
// variant gives the scalar twin's bits and a query's result depends only on its own inputs.
// Every other score, unflagged cells' included, is not touched: an unflagged cell's
// correction would be fma(scale * 0, sum, score) = score + (+/-0), which leaves every
// score but -0.0 as it is (that one would become +0.0, the same softmax weight: exp(+/-0) = 1),
// so skipping it changes no attention output. The SIMD kernels choose per tile (the bits are the
// same either way): with few flagged cells (at most 8, or kAnchorSparseCells for more than 4
// queries) they visit those cells only, the queries in the lanes (a cell's table column
// broadcast), collected over the run's sparse tiles so that eight cells' chains run at once
// whichever tiles they are in; with more, the cells in the lanes over the whole tile, storing
// the flagged ones. tables [n_terms][64] (whole rows, also past n_cells), w_i [n_terms][nq]
// (term-major: a term's weights of all the queries are consecutive; only tiles with a flagged
// cell are read), rest [nq], flags [n_cells], lim [nq] (relative to the run's first cell).
constexpr int kAnchorTileCells = 64;
constexpr int kAnchorSparseCells = 16;
using KvAnchorScoreFn = void (*)(const float* w, int64_t w_tile_stride, int n_terms,
                                 const float* tables, const float* rest, const uint8_t* flags,
                                 int n_cells, int nq, const int* lim, float scale, float* scores,
                                 int64_t score_stride);

KvAnchorScoreFn ScalarKvAnchorScorer();
KvAnchorScoreFn Avx2KvAnchorScorer();    // nullptr when none
KvAnchorScoreFn Avx512KvAnchorScorer();  // nullptr when none
KvAnchorScoreFn BestKvAnchorScorer();

}  // namespace lamina
