// AVX2 dot products of the lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M
// against Q8_K). A super-block is decoded chunk by chunk (32 values) and each chunk is used at
// once by every activation row: the grid entries by broadcast loads and blends (8-byte entries) or
// inserts (4-byte entries) from the indices as bytes in memory (AVX2 gathers were slower on the
// measured core), the +-1 sign bytes by one in-lane vpshufb of the super-block's 32 sign bytes
// (7-bit indices completed by a parity lookup) and a bit test, the scales by one vpshufb; then
// per row one vpsignb, vpmaddubsw and vpmaddwd per chunk, and rows in fours share one horizontal
// reduction, their float steps lane by lane. The integer sums and float steps are the scalar
// twins' (iquants.cpp), so every output is their bits and does not depend on the batch.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant/iq_grids.h"
#include "quant/kernel_registry.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "util/check.h"
#include "util/fp16.h"

namespace lamina::quant_internal {
namespace {

#include "quant/iquants_common.inc"

// One decoded 32-value chunk of a super-block.
struct IqChunk {
  __m256i u;    // [32] weight magnitudes |w|
  __m256i sgn;  // [32] bytes with w's sign, never 0 (+-1, or IQ1's w itself)
  __m256i scl;  // [16 words]: words 0..7 the first 16 values' 2s + 1, 8..15 the rest's
};

inline __m256i Load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline uint32_t Load32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
// The 8 bytes at p zero-extended to int32 lanes.
inline __m256i Bytes8ToI32(const void* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p)));
}

// The grid indices are stored to a small array and read back per entry through a pointer that
// the compiler cannot see through: otherwise GCC forwards the stores by extracting each index
// from the vector register (vpextrd, one shuffle per index).
template <typename T>
[[gnu::always_inline]] inline const T* Opaque(const T* p) {
  asm("" : "+r"(p));
  return p;
}

// Four 8-byte grid entries in one register: each broadcast from memory (a load, no shuffle) and
// the four merged by blends. (AVX2 gathers were no faster on the measured core.)
[[gnu::always_inline]] inline __m256i Grid4(const uint64_t* grid, uint32_t i0, uint32_t i1,
                                            uint32_t i2, uint32_t i3) {
  auto bc = [&](uint32_t i) {
    return _mm256_castpd_si256(_mm256_broadcast_sd(reinterpret_cast<const double*>(grid + i)));
  };
  return _mm256_blend_epi32(_mm256_blend_epi32(bc(i0), bc(i1), 0x0C),
                            _mm256_blend_epi32(bc(i2), bc(i3), 0xC0), 0xF0);
}

// Eight 4-byte grid entries (indices i[0..7]) the same way.
[[gnu::always_inline]] inline __m256i Grid8(const uint32_t* grid, const uint32_t* i) {
  auto quad = [&](int o) {
    __m128i v = _mm_cvtsi32_si128(static_cast<int>(grid[i[o]]));
    v = _mm_insert_epi32(v, static_cast<int>(grid[i[o + 1]]), 1);
    v = _mm_insert_epi32(v, static_cast<int>(grid[i[o + 2]]), 2);
    return _mm_insert_epi32(v, static_cast<int>(grid[i[o + 3]]), 3);
  };
  return _mm256_inserti128_si256(_mm256_castsi128_si256(quad(0)), quad(4), 1);
}

// The sign bytes of 32 7-bit sign indices (bit 7 clear): s | parity(s) << 7, the parity by two
// nibble lookups.
[[gnu::always_inline]] inline __m256i SignRule(__m256i s) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i par = _mm256_broadcastsi128_si256(_mm_setr_epi8(
      0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0));  // parity(i) << 7
  const __m256i p =
      _mm256_xor_si256(_mm256_shuffle_epi8(par, _mm256_and_si256(s, nib)),
                       _mm256_shuffle_epi8(par, _mm256_and_si256(_mm256_srli_epi16(s, 4), nib)));
  return _mm256_or_si256(s, p);
}

// 32 sign bytes in entry order (byte e: bit j negates value 8e + j) regrouped so that lane 0
// holds entries 4c, 4c + 1 of every chunk c (bytes 2c, 2c + 1) and lane 1 entries 4c + 2, 4c + 3.
[[gnu::always_inline]] inline __m256i SignGroups(__m256i s) {
  const __m256i pairs = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
  return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(s, pairs), 0xD8);
}

// Chunk c's +-1 bytes from SignGroups: one in-lane vpshufb spreads each entry's sign byte over
// its 8 values, then one bit tested per byte.
[[gnu::always_inline]] inline __m256i SignUnit(__m256i t, int c) {
  const char a = static_cast<char>(2 * c), b = static_cast<char>(2 * c + 1);
  const __m256i spread = _mm256_setr_epi8(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b, a, a, a,
                                          a, a, a, a, a, b, b, b, b, b, b, b, b);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(t, spread), bit);
  return _mm256_or_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(1));  // -1 where set
}

// Raw scales s (int32 lanes, 0..15) to 2s + 1 in both 16-bit words.
inline __m256i OddScales(__m256i s) {
  const __m256i sc = _mm256_or_si256(_mm256_slli_epi32(s, 1), _mm256_set1_epi32(1));
  return _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
}

// Eight per-chunk int32 words (scales, IQ1_S's deltas): chunk c's is int32 c % 4 of each
// 128-bit lane of a (c < 4) or b, so one in-lane vpshufb broadcasts it.
struct ChunkWords {
  __m256i a, b;
  // From e with chunk c's word in int32 lane c (both 128-bit lanes get it).
  [[gnu::always_inline]] static ChunkWords PerChunk(__m256i e) {
    return {_mm256_permute2x128_si256(e, e, 0x00), _mm256_permute2x128_si256(e, e, 0x11)};
  }
  [[gnu::always_inline]] __m256i Get(int c) const {
    const char k = static_cast<char>(4 * (c % 4));
    const __m256i pick =
        _mm256_setr_epi8(k, k + 1, k + 2, k + 3, k, k + 1, k + 2, k + 3, k, k + 1, k + 2, k + 3, k,
                         k + 1, k + 2, k + 3, k, k + 1, k + 2, k + 3, k, k + 1, k + 2, k + 3, k,
                         k + 1, k + 2, k + 3, k, k + 1, k + 2, k + 3);
    return _mm256_shuffle_epi8(c < 4 ? a : b, pick);
  }
};

// IQ2_XS / IQ2_S: scales[g] low nibble the scale of values 32g..32g+15 (chunk g's low lane),
// high nibble of 32g+16..32g+31 (its high lane).
[[gnu::always_inline]] inline ChunkWords NibbleScales(const uint8_t* scales) {
  const __m256i x = Bytes8ToI32(scales);  // int32 lane g: scales[g]
  const __m256i shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
  const __m256i nib = _mm256_set1_epi32(0xF);
  return {OddScales(_mm256_and_si256(
              _mm256_srlv_epi32(_mm256_permute2x128_si256(x, x, 0x00), shift), nib)),
          OddScales(_mm256_and_si256(
              _mm256_srlv_epi32(_mm256_permute2x128_si256(x, x, 0x11), shift), nib))};
}

// IQ2_XXS / IQ3_XXS: the sign groups and chunk scales of the eight sign words (int32 lane g of
// sw: group g's four 7-bit sign indices, bits 7l..7l+6, and its scale in the top 4 bits).
[[gnu::always_inline]] inline void XxsSignsScales(__m256i sw, __m256i* t, ChunkWords* e) {
  // Byte l of int32 lane g: sign index l of group g, so the 32 bytes are in entry order.
  // Fields 2 and 3 up by two bits (to bits 16, 23), then fields 1 and 3 up by one (to 8, 24).
  const __m256i y =
      _mm256_or_si256(_mm256_and_si256(sw, _mm256_set1_epi32(0x3FFF)),
                      _mm256_and_si256(_mm256_slli_epi32(sw, 2), _mm256_set1_epi32(0x3FFF0000)));
  const __m256i s =
      _mm256_or_si256(_mm256_and_si256(y, _mm256_set1_epi32(0x007F007F)),
                      _mm256_and_si256(_mm256_slli_epi32(y, 1), _mm256_set1_epi32(0x7F007F00)));
  *t = SignGroups(SignRule(s));
  *e = ChunkWords::PerChunk(OddScales(_mm256_srli_epi32(sw, 28)));
}

// A super-block's decoder: the constructor reads what all chunks share (signs, scales, grid
// indices), Chunk(c) yields values 32c..32c+31.
template <typename B>
class IqDec;

// IQ2_XXS: the 8 bytes of group g hold its four grid index bytes, then its sign word.
template <>
class IqDec<BlockIQ2_XXS> {
 public:
  [[gnu::always_inline]] explicit IqDec(const BlockIQ2_XXS& b)
      : q_(reinterpret_cast<const uint8_t*>(b.qs)) {
    // The odd int32 lanes of the two halves: groups 0, 1, 4, 5 | 2, 3, 6, 7, then in order.
    const __m256 odd =
        _mm256_shuffle_ps(_mm256_castsi256_ps(Load256(q_)), _mm256_castsi256_ps(Load256(q_ + 32)),
                          _MM_SHUFFLE(3, 1, 3, 1));
    XxsSignsScales(_mm256_permute4x64_epi64(_mm256_castps_si256(odd), 0xD8), &t_, &e_);
  }
  [[gnu::always_inline]] IqChunk Chunk(int c) const {
    const uint8_t* p = q_ + 8 * c;
    return {Grid4(kIq2xxsGrid.data(), p[0], p[1], p[2], p[3]), SignUnit(t_, c), e_.Get(c)};
  }

 private:
  const uint8_t* q_;
  __m256i t_;
  ChunkWords e_;
};

// IQ3_XXS: one byte index per 4 values, the sign words at qs[64..95].
template <>
class IqDec<BlockIQ3_XXS> {
 public:
  [[gnu::always_inline]] explicit IqDec(const BlockIQ3_XXS& b) : q_(b.qs) {
    XxsSignsScales(Load256(b.qs + 64), &t_, &e_);
  }
  [[gnu::always_inline]] IqChunk Chunk(int c) const {
    const uint8_t* p = q_ + 8 * c;
    const uint32_t i[8] = {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]};
    return {Grid8(kIq3xxsGrid.data(), i), SignUnit(t_, c), e_.Get(c)};
  }

 private:
  const uint8_t* q_;
  __m256i t_;
  ChunkWords e_;
};

// IQ2_XS: qs[i] bits 0..8 index the grid for values 8i..8i+7, bits 9..15 their sign index.
template <>
class IqDec<BlockIQ2_XS> {
 public:
  [[gnu::always_inline]] explicit IqDec(const BlockIQ2_XS& b) : q_(b.qs) {
    // packus interleaves the halves' lanes (entries 0..7, 16..23 | 8..15, 24..31); vpermq
    // restores the entry order.
    const __m256i s = _mm256_packus_epi16(_mm256_srli_epi16(Load256(b.qs), 9),
                                          _mm256_srli_epi16(Load256(b.qs + 16), 9));
    t_ = SignGroups(SignRule(_mm256_permute4x64_epi64(s, 0xD8)));
    e_ = NibbleScales(b.scales);
  }
  [[gnu::always_inline]] IqChunk Chunk(int c) const {
    const uint16_t* p = q_ + 4 * c;
    return {Grid4(kIq2xsGrid.data(), p[0] & 511u, p[1] & 511u, p[2] & 511u, p[3] & 511u),
            SignUnit(t_, c), e_.Get(c)};
  }

 private:
  const uint16_t* q_;
  __m256i t_;
  ChunkWords e_;
};

// IQ2_S: entry l of group g indexes the grid by qs[4g + l] and bits 2l, 2l + 1 of qh[g] as bits
// 8, 9; explicit sign bytes qs[32 + 4g + l].
template <>
class IqDec<BlockIQ2_S> {
 public:
  [[gnu::always_inline]] explicit IqDec(const BlockIQ2_S& b) {
    const __m256i pair = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {  // groups 2k, 2k + 1 (the broadcast word's bytes 0, 1)
      const __m256i qh = _mm256_set1_epi32(static_cast<int>(Load32(b.qh + 2 * k)));
      const __m256i high =
          _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(qh, pair), _mm256_set1_epi32(3)), 8);
      _mm256_store_si256(reinterpret_cast<__m256i*>(idx_ + 8 * k),
                         _mm256_or_si256(Bytes8ToI32(b.qs + 8 * k), high));
    }
    ip_ = Opaque(idx_);
    t_ = SignGroups(Load256(b.qs + kQK_K / 8));
    e_ = NibbleScales(b.scales);
  }
  [[gnu::always_inline]] IqChunk Chunk(int c) const {
    const uint32_t* i = ip_ + 4 * c;
    return {Grid4(kIq2sGrid.data(), i[0], i[1], i[2], i[3]), SignUnit(t_, c), e_.Get(c)};
  }

 private:
  alignas(32) uint32_t idx_[32];  // [32 entries] grid indices
  const uint32_t* ip_;            // idx_, opaque
  __m256i t_;
  ChunkWords e_;
};

// IQ3_S: value pair e of group g (4 values) indexes the grid by qs[8g + e] and bit e of qh[g] as
// bit 8; explicit sign bytes; one scale per group, nibble g % 2 of scales[g / 2].
template <>
class IqDec<BlockIQ3_S> {
 public:
  [[gnu::always_inline]] explicit IqDec(const BlockIQ3_S& b) {
    const __m256i up = _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1);  // bit e to bit 8
    const __m256i bit8 = _mm256_set1_epi32(0x100);
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const __m256i qh = _mm256_set1_epi32(static_cast<int>(Load32(b.qh + g)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(idx_ + 8 * g),
                         _mm256_or_si256(Bytes8ToI32(b.qs + 8 * g),
                                         _mm256_and_si256(_mm256_sllv_epi32(qh, up), bit8)));
    }
    ip_ = Opaque(idx_);
    t_ = SignGroups(Load256(b.signs));
    const __m256i sc4 = _mm256_set1_epi32(static_cast<int>(Load32(b.scales)));
    e_ = ChunkWords::PerChunk(OddScales(
        _mm256_and_si256(_mm256_srlv_epi32(sc4, _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                         _mm256_set1_epi32(0xF))));
  }
  [[gnu::always_inline]] IqChunk Chunk(int c) const {
    return {Grid8(kIq3sGrid.data(), ip_ + 8 * c), SignUnit(t_, c), e_.Get(c)};
  }

 private:
  alignas(32) uint32_t idx_[64];  // [64 value quads] grid indices
  const uint32_t* ip_;            // idx_, opaque
  __m256i t_;
  ChunkWords e_;
};

// IQ1: w = 8 * grid + delta (IQ1_S adds the delta, IQ1_M reads kIq1Grid8Delta), its magnitudes
// and the signs as w itself (never 0).
[[gnu::always_inline]] inline IqChunk Iq1Chunk(__m256i w, __m256i scl) {
  return {_mm256_abs_epi8(w), w, scl};
}

// IQ1_S: entry l of group g indexes the grid by qs[4g + l] and bits 3l..3l+2 of qh[g] as bits
// 8..10; qh[g] bits 12..14 are the group's scale, bit 15 its delta's sign.
template <>
class IqDec<BlockIQ1_S> {
 public:
  [[gnu::always_inline]] explicit IqDec(const BlockIQ1_S& b) {
    const __m256i thirds = _mm256_setr_epi32(0, 3, 6, 9, 16, 19, 22, 25);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {  // groups 2k, 2k + 1 (the broadcast word's halves)
      const __m256i rep = _mm256_set1_epi32(static_cast<int>(Load32(b.qh + 2 * k)));
      const __m256i high = _mm256_slli_epi32(
          _mm256_and_si256(_mm256_srlv_epi32(rep, thirds), _mm256_set1_epi32(7)), 8);
      _mm256_store_si256(reinterpret_cast<__m256i*>(idx_ + 8 * k),
                         _mm256_or_si256(Bytes8ToI32(b.qs + 8 * k), high));
    }
    ip_ = Opaque(idx_);
    const __m256i qh =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh)));
    // int32 lane g: group g's delta bytes, all -1 or all +1.
    delta_ = ChunkWords::PerChunk(
        _mm256_or_si256(_mm256_srai_epi32(_mm256_slli_epi32(qh, 16), 31), _mm256_set1_epi8(1)));
    e_ = ChunkWords::PerChunk(
        OddScales(_mm256_and_si256(_mm256_srli_epi32(qh, 12), _mm256_set1_epi32(7))));
  }
  [[gnu::always_inline]] IqChunk Chunk(int c) const {
    const uint32_t* i = ip_ + 4 * c;
    return Iq1Chunk(_mm256_add_epi8(Grid4(kIq1Grid8.data(), i[0], i[1], i[2], i[3]), delta_.Get(c)),
                    e_.Get(c));
  }

 private:
  alignas(32) uint32_t idx_[32];  // [32 entries] grid indices
  const uint32_t* ip_;            // idx_, opaque
  ChunkWords delta_, e_;
};

// IQ1_M: entry e of groups 2k, 2k + 1 (values 64k + 8e..+7) has nibble e of qh[4k..4k+3]: bits
// 0..2 the grid index's bits 8..10, bit 3 the delta's sign; scale word w holds the four 16-value
// scales of values 64w..64w+63 (bits 3h..3h+2).
template <>
class IqDec<BlockIQ1_M> {
 public:
  [[gnu::always_inline]] explicit IqDec(const BlockIQ1_M& b) {
    const __m256i nibs = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {  // the nibble as bits 8..11 of the kIq1Grid8Delta index
      const __m256i nib =
          _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(Load32(b.qh + 4 * k))), nibs);
      const __m256i high = _mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(0xF)), 8);
      _mm256_store_si256(reinterpret_cast<__m256i*>(idx_ + 8 * k),
                         _mm256_or_si256(Bytes8ToI32(b.qs + 8 * k), high));
    }
    ip_ = Opaque(idx_);
    // Chunk c's low lane: half 2c's scale, bits 3h..3h+2 (h = 2c % 4) of word c / 2; its high
    // lane half 2c + 1's, 3 bits higher.
    const __m256i words =
        _mm256_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales)));
    const __m256i shift = _mm256_setr_epi32(0, 6, 0, 6, 3, 9, 3, 9);
    const __m256i seven = _mm256_set1_epi32(7);
    e_ = {OddScales(_mm256_and_si256(
              _mm256_srlv_epi32(
                  _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1)),
                  shift),
              seven)),
          OddScales(_mm256_and_si256(
              _mm256_srlv_epi32(
                  _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(2, 2, 3, 3, 2, 2, 3, 3)),
                  shift),
              seven))};
  }
  [[gnu::always_inline]] IqChunk Chunk(int c) const {
    const uint32_t* i = ip_ + 4 * c;
    return Iq1Chunk(Grid4(kIq1Grid8Delta.data(), i[0], i[1], i[2], i[3]), e_.Get(c));
  }

 private:
  alignas(32) uint32_t idx_[32];  // [32 entries] kIq1Grid8Delta indices
  const uint32_t* ip_;            // idx_, opaque
  ChunkWords e_;
};

inline int32_t HorizontalSumI32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// The lane sums of four int32 vectors, in one: {sum(a), sum(b), sum(c), sum(d)}.
[[gnu::always_inline]] inline __m128i ReduceAdd4(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
  const __m256i cd = _mm256_add_epi32(_mm256_unpacklo_epi32(c, d), _mm256_unpackhi_epi32(c, d));
  const __m256i x = _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
  return _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}

// N activation rows against one weight row: per super-block and row the exact integer sum (the
// scalar twin's integer) and its float steps, in the twin's order; rows in fours share one
// reduction and run the float steps lane by lane (the same operations per row, so a row's result
// does not depend on N).
template <typename B, int N>
void IqMultiDot(int64_t k, const void* w_row, const uint8_t* act, size_t act_row_bytes,
                float* out) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const B*>(w_row);
  constexpr int kQuads = N / 4;
  __m128 sum4[kQuads > 0 ? kQuads : 1];  // [row quad]: rows 4j..4j+3
  float sumf[N];
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) sumf[r] = 0;
#pragma GCC unroll 2
  for (int j = 0; j < kQuads; ++j) sum4[j] = _mm_setzero_ps();
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const BlockQ8_K* y[N];
#pragma GCC unroll 8
    for (int r = 0; r < N; ++r) {
      y[r] = reinterpret_cast<const BlockQ8_K*>(act + r * act_row_bytes) + i;
    }
    const IqDec<B> dec(x[i]);
    // [N rows][8 int32 lanes]: the exact integer sums, chunk by chunk: the codes signed by w,
    // maddubs with the magnitudes, madd with the scales.
    __m256i acc[N];
#pragma GCC unroll 8
    for (int r = 0; r < N; ++r) acc[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const IqChunk ch = dec.Chunk(c);
#pragma GCC unroll 8
      for (int r = 0; r < N; ++r) {
        const __m256i q8 = _mm256_sign_epi8(Load256(y[r]->qs + 32 * c), ch.sgn);
        acc[r] =
            _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(ch.u, q8), ch.scl));
      }
    }
    // F16C widens d exactly (Iq<B>::D's value; a signalling NaN comes out quiet, which the
    // multiply by the activation's d below does anyway).
    const float dx = _cvtsh_ss(IqHalf(x[i]));
#pragma GCC unroll 2
    for (int j = 0; j < kQuads; ++j) {
      __m128 isum =
          _mm_cvtepi32_ps(ReduceAdd4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
      const __m128 d = _mm_mul_ps(_mm_set1_ps(dx), _mm_setr_ps(y[4 * j]->d, y[4 * j + 1]->d,
                                                               y[4 * j + 2]->d, y[4 * j + 3]->d));
      if constexpr (kIsIq1<B>) isum = _mm_mul_ps(isum, _mm_set1_ps(0.125f));
      sum4[j] = _mm_add_ps(sum4[j], _mm_mul_ps(d, isum));
    }
#pragma GCC unroll 4
    for (int r = 4 * kQuads; r < N; ++r) {
      const float isum = static_cast<float>(HorizontalSumI32(acc[r]));
      const float d = dx * y[r]->d;
      if constexpr (kIsIq1<B>) {
        sumf[r] += d * (isum * 0.125f);
      } else {
        sumf[r] += d * isum;
      }
    }
  }
#pragma GCC unroll 2
  for (int j = 0; j < kQuads; ++j) _mm_storeu_ps(sumf + 4 * j, sum4[j]);
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) out[r] = Iq<B>::kFinal * sumf[r];
}

template <typename B>
void IqVecDot(int64_t k, float* s, const void* w_row, const void* act_row) {
  IqMultiDot<B, 1>(k, w_row, static_cast<const uint8_t*>(act_row), 0, s);
}

template <typename B>
void IqVecDotMulti(int64_t k, const void* w_row, const void* act, size_t act_row_bytes, int n_act,
                   float* out) {
  LAMINA_DCHECK(n_act >= 1 && n_act <= kMaxMultiDot);
  const auto* a = static_cast<const uint8_t*>(act);
  switch (n_act) {
    case 1:
      return IqMultiDot<B, 1>(k, w_row, a, act_row_bytes, out);
    case 2:
      return IqMultiDot<B, 2>(k, w_row, a, act_row_bytes, out);
    case 3:
      return IqMultiDot<B, 3>(k, w_row, a, act_row_bytes, out);
    case 4:
      return IqMultiDot<B, 4>(k, w_row, a, act_row_bytes, out);
    case 5:
      return IqMultiDot<B, 5>(k, w_row, a, act_row_bytes, out);
    case 6:
      return IqMultiDot<B, 6>(k, w_row, a, act_row_bytes, out);
    case 7:
      return IqMultiDot<B, 7>(k, w_row, a, act_row_bytes, out);
    default:
      return IqMultiDot<B, 8>(k, w_row, a, act_row_bytes, out);
  }
}

template <typename B>
void SetIq(KernelTable& table, GgmlType type) {
  TypeKernels& e = table[static_cast<int>(type)];
  e.vec_dot = IqVecDot<B>;
  e.vec_dot_multi = IqVecDotMulti<B>;
}

}  // namespace

void RegisterAvx2IQuants(KernelTable& table) {
  SetIq<BlockIQ2_XXS>(table, GgmlType::kIQ2_XXS);
  SetIq<BlockIQ2_XS>(table, GgmlType::kIQ2_XS);
  SetIq<BlockIQ2_S>(table, GgmlType::kIQ2_S);
  SetIq<BlockIQ3_XXS>(table, GgmlType::kIQ3_XXS);
  SetIq<BlockIQ3_S>(table, GgmlType::kIQ3_S);
  SetIq<BlockIQ1_S>(table, GgmlType::kIQ1_S);
  SetIq<BlockIQ1_M>(table, GgmlType::kIQ1_M);
}

}  // namespace lamina::quant_internal
