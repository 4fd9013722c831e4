// The lattice i-quants' interleaved layouts (repacked at load; interleaved_iquants*.cpp): POD
// blocks of 16 consecutive rows' super-blocks, kept out of types.h since only these kernels read
// them.
#pragma once

#include <cstdint>

#include "quant/types.h"

namespace lamina {

// Super-block i of 16 consecutive rows, every field regrouped so that one load holds the same
// field of all 16 rows (row r in byte / word r). A 4-value position p is values 4p..4p+3, an
// 8-value entry e values 8e..8e+7, a group g values 32g..32g+31. Same bytes as the 16 rows'
// blocks.

// IQ2_XXS: d[r] row r's scale; grid[16 * e + r] row r's grid index byte of entry e (byte l of
// group g's word a, e = 4g + l); sw[16 * g + r] row r's sign/scale word b of group g.
struct BlockIQ2_XXSx16 {
  fp16_t d[kQ8_0x16Rows];
  uint8_t grid[kQ8_0x16Rows * kQK_K / 8];
  uint32_t sw[kQ8_0x16Rows * kQK_K / 32];
};
static_assert(sizeof(BlockIQ2_XXSx16) == kQ8_0x16Rows * sizeof(BlockIQ2_XXS));

// IQ2_XS: d[r]; qs[16 * e + r] row r's word qs[e] (grid index and sign index of entry e);
// scales[16 * g + r] row r's byte scales[g].
struct BlockIQ2_XSx16 {
  fp16_t d[kQ8_0x16Rows];
  uint16_t qs[kQ8_0x16Rows * kQK_K / 8];
  uint8_t scales[kQ8_0x16Rows * kQK_K / 32];
};
static_assert(sizeof(BlockIQ2_XSx16) == kQ8_0x16Rows * sizeof(BlockIQ2_XS));

// IQ3_XXS: d[r]; grid[16 * p + r] row r's qs[p] (the grid index of position p); sw[16 * g + r]
// row r's sign/scale word of group g (the word at qs[64 + 4g]).
struct BlockIQ3_XXSx16 {
  fp16_t d[kQ8_0x16Rows];
  uint8_t grid[kQ8_0x16Rows * kQK_K / 4];
  uint32_t sw[kQ8_0x16Rows * kQK_K / 32];
};
static_assert(sizeof(BlockIQ3_XXSx16) == kQ8_0x16Rows * sizeof(BlockIQ3_XXS));

// IQ3_S: d[r]; grid[16 * p + r] row r's qs[p]; qh[16 * g + r] its qh[g]; signs[16 * e + r] its
// signs[e]; scales[r] its four scale bytes as one little-endian word.
struct BlockIQ3_Sx16 {
  fp16_t d[kQ8_0x16Rows];
  uint8_t grid[kQ8_0x16Rows * kQK_K / 4];
  uint8_t qh[kQ8_0x16Rows * kQK_K / 32];
  uint8_t signs[kQ8_0x16Rows * kQK_K / 8];
  uint32_t scales[kQ8_0x16Rows];
};
static_assert(sizeof(BlockIQ3_Sx16) == kQ8_0x16Rows * sizeof(BlockIQ3_S));

// IQ2_S: d[r]; grid[16 * e + r] row r's qs[e] (the low 8 bits of entry e's grid index);
// signs[16 * e + r] its qs[32 + e]; qh[16 * g + r] its qh[g]; scales[16 * g + r] its scales[g].
struct BlockIQ2_Sx16 {
  fp16_t d[kQ8_0x16Rows];
  uint8_t grid[kQ8_0x16Rows * kQK_K / 8];
  uint8_t signs[kQ8_0x16Rows * kQK_K / 8];
  uint8_t qh[kQ8_0x16Rows * kQK_K / 32];
  uint8_t scales[kQ8_0x16Rows * kQK_K / 32];
};
static_assert(sizeof(BlockIQ2_Sx16) == kQ8_0x16Rows * sizeof(BlockIQ2_S));

// IQ1_S: d[r]; grid[16 * e + r] row r's qs[e]; qh[16 * g + r] its word qh[g] (high index bits,
// scale and delta sign of group g).
struct BlockIQ1_Sx16 {
  fp16_t d[kQ8_0x16Rows];
  uint8_t grid[kQ8_0x16Rows * kQK_K / 8];
  uint16_t qh[kQ8_0x16Rows * kQK_K / 32];
};
static_assert(sizeof(BlockIQ1_Sx16) == kQ8_0x16Rows * sizeof(BlockIQ1_S));

// IQ1_M: grid[16 * e + r] row r's qs[e]; qh[16 * j + r] its qh[j] (entries 2j and 2j + 1's
// nibbles, so half h's two entries are in qh[h]); scales[16 * w + r] its scale word w (bytes 2w,
// 2w + 1 of its scales; the four words' top nibbles are its d).
struct BlockIQ1_Mx16 {
  uint8_t grid[kQ8_0x16Rows * kQK_K / 8];
  uint8_t qh[kQ8_0x16Rows * kQK_K / 16];
  uint16_t scales[kQ8_0x16Rows * kQK_K / 64];
};
static_assert(sizeof(BlockIQ1_Mx16) == kQ8_0x16Rows * sizeof(BlockIQ1_M));

}  // namespace lamina
