// Storage formats of one KV head row (head_dim values), the Walsh-Hadamard rotation used before
// 4-bit quantization, and the row codecs. Each format is a POD layout:
//   f32   : float[head_dim]
//   f16   : fp16[head_dim] (round to nearest even)
//   int8  : groups of G = min(32, head_dim) values: { fp16 d; int8 q[G] }, symmetric,
//           q = round-half-even(x / d_stored) clamped to [-127, 127]; d = amax / (127 - 0.25 s),
//           s in [0, 40] chosen for the least squared error (s = 0 is amax / 127; coarse-to-fine)
//   q4_0  : groups of G = min(32, head_dim): { fp16 d; uint8 qs[G/2] } as GGML Q4_0, decoded as
//           x = d * (q - 8); element i in the low nibble of qs[i], element i + G/2 in the high
//           nibble. Encoding: q = trunc(x / d + 8.5) clamped to [0, 15] (GGML's rounding), with
//           d = m / (-8 + 0.1 s), m the signed value of largest magnitude and s in [-20, 20]
//           chosen for the least squared error (s = 0 is GGML's own scale; the search lowers
//           the error by ~6% for 32-value blocks and ~13% for 8-value blocks).
//   q4_nl : the q4_0 block layout with non-uniform levels: x = d * kQ4NlLevels[q], the 16 int8
//           levels of a Lloyd-Max quantizer fitted to 32-value Gaussian blocks divided by their
//           signed largest value (what rotated V rows look like). Encoding: q = the nearest
//           level of x / d, d = m / (125 (1 + 0.01 s)), m the signed value of largest magnitude
//           and s in [-20, 20] chosen for the least squared error (s = 0 maps m to the top
//           level). 12% less squared error than q4_0 with its scale search at the same bytes.
//   int8 tiles (the cache's int8 keys): kKvTileCells = 16 consecutive cells of one KV head in
//           the bytes of their 16 rows (16 * KvRowBytes(kInt8, head_dim)), group by group: per
//           group g of G values, at g * 16 * (2 + G): fp16 d[16] (cell c's scale at d[c]), then
//           the codes in chunks of 4 dims, chunk t (dims 4t .. 4t + w - 1, w = min(4, G - 4t))
//           holding cell c's w codes at byte 64t + c * w. For G a multiple of 4 a chunk is one
//           64-byte vector with one cell per 32-bit lane, ready for vpdpbusd against a
//           broadcast 4-byte query chunk (32 dims x 16 cells: 8 vpdpbusd per query, no
//           transpose). Codes are stored signed, as in the rows (an all-zero tile is 16 zero
//           rows, so Truncate and ZeroCells stay plain memsets; the AVX-512 scorer shifts them
//           by +128 with one xor per 64 bytes, shared by every query of a tile). A cell's row
//           converts to and from its tile slot byte for byte (TileKvRow / UntileKvRow).
//   q4_0 tiles (the cache's q4_0 keys): the int8 tile layout over each row's code bytes, i.e.
//           b = G/2 nibble bytes per cell and group instead of G: per group g at
//           g * 16 * (2 + G/2): fp16 d[16], then chunk t of 4 code bytes (qs[4t .. 4t + w - 1],
//           w = min(4, G/2 - 4t)) holding cell c's w bytes at byte 64t + c * w. For G = 32 a
//           group is 32 + 4 * 64 = 288 bytes and chunk t (t < 4) is one 64-byte vector, cell c
//           in dword lane c, whose low nibbles are dims 4t .. 4t+3 and high nibbles dims
//           16 + 4t .. 16 + 4t + 3 (the row's own nibble order): one load, one vpand gives the
//           unsigned codes of 4 dims x 16 cells and one vpsrlw + vpand those of the 4 dims 16
//           further, each ready for vpdpbusd against a broadcast 4-byte query chunk; the
//           zero point 8 comes off per query and group, as for rows. Keeping the row's nibble
//           pairing (dims i and i + 16 in one byte) costs 3 ops per 64 bytes of codes (8
//           vpdpbusd operands per group from 4 loads), as cheap as any other pairing, and keeps
//           the tile <-> row conversion a byte copy. An all-zero tile is 16 zero rows.
//           The anchored form (runtime/kv_cache.h) adds no per-group terms: its flag byte
//           per cell stays outside the tile.
//   f16 tiles (the cache's f16 keys): kKvTileCells = 16 consecutive cells of one KV head in
//           the bytes of their 16 rows, dim-major: fp16 h[head_dim][16], cell c's element i at
//           h[i][c]. One dim of 16 cells is one 32-byte run (one vcvtph2ps to a zmm, lane =
//           cell), met by one fma per query with the query's element broadcast: no transpose,
//           no reduction across lanes (kv_decode.h gives the scorer's summation order). An
//           all-zero tile is 16 zero rows.
// Stochastic rounding replaces the round-to-nearest step by floor(y + u), u in [0, 1) drawn
// from a counter-based hash of (seed, layer, position, element), so the bytes stored for a cell
// depend only on its values and coordinates, never on the order of writes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "util/fp16.h"

namespace lamina {

enum class KvRowFormat { kF32, kF16, kInt8, kQ4_0, kQ4Nl };

// The q4_nl levels (ascending; decoded value = d * level).
inline constexpr int8_t kQ4NlLevels[16] = {-114, -93, -76, -61, -46, -33, -19, -6,
                                           7,    21,  35,  49,  64,  81,  101, 125};

// Bytes of one encoded head row; 0 when the format cannot hold head_dim (int8/q4_0/q4_nl need
// head_dim < 32 and even, or a multiple of 32).
size_t KvRowBytes(KvRowFormat format, int head_dim);
int KvGroupSize(int head_dim);  // min(32, head_dim)

// Coordinates that key stochastic rounding.
struct RoundingKey {
  uint64_t seed = 0;
  uint32_t layer = 0;
  uint32_t position = 0;
  uint32_t element0 = 0;  // index of x[0] within the cell's row (head * head_dim)
};

// Encodes head_dim floats. key == nullptr: round to nearest (even for int8, half-up for q4_0
// as GGML does); otherwise stochastic.
void EncodeKvRow(KvRowFormat format, const float* x, int head_dim, const RoundingKey* key,
                 uint8_t* out);
// Decodes one head row to floats.
void DecodeKvRow(KvRowFormat format, const uint8_t* row, int head_dim, float* out);

// Key tiles (int8, q4_0 or f16 rows; layout above): cells per tile, and the conversions of one
// cell's row (head_dim values, KvRowBytes(format, head_dim) bytes) to and from its slot `cell` of a
// tile.
inline constexpr int kKvTileCells = 16;
void TileKvRow(const uint8_t* row, int head_dim, uint8_t* tile, int cell,
               KvRowFormat format = KvRowFormat::kInt8);
void UntileKvRow(const uint8_t* tile, int cell, int head_dim, uint8_t* row,
                 KvRowFormat format = KvRowFormat::kInt8);
// Decodes cells [first, first + n) of the consecutive tiles at `tiles` (first <
// kKvTileCells) into out [n, head_dim]: the values DecodeKvRow gives for their rows.
void DecodeKvTileCells(const uint8_t* tiles, int first, int n, int head_dim, float* out,
                       KvRowFormat format = KvRowFormat::kInt8);

// Uniform [0, 1) from the counter-based hash (SplitMix64 finaliser over the packed key).
float StochasticUniform(const RoundingKey& key, uint32_t element);

// Normalised Walsh-Hadamard rotation with fixed pseudo-random signs (seed kRotationSeed):
// y = H (s ⊙ x) / sqrt(B) over each block of B = the largest power of two dividing n.
// Orthonormal, so dot products are preserved: (Rq)·(Rk) = q·k. Inverse: InverseRotate.
constexpr uint64_t kRotationSeed = 0x6C616D696E61ull;  // "lamina"
int RotationBlock(int n);
void Rotate(float* x, int n);
void InverseRotate(float* x, int n);

}  // namespace lamina
