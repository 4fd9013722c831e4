// GGML tensor types and their POD block layouts. Numeric enum values match ggml/GGUF so that a
// type read from a file can be cast after IsKnownGgmlType(). Every block has a size static_assert.
#pragma once

#include <cstddef>
#include <cstdint>

#include "util/fp16.h"

namespace lamina {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,
  kQ2_0 = 42,
};

constexpr int64_t kQK = 32;     // elements per block of the legacy quants
constexpr int64_t kQK_K = 256;  // elements per super-block of the K-quants
constexpr int kKScaleSize = 12;

// 32 values: x = d * (q - 8); q low nibble holds element i, high nibble element i + 16.
struct BlockQ4_0 {
  fp16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// 32 values: x = d * q + m; nibble layout as Q4_0.
struct BlockQ4_1 {
  fp16_t d;
  fp16_t m;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// 32 values: x = d * (q - 16); 4 low bits in qs (as Q4_0), bit 4 of element i in qh bit i.
struct BlockQ5_0 {
  fp16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// 32 values: x = d * q + m; bits as Q5_0.
struct BlockQ5_1 {
  fp16_t d;
  fp16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// 32 values: x = d * q.
struct BlockQ8_0 {
  fp16_t d;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 34);

// 32 values: x = d * q; s = d * sum(q) (activation type for Q4_1 / Q5_1 dots).
struct BlockQ8_1 {
  fp16_t d;
  fp16_t s;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_1) == 36);

// 256 values in 16 groups of 16: x = d * scale4 * q2 - dmin * min4; scales byte = min4<<4 | scale4.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  fp16_t d;
  fp16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// 256 values in 16 groups of 16: x = d * (scale6 - 32) * (q2 + 4*hbit - 4); 6-bit scales packed in
// 12 bytes.
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  fp16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// 256 values in 8 groups of 32: x = d * scale6 * q4 - dmin * min6; scales/mins 6-bit packed in 12
// bytes.
struct BlockQ4_K {
  fp16_t d;
  fp16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// As Q4_K with a fifth bit per value in qh.
struct BlockQ5_K {
  fp16_t d;
  fp16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// 256 values in 16 groups of 16: x = d * scale8 * (q6 - 32); 4 low bits in ql, 2 high bits in qh.
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  fp16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// 256 values: x = d * q (activation type for the K-quant dots); bsums = sums of 16-value groups.
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == 292);

// The 16 levels of IQ4_NL and IQ4_XS (GGML's kvalues_iq4nl): x = d * level. Not lamina's q4_nl
// KV levels (kernels/kv_format.h), which were fitted to rotated V rows and differ.
inline constexpr int8_t kIq4NlLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// The 16 E2M1 (FP4) values of MXFP4, doubled so that they are integers: code c is sign bit 3,
// magnitude {0, 0.5, 1, 1.5, 2, 3, 4, 6}[c & 7]; x = level * E8M0ToF32Half(e).
inline constexpr int8_t kMxfp4Levels[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};

// Half the E8M0 scale 2^(e - 127), i.e. 2^(e - 128), as GGML computes it: e = 0 and 1 give the
// f32 subnormals 2^-128 and 2^-127, e = 255 gives 2^127 (E8M0's NaN code is not special-cased).
inline float E8M0ToF32Half(uint8_t e) {
  return BitsToF32(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
}

// 32 values: x = d * kIq4NlLevels[q]; q low nibble holds element i, high nibble element i + 16.
struct BlockIQ4_NL {
  fp16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// 256 values in 8 groups of 32: x = d * (scale6 - 32) * kIq4NlLevels[q]. Group g's 6-bit scale
// has its low 4 bits in scales_l[g / 2] (low nibble for even g) and its top 2 bits in bits
// 2g, 2g + 1 of scales_h; qs holds 16 bytes per group, nibbles as IQ4_NL.
struct BlockIQ4_XS {
  fp16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// 32 values: x = kMxfp4Levels[q] * E8M0ToF32Half(e), e the shared E8M0 exponent; nibbles as Q4_0.
struct BlockMXFP4 {
  uint8_t e;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockMXFP4) == 17);

// 256 ternary values: x = d * (t - 1), t in {0, 1, 2}. A byte holds base-3 digits in the "pow3"
// form: byte b = ceil(256 * v / 243) for the 5-digit (qs) or 4-digit (qh, v * 3) number v, and
// digit n (most significant first) is t = ((uint8_t)(b * 3^n) * 3) >> 8. Element order:
// qs[0..31] digit n gives elements 32n + m (n < 5, m < 32), qs[32..47] digit n elements
// 160 + 16n + m (m < 16), qh[j] digit n (n < 4) elements 240 + 4n + j.
struct BlockTQ1_0 {
  uint8_t qs[(kQK_K - 4 * kQK_K / 64) / 5];
  uint8_t qh[kQK_K / 64];
  fp16_t d;
};
static_assert(sizeof(BlockTQ1_0) == 54);

// 256 ternary values: x = d * (t - 1), t in {0, 1, 2} (3 unused). Byte qs[32h + m] holds in bits
// 2l, 2l + 1 the code of element 128h + 32l + m (h < 2, l < 4, m < 32).
struct BlockTQ2_0 {
  uint8_t qs[kQK_K / 4];
  fp16_t d;
};
static_assert(sizeof(BlockTQ2_0) == 66);

// Q8_0 weights repacked at load (the matmul's interleaved layout): block i of 16 consecutive
// rows. d[r] is row r's scale; the codes are stored unsigned, u = q + 128, in 8 chunks of 4
// elements: qs[64 * c + 4 * r + e] is element 4c + e of row r (c < 8, r < 16, e < 4), so one
// 64-byte load holds the same 4 elements of all 16 rows. Same bytes as the 16 rows' blocks.
constexpr int kQ8_0x16Rows = 16;
struct BlockQ8_0x16 {
  fp16_t d[kQ8_0x16Rows];
  uint8_t qs[kQ8_0x16Rows * kQK];
};
static_assert(sizeof(BlockQ8_0x16) == kQ8_0x16Rows * sizeof(BlockQ8_0));

// Q4_0 weights repacked at load like BlockQ8_0x16: block i of 16 consecutive rows, d[r] row r's
// scale, and in 4 chunks qs[64 * c + 4 * r + e] = the row's byte qs[4c + e]: its low nibble is
// element 4c + e, its high nibble element 16 + 4c + e (codes u = q + 8, as in BlockQ4_0).
struct BlockQ4_0x16 {
  fp16_t d[kQ8_0x16Rows];
  uint8_t qs[kQ8_0x16Rows * kQK / 2];
};
static_assert(sizeof(BlockQ4_0x16) == kQ8_0x16Rows * sizeof(BlockQ4_0));

// IQ4_NL weights repacked at load: the layout of BlockQ4_0x16, the nibbles indexing
// kIq4NlLevels.
struct BlockIQ4_NLx16 {
  fp16_t d[kQ8_0x16Rows];
  uint8_t qs[kQ8_0x16Rows * kQK / 2];
};
static_assert(sizeof(BlockIQ4_NLx16) == kQ8_0x16Rows * sizeof(BlockIQ4_NL));

// MXFP4 weights repacked at load: the nibble layout of BlockQ4_0x16, the nibbles indexing
// kMxfp4Levels; e[r] is row r's E8M0 exponent. Same bytes as the 16 rows' blocks.
struct BlockMXFP4x16 {
  uint8_t e[kQ8_0x16Rows];
  uint8_t qs[kQ8_0x16Rows * kQK / 2];
};
static_assert(sizeof(BlockMXFP4x16) == kQ8_0x16Rows * sizeof(BlockMXFP4));
// Q5_0 weights repacked at load: block i of 16 consecutive rows, each field row by row: d[r] is
// row r's scale, qh[4 * r + b] its byte qh[b] and qs[16 * r + b] its byte qs[b]. A pair of rows
// 2p, 2p + 1 thus has its 8 high-bit bytes (one 64-bit mask: bit 32s + j is the fifth bit of
// element j of row 2p + s) and its 32 nibble bytes contiguous, which the AVX-512 kernel expands
// into one 512-bit register per pair: row 2p + s's 32 codes in bytes 32s..32s + 31, element order.
// Same bytes as the 16 rows' blocks.
struct BlockQ5_0x16 {
  fp16_t d[kQ8_0x16Rows];
  uint8_t qh[kQ8_0x16Rows * kQK / 8];
  uint8_t qs[kQ8_0x16Rows * kQK / 2];
};
static_assert(sizeof(BlockQ5_0x16) == kQ8_0x16Rows * sizeof(BlockQ5_0));

// Q4_K weights repacked at load: super-block i of 16 consecutive rows (256 values each). d[r] and
// dmin[r] are row r's scales; scales[64 * w + 4 * r + b] is byte 4w + b of row r's 12-byte
// scale/min field (w < 3), so one 64-byte load holds the same word of all 16 rows; and
// qs[64 * c + 4 * r + e] is the row's byte qs[4c + e] (c < 32): its low nibble is element
// 64 * (c / 8) + 4 * (c % 8) + e, its high nibble that element + 32. Same bytes as the rows'
// blocks.
struct BlockQ4_Kx16 {
  fp16_t d[kQ8_0x16Rows];
  fp16_t dmin[kQ8_0x16Rows];
  uint8_t scales[kQ8_0x16Rows * kKScaleSize];
  uint8_t qs[kQ8_0x16Rows * kQK_K / 2];
};
static_assert(sizeof(BlockQ4_Kx16) == kQ8_0x16Rows * sizeof(BlockQ4_K));

// Q5_K weights repacked at load: BlockQ4_Kx16's layout with the fifth bits between scales and qs:
// qh[64 * c + 4 * r + e] is row r's byte qh[4c + e] (c < 8), whose bit j is the fifth bit of
// element 32j + 4c + e. Same bytes as the rows' blocks.
struct BlockQ5_Kx16 {
  fp16_t d[kQ8_0x16Rows];
  fp16_t dmin[kQ8_0x16Rows];
  uint8_t scales[kQ8_0x16Rows * kKScaleSize];
  uint8_t qh[kQ8_0x16Rows * kQK_K / 8];
  uint8_t qs[kQ8_0x16Rows * kQK_K / 2];
};
static_assert(sizeof(BlockQ5_Kx16) == kQ8_0x16Rows * sizeof(BlockQ5_K));

// Q6_K weights repacked at load: super-block i of 16 consecutive rows. d[r] is row r's scale,
// scales[16 * g + r] row r's scale of the 16-value group g; ql[64 * c + 4 * r + e] is the row's
// byte ql[4c + e] (c < 32) and qh[64 * c + 4 * r + e] its byte qh[4c + e] (c < 16), the bits
// meaning what they mean in BlockQ6_K. Same bytes as the rows' blocks.
struct BlockQ6_Kx16 {
  fp16_t d[kQ8_0x16Rows];
  int8_t scales[kQ8_0x16Rows * kQK_K / 16];
  uint8_t ql[kQ8_0x16Rows * kQK_K / 2];
  uint8_t qh[kQ8_0x16Rows * kQK_K / 4];
};
static_assert(sizeof(BlockQ6_Kx16) == kQ8_0x16Rows * sizeof(BlockQ6_K));

// IQ4_XS weights repacked at load: super-block i of 16 consecutive rows (256 values each). d[r]
// and scales_h[r] are row r's; scales_l[4 * r + b] is row r's byte scales_l[b] (one 4-byte lane
// per row: group g's low 4 scale bits are bits 4g..4g+3 of the lane); qs[64 * c + 4 * r + e] is
// the row's byte qs[4c + e] (c < 32): its low nibble indexes kIq4NlLevels for element
// 32 * (c / 4) + 4 * (c % 4) + e, its high nibble for that element + 16. Same bytes as the rows'
// blocks.
struct BlockIQ4_XSx16 {
  fp16_t d[kQ8_0x16Rows];
  uint16_t scales_h[kQ8_0x16Rows];
  uint8_t scales_l[kQ8_0x16Rows * kQK_K / 64];
  uint8_t qs[kQ8_0x16Rows * kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XSx16) == kQ8_0x16Rows * sizeof(BlockIQ4_XS));

// 32 activation values for the interleaved kernels, made from a BlockQ8_0: x = d * q with d the
// block's fp16 scale widened to f32, and sum = sum(q), which turns a dot with codes stored
// offset (u = w + C) into the signed dot: sum(w q) = sum(u q) - C * sum.
struct BlockQ8_0Act {
  float d;
  int32_t sum;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0Act) == 40);

// The lattice i-quants: 256 values in groups of 8 (IQ3_*: two grid entries of 4), each group one
// entry of a fixed codebook (quant/iq_grids.h, from quant/iq_codebooks.inc) with its signs. A
// 7-bit sign index s means the 8 signs s | parity(s) << 7 (bit j negates value j; the eighth
// makes the count of negatives even); an explicit sign byte means its bits directly.

// 2.0625 bits/value. Group g (32 values, words qs[4g..4g+3]) as two 32-bit words a, b: byte l of
// a indexes the grid for values 32g + 8l..+7, bits 7l..7l+6 of b are their sign index, b >> 28
// the scale s: x = d * (0.5 + s) / 4 * grid * sign (the dot: d * (2s + 1) / 8).
struct BlockIQ2_XXS {
  fp16_t d;
  uint16_t qs[kQK_K / 8];
};
static_assert(sizeof(BlockIQ2_XXS) == 66);

// 2.3125 bits/value. qs[4g + l]: bits 0..8 index the 512-entry grid for values 32g + 8l..+7,
// bits 9..15 their sign index; scales[g] low nibble s scales values 32g..+15, the high nibble
// values 32g + 16..+31: x = d * (0.5 + s) / 4 * grid * sign.
struct BlockIQ2_XS {
  fp16_t d;
  uint16_t qs[kQK_K / 8];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ2_XS) == 74);

// 2.5625 bits/value. Values 32g + 8l..+7 (g < 8, l < 4): grid index qs[4g + l] | ((qh[g] >>
// 2l) & 3) << 8 into the 1024-entry grid, sign byte qs[32 + 4g + l]; scales as IQ2_XS.
struct BlockIQ2_S {
  fp16_t d;
  uint8_t qs[kQK_K / 4];  // 32 grid index bytes, then 32 sign bytes
  uint8_t qh[kQK_K / 32];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ2_S) == 82);

// 3.0625 bits/value. qs[0..63]: grid indices (4 values each) into the 256-entry grid, qs[8g +
// 2l] for values 32g + 8l..+3 and qs[8g + 2l + 1] for +4..+7; the 32-bit word at qs[64 + 4g]
// holds the sign indices of group g's four 8-value runs (bits 7l..7l+6) and the scale s = word >>
// 28: x = d * (0.5 + s) / 2 * grid * sign.
struct BlockIQ3_XXS {
  fp16_t d;
  uint8_t qs[3 * kQK_K / 8];
};
static_assert(sizeof(BlockIQ3_XXS) == 98);

// 3.4375 bits/value. Values 32g + 8l..+3 use grid index qs[8g + 2l] | ((qh[g] >> 2l) & 1) << 8
// and +4..+7 qs[8g + 2l + 1] | ((qh[g] >> (2l + 1)) & 1) << 8 (512-entry grid of 4 values), sign
// byte signs[4g + l]; group g's scale s is nibble g % 2 of scales[g / 2]: x = d * (1 + 2s) * grid
// * sign.
struct BlockIQ3_S {
  fp16_t d;
  uint8_t qs[kQK_K / 4];
  uint8_t qh[kQK_K / 32];
  uint8_t signs[kQK_K / 8];
  uint8_t scales[kQK_K / 64];
};
static_assert(sizeof(BlockIQ3_S) == 110);

// 1.5625 bits/value, grid values in {-1, 0, 1}. Values 32g + 8l..+7 use grid index qs[4g + l] |
// ((qh[g] >> 3l) & 7) << 8 into the 2048-entry grid; qh[g] bits 12..14 are the scale s, bit 15
// the delta's sign: x = d * (2s + 1) * (grid + delta), delta = -1/8 if set, else +1/8.
struct BlockIQ1_S {
  fp16_t d;
  uint8_t qs[kQK_K / 8];
  uint16_t qh[kQK_K / 32];
};
static_assert(sizeof(BlockIQ1_S) == 50);

// 1.75 bits/value, IQ1_S's grid. Values 32g + 8l..+7: grid index qs[4g + l] | ((qh[2g + l / 2] >>
// 4(l % 2)) & 7) << 8, delta -1/8 if bit 3 of that nibble is set, else +1/8. The four uint16 words
// of scales: word w's bits 6h..6h+2 and 6h+3..6h+5 are the 3-bit scales s of values 64w + 32h +
// 0..15 and +16..31 (h < 2); their top nibbles, word 0's lowest, form the fp16 d: x = d * (2s + 1)
// * (grid + delta). No separate d field.
struct BlockIQ1_M {
  uint8_t qs[kQK_K / 8];
  uint8_t qh[kQK_K / 16];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ1_M) == 56);

// ---------------------------------------------------------------------------------------------
// NVFP4, Q1_0 and Q2_0 (lowbit*.cpp). All three compute against Q8_0 activations, as GGML does.

constexpr int64_t kQKNvfp4 = 64;     // elements per NVFP4 block (four 16-element sub-blocks)
constexpr int64_t kQKNvfp4Sub = 16;  // elements per NVFP4 UE4M3 scale
constexpr int64_t kQK1_0 = 128;      // elements per Q1_0 block
constexpr int64_t kQK2_0 = 64;       // elements per Q2_0 block

// Half an unsigned E4M3 scale (4 exponent bits, bias 7, 3 mantissa bits; bit 7 ignored), as GGML
// decodes NVFP4's scales: the half cancels the doubling of kMxfp4Levels. Exponent 0 is subnormal
// (man * 2^-9); codes 0x00 and 0x7F read as 0 (0xFF does not: GGML checks the whole byte).
constexpr float Ue4m3ToF32Half(uint8_t x) {
  if (x == 0 || x == 0x7F) return 0.0f;
  const int exp = (x >> 3) & 0xF;
  const int man = x & 0x7;
  // Exact: (8 + man) or man times a power of two.
  float scale = 1.0f / 2048.0f;  // exponent e gives (8 + man) * 2^(e - 11)
  for (int e = 0; e < exp; ++e) scale *= 2.0f;
  return exp == 0 ? static_cast<float>(man) / 1024.0f : static_cast<float>(8 + man) * scale;
}

// 64 values in four sub-blocks of 16: x = kMxfp4Levels[q] * Ue4m3ToF32Half(d[s]) for sub-block
// s; qs[8s + j] holds element 16s + j in its low nibble and 16s + j + 8 in its high nibble.
struct BlockNVFP4 {
  uint8_t d[kQKNvfp4 / kQKNvfp4Sub];
  uint8_t qs[kQKNvfp4 / 2];
};
static_assert(sizeof(BlockNVFP4) == 36);

// 128 values: x = +d if bit j % 8 of qs[j / 8] is set, else -d (element j).
struct BlockQ1_0 {
  fp16_t d;
  uint8_t qs[kQK1_0 / 8];
};
static_assert(sizeof(BlockQ1_0) == 18);

// 64 values: x = d * (q - 1), q in 0..3 the bits 2 (j % 4), +1 of qs[j / 4] (element j).
struct BlockQ2_0 {
  fp16_t d;
  uint8_t qs[kQK2_0 / 4];
};
static_assert(sizeof(BlockQ2_0) == 18);

// NVFP4 weights repacked at load: block i (64 values) of 16 consecutive rows. d[16 * s + r] is
// row r's UE4M3 scale of sub-block s (s < 4), so one 16-byte load holds a sub-block's scales of
// all 16 rows; qs[64 * c + 4 * r + e] is the row's byte qs[4c + e] (c < 8): its low nibble
// indexes kMxfp4Levels for element 16 * (c / 2) + 4 * (c % 2) + e, its high nibble for that
// element + 8. Same bytes as the 16 rows' blocks.
struct BlockNVFP4x16 {
  uint8_t d[kQ8_0x16Rows * kQKNvfp4 / kQKNvfp4Sub];
  uint8_t qs[kQ8_0x16Rows * kQKNvfp4 / 2];
};
static_assert(sizeof(BlockNVFP4x16) == kQ8_0x16Rows * sizeof(BlockNVFP4));

// Q1_0 weights repacked at load: block i (128 values) of 16 consecutive rows. d[r] is row r's
// scale; qs[64 * g + 8 * p + 4 * h + b] is byte 4g + b of row 2p + h (g < 4 groups of 32 values,
// p < 8 row pairs, h < 2), so the 8 bytes at qs + 64 g + 8 p are one 64-bit mask: bit j < 32 the
// sign of row 2p's value 32g + j, bit 32 + j row 2p + 1's. Same bytes as the 16 rows' blocks.
struct BlockQ1_0x16 {
  fp16_t d[kQ8_0x16Rows];
  uint8_t qs[kQ8_0x16Rows * kQK1_0 / 8];
};
static_assert(sizeof(BlockQ1_0x16) == kQ8_0x16Rows * sizeof(BlockQ1_0));

// Q2_0 weights repacked at load: block i (64 values) of 16 consecutive rows. d[r] is row r's
// scale; the 16 bytes at qs + 128 g + 16 p hold the 2-bit codes of group g (values 32g..32g+31)
// of rows 2p and 2p + 1 (p < 8) by position n < 64 (n < 32: row 2p's value 32g + n, else row
// 2p + 1's value 32g + n - 32): byte n % 16, bits 2 (n / 16) and 2 (n / 16) + 1. Shifting the
// 16 bytes right by 0, 2, 4 and 6 gives the codes of positions 0..15, 16..31, 32..47, 48..63.
struct BlockQ2_0x16 {
  fp16_t d[kQ8_0x16Rows];
  uint8_t qs[kQ8_0x16Rows * kQK2_0 / 4];
};
static_assert(sizeof(BlockQ2_0x16) == kQ8_0x16Rows * sizeof(BlockQ2_0));

struct TypeTraits {
  const char* name;
  int64_t block_size;  // elements per block
  size_t type_size;    // bytes per block
  bool is_quantized;
};

// Known to lamina (every type above). Values read from files must pass this before the cast.
bool IsKnownGgmlType(uint32_t raw);
const TypeTraits& GetTypeTraits(GgmlType type);
const char* GgmlTypeName(GgmlType type);
// Bytes for a row of n elements; n must be a multiple of the block size (checked).
size_t RowSize(GgmlType type, int64_t n);

}  // namespace lamina
