// AVX2 kernels for interleaved Q8_0, Q4_0, IQ4_NL, MXFP4 and Q5_0 weights (BlockQ8_0x16, ...): the
// 16-row group as two halves of 8 rows, one 256-bit lane per row. Per 4-element chunk one 32-byte
// load of a half's codes (Q8_0: made signed again, w = u - 128, and split into |w| and sign; Q4_0:
// the nibbles, unsigned) serves every token, whose 4 codes are
// broadcast to all lanes and multiplied by maddubs and madd: exact int32 block dots per row. Then
// per block and token: convert, (d_w * d_a), multiply and add, lane by lane as the scalar twin (no
// FMA), so every output is the scalar vec_dot's bits.
#include <immintrin.h>

#include <cstring>
#include <initializer_list>

#include "quant/kernel_registry.h"

namespace lamina::quant_internal {
namespace {

constexpr int kRows = kQ8_0x16Rows;
constexpr int kTokens = 4;  // tokens per register block: 4 float + 4 int accumulators

inline __m256i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm256_set1_epi32(v);
}

// Rows [8h, 8h + 8)'s fp16 scales as f32.
inline __m256 Fp16Scales(const fp16_t* d) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d)));
}

// Rows [8h, 8h + 8) of chunk c, as the two maddubs operands: x unsigned, and the token's codes
// q with the sign of the weight folded in (Q8_0: x = |w|, q * sign(w)), so maddubs(x, q') sums
// w * q in pairs without saturating; Q4_0 codes are unsigned already (u = w + 8, corrected by
// the -8 * sum(q) start value).
struct Q8_0x16 {
  using Block = BlockQ8_0x16;
  static constexpr int kOffset = 0;  // the codes are made signed again here
  // Whether a block's 8 chunks of maddubs pair sums add up as words (GemmWide): |w| * 128 * 16
  // must stay below 2^15 (Q4_0: 15, MXFP4: 12; Q8_0 and IQ4_NL: up to 128, one chunk each).
  static constexpr bool kWordSums = false;
  struct Codes {
    __m256i x, s;
    __m256i Signed(__m256i q) const { return _mm256_sign_epi8(q, s); }
  };
  static Codes Load(const Block& w, int h, int c) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs + 64 * c + 32 * h));
    const __m256i s = _mm256_xor_si256(u, _mm256_set1_epi8(static_cast<char>(0x80)));
    return {_mm256_sign_epi8(s, s), s};
  }
  static __m256 Scales(const Block& w, int h) { return Fp16Scales(w.d + 8 * h); }
};
struct Q4_0x16 {
  using Block = BlockQ4_0x16;
  static constexpr int kOffset = 8;
  static constexpr bool kWordSums = true;
  struct Codes {
    __m256i x;
    __m256i Signed(__m256i q) const { return q; }
  };
  static Codes Load(const Block& w, int h, int c) {
    const __m256i v =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs + 64 * (c % 4) + 32 * h));
    return {_mm256_and_si256(c < 4 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F))};
  }
  static __m256 Scales(const Block& w, int h) { return Fp16Scales(w.d + 8 * h); }
};

// A 4-bit table type's chunk c, rows [8h, 8h + 8) (nibbles as BlockQ4_0x16's): the levels,
// signed, by an in-lane byte shuffle, then split as Q8_0's codes.
inline Q8_0x16::Codes TableCodes(const int8_t* levels, const uint8_t* qs, int h, int c) {
  const __m256i v =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 64 * (c % 4) + 32 * h));
  const __m256i nib = _mm256_and_si256(c < 4 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
  const __m256i s = _mm256_shuffle_epi8(
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(levels))), nib);
  return {_mm256_sign_epi8(s, s), s};
}

// IQ4_NL: TableCodes with its levels.
struct IQ4_NLx16 {
  using Block = BlockIQ4_NLx16;
  static constexpr int kOffset = 0;
  static constexpr bool kWordSums = false;
  using Codes = Q8_0x16::Codes;
  static Codes Load(const Block& w, int h, int c) { return TableCodes(kIq4NlLevels, w.qs, h, c); }
  static __m256 Scales(const Block& w, int h) { return Fp16Scales(w.d + 8 * h); }
};

// MXFP4: the E2M1 levels the same way; the scale is E8M0ToF32Half of the row's exponent e, built
// as its f32 bits: (e - 1) << 23, or for e < 2 the subnormals 0x00200000 << e.
struct MXFP4x16 {
  using Block = BlockMXFP4x16;
  static constexpr int kOffset = 0;
  static constexpr bool kWordSums = true;
  using Codes = Q8_0x16::Codes;
  static Codes Load(const Block& w, int h, int c) { return TableCodes(kMxfp4Levels, w.qs, h, c); }
  static __m256 Scales(const Block& w, int h) {
    int64_t bytes;
    std::memcpy(&bytes, w.e + 8 * h, sizeof(bytes));
    const __m256i e = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, tiny));
  }
};

// Rows [8h, 8h + 8) of one block against N tokens: acc[t] += float(dot) * (d_w * d_a[t]).
template <class L, int N>
inline void HalfBlockStep(const typename L::Block& w, int h, const BlockQ8_0Act* const* a,
                          int64_t i, __m256* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i sum[N];
  for (int t = 0; t < N; ++t) sum[t] = _mm256_set1_epi32(-L::kOffset * a[t][i].sum);
#pragma GCC unroll 8
  for (int c = 0; c < 8; ++c) {
    const typename L::Codes codes = L::Load(w, h, c);
#pragma GCC unroll 4
    for (int t = 0; t < N; ++t) {
      const __m256i q = codes.Signed(Broadcast4(a[t][i].qs + 4 * c));
      sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(codes.x, q), ones));
    }
  }
  const __m256 dw = L::Scales(w, h);
#pragma GCC unroll 4
  for (int t = 0; t < N; ++t) {
    const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(a[t][i].d));
    acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_cvtepi32_ps(sum[t]), scale));
  }
}

template <class L, int N>
void GemmHalfN(int64_t nb, const typename L::Block* w, int h, const char* act, size_t act_row_bytes,
               float* out, size_t out_stride) {
  const BlockQ8_0Act* a[N];
  __m256 acc[N];
  for (int t = 0; t < N; ++t) {
    a[t] = reinterpret_cast<const BlockQ8_0Act*>(act + t * act_row_bytes);
    acc[t] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < nb; ++i) HalfBlockStep<L, N>(w[i], h, a, i, acc);
  for (int t = 0; t < N; ++t) _mm256_storeu_ps(out + t * out_stride + 8 * h, acc[t]);
}

template <class L>
void GemmHalf(int64_t nb, const typename L::Block* w, int h, const char* a, size_t stride, int n,
              float* out, size_t out_stride) {
  switch (n) {
    case 1:
      return GemmHalfN<L, 1>(nb, w, h, a, stride, out, out_stride);
    case 2:
      return GemmHalfN<L, 2>(nb, w, h, a, stride, out, out_stride);
    case 3:
      return GemmHalfN<L, 3>(nb, w, h, a, stride, out, out_stride);
    default:
      return GemmHalfN<L, 4>(nb, w, h, a, stride, out, out_stride);
  }
}

template <class L>
void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  const auto* w = static_cast<const typename L::Block*>(group);
  const char* a = static_cast<const char*>(act);
  const int64_t nb = k / kQK;
  for (int t = 0; t < n_act; t += kTokens) {
    const int n = n_act - t < kTokens ? n_act - t : kTokens;
    for (int h = 0; h < kRows / 8; ++h) {
      GemmHalf<L>(nb, w, h, a + t * act_row_bytes, act_row_bytes, n, out + t * out_stride,
                  out_stride);
    }
  }
}

// Prompt-sized calls (kAvx2WideMinTokens tokens or more): per block the codes of both halves are
// split once for every token of the call, then tiles of WideTokens<L> tokens take their int32
// block dots from them (each token's broadcast codes serve both halves); the float accumulators
// live in memory. Q4_0 and MXFP4 (kWordSums) add a block's 8 maddubs pair sums as words, exact
// (at most 8 * 2 * 15 * 128 = 30720 in magnitude), and widen them by one madd; the others take
// one madd per chunk. Each token's block dot is the same exact integer and its convert, multiply
// and add are HalfBlockStep's, in the same order, so the bits are Gemm's.
template <class L>
constexpr int WideTokens() {  // registers: a sum per token and half, a chunk's codes, temporaries
  return L::kWordSums ? 6 : 4;
}

template <class L, int N>
inline void WideTile(const typename L::Codes (*codes)[8], const __m256* dw,
                     const BlockQ8_0Act* const* a, int64_t i, float (*acc)[kRows]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i sum[2][N];  // [half][token]
  if constexpr (L::kWordSums) {
    __m256i pairs[2][N];  // [half][token]: the pair sums so far, as words
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        const __m256i b = Broadcast4(a[t][i].qs + 4 * c);
        for (int h = 0; h < 2; ++h) {
          const __m256i p = _mm256_maddubs_epi16(codes[h][c].x, codes[h][c].Signed(b));
          pairs[h][t] = c == 0 ? p : _mm256_add_epi16(pairs[h][t], p);
          asm("" : "+x"(pairs[h][t]));
        }
      }
    }
    for (int t = 0; t < N; ++t) {
      const __m256i offset = _mm256_set1_epi32(-L::kOffset * a[t][i].sum);
      for (int h = 0; h < 2; ++h) {
        sum[h][t] = _mm256_add_epi32(offset, _mm256_madd_epi16(pairs[h][t], ones));
      }
    }
  } else {
    for (int t = 0; t < N; ++t) {
      sum[0][t] = sum[1][t] = _mm256_set1_epi32(-L::kOffset * a[t][i].sum);
    }
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        const __m256i b = Broadcast4(a[t][i].qs + 4 * c);
        for (int h = 0; h < 2; ++h) {
          const __m256i q = codes[h][c].Signed(b);
          sum[h][t] = _mm256_add_epi32(
              sum[h][t], _mm256_madd_epi16(_mm256_maddubs_epi16(codes[h][c].x, q), ones));
          // Keeps each sum one running register (GCC would otherwise spill every product).
          asm("" : "+x"(sum[h][t]));
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) {
    const __m256 da = _mm256_set1_ps(a[t][i].d);
    for (int h = 0; h < 2; ++h) {
      const __m256 scale = _mm256_mul_ps(dw[h], da);
      const __m256 prev = _mm256_load_ps(acc[t] + 8 * h);
      _mm256_store_ps(acc[t] + 8 * h,
                      _mm256_add_ps(prev, _mm256_mul_ps(_mm256_cvtepi32_ps(sum[h][t]), scale)));
    }
  }
}

// WideTile for nt (1..N) tokens.
template <class L, int N>
inline void WideTileOf(int nt, const typename L::Codes (*codes)[8], const __m256* dw,
                       const BlockQ8_0Act* const* a, int64_t i, float (*acc)[kRows]) {
  if constexpr (N > 1) {
    if (nt < N) return WideTileOf<L, N - 1>(nt, codes, dw, a, i, acc);
  }
  WideTile<L, N>(codes, dw, a, i, acc);
}

template <class L>
void GemmWide(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
              float* out, size_t out_stride) {
  constexpr int kN = WideTokens<L>();
  const auto* w = static_cast<const typename L::Block*>(group);
  const char* ac = static_cast<const char*>(act);
  const int64_t nb = k / kQK;
  const BlockQ8_0Act* a[kMaxGemmTokens];
  for (int t = 0; t < n_act; ++t)
    a[t] = reinterpret_cast<const BlockQ8_0Act*>(ac + t * act_row_bytes);
  alignas(32) float acc[kMaxGemmTokens][kRows] = {};  // [token][row]
  for (int64_t i = 0; i < nb; ++i) {
    typename L::Codes codes[2][8];  // [half][chunk]
    __m256 dw[2];                   // [half]
    for (int h = 0; h < 2; ++h) {
      for (int c = 0; c < 8; ++c) codes[h][c] = L::Load(w[i], h, c);
      dw[h] = L::Scales(w[i], h);
    }
    int t0 = 0;
    for (; t0 + kN <= n_act; t0 += kN) WideTile<L, kN>(codes, dw, a + t0, i, acc + t0);
    if (t0 < n_act) WideTileOf<L, kN>(n_act - t0, codes, dw, a + t0, i, acc + t0);
  }
  for (int t = 0; t < n_act; ++t) {
    for (int h = 0; h < 2; ++h) {
      _mm256_storeu_ps(out + t * out_stride + 8 * h, _mm256_load_ps(acc[t] + 8 * h));
    }
  }
}

// Decode and verify calls (up to kMaxMultiDot tokens) run Gemm, prompt-sized ones GemmWide.
template <class L>
void GemmAny(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
             float* out, size_t out_stride) {
  if (n_act >= kAvx2WideMinTokens)
    return GemmWide<L>(k, group, act, act_row_bytes, n_act, out, out_stride);
  Gemm<L>(k, group, act, act_row_bytes, n_act, out, out_stride);
}

// ---------------------------------------------------------------------------------------------
// Q5_0 (BlockQ5_0x16) in the AVX2 row kernel's order (GemmQ5_0x16Lanes, interleaved.cpp): per row
// eight float lanes, lane c summing fma(float(dot of elements 4c..4c+3), d_w * d_a) over the
// blocks, then HsumPs's tree. Here a register holds lane c of 8 rows (one 32-bit lane per row,
// as the kernels above), so lane c of every row is its own accumulator acc[c]: per block, half
// and token, chunk c costs one sign, maddubs, madd, convert and FMA for 8 rows, and the scale
// d_w * d_a one multiply for 8 rows (the row kernel pays a broadcast per row). Decoding: the 8
// rows' 16 nibble bytes are transposed to four vectors of 4-byte words (word w: elements
// 4w..4w+3 in the low nibbles, chunk w; 16 + 4w.. in the high ones, chunk w + 4), the fifth bits
// come from the rows' qh words by one in-lane byte shuffle and compare per chunk, and the codes
// go in signed (q = u - 16, as |q| and the token's codes times sign(q)), so every int32 lane is
// the exact chunk dot.

// Rows [8h, 8h + 8) of one block, decoded chunk by chunk.
struct Q5Half {
  __m256i word[4];  // word[w] lane r: bytes 4w..4w+3 of row 8h + r's qs
  __m256i qh;       // lane r: row 8h + r's 32 fifth bits

  Q5Half(const BlockQ5_0x16& b, int h) {
    const uint8_t* q = b.qs + 16 * 8 * h;
    __m256i v[4];  // v[j]: row j in the low 128 bits, row j + 4 in the high ones
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(q + 16 * (j + 4)),
                                 reinterpret_cast<const __m128i*>(q + 16 * j));
    }
    const __m256i lo01 = _mm256_unpacklo_epi32(v[0], v[1]);
    const __m256i hi01 = _mm256_unpackhi_epi32(v[0], v[1]);
    const __m256i lo23 = _mm256_unpacklo_epi32(v[2], v[3]);
    const __m256i hi23 = _mm256_unpackhi_epi32(v[2], v[3]);
    word[0] = _mm256_unpacklo_epi64(lo01, lo23);
    word[1] = _mm256_unpackhi_epi64(lo01, lo23);
    word[2] = _mm256_unpacklo_epi64(hi01, hi23);
    word[3] = _mm256_unpackhi_epi64(hi01, hi23);
    qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 4 * 8 * h));
  }

  // Chunk c's signed codes q = u - 16: lane r's byte e is element 4c + e of row 8h + r.
  __m256i Codes(int c) const {
    const __m256i nib = _mm256_and_si256(c < 4 ? word[c] : _mm256_srli_epi16(word[c - 4], 4),
                                         _mm256_set1_epi8(0x0F));
    // Byte e of each lane takes qh byte c / 2 of its row and tests bit 4 (c % 2) + e.
    const __m256i idx = _mm256_add_epi8(_mm256_set_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0,
                                                         0x0C0C0C0C, 0x08080808, 0x04040404, 0),
                                        _mm256_set1_epi8(static_cast<char>(c / 2)));
    const __m256i pick = _mm256_shuffle_epi8(qh, idx);
    const __m256i sel = _mm256_set1_epi32(static_cast<int>(0x08040201u << (4 * (c % 2))));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(pick, sel), sel);
    // u - 16 = nib where the fifth bit is set, nib | 0xF0 (nib - 16) where it is clear.
    return _mm256_or_si256(nib,
                           _mm256_andnot_si256(set, _mm256_set1_epi8(static_cast<char>(0xF0))));
  }
};

// Rows [8h, 8h + 8) against N tokens.
template <int N>
void Q5HalfN(int64_t nb, const BlockQ5_0x16* w, int h, const BlockQ8_0Act* const* a, float* out,
             size_t out_stride) {
  __m256 acc[8][N];  // [chunk][token]: lane r = row 8h + r's float lane c
  for (int c = 0; c < 8; ++c) {
    for (int t = 0; t < N; ++t) acc[c][t] = _mm256_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < nb; ++i) {
    const Q5Half blk(w[i], h);
    const __m256 dw = Fp16Scales(w[i].d + 8 * h);
    __m256 scale[N];
#pragma GCC unroll 8
    for (int t = 0; t < N; ++t) scale[t] = _mm256_mul_ps(dw, _mm256_set1_ps(a[t][i].d));
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m256i q = blk.Codes(c);
      const __m256i x = _mm256_sign_epi8(q, q);
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        const __m256i y = _mm256_sign_epi8(Broadcast4(a[t][i].qs + 4 * c), q);
        const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), ones);
        acc[c][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale[t], acc[c][t]);
      }
    }
  }
  // HsumPs's tree per row, ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), plus the row
  // kernel's 0.0f.
  for (int t = 0; t < N; ++t) {
    const __m256 v0 = _mm256_add_ps(acc[0][t], acc[4][t]);
    const __m256 v1 = _mm256_add_ps(acc[1][t], acc[5][t]);
    const __m256 v2 = _mm256_add_ps(acc[2][t], acc[6][t]);
    const __m256 v3 = _mm256_add_ps(acc[3][t], acc[7][t]);
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(v0, v2), _mm256_add_ps(v1, v3));
    _mm256_storeu_ps(out + t * out_stride + 8 * h, _mm256_add_ps(sum, _mm256_setzero_ps()));
  }
}

constexpr int kQ5Tokens = 8;  // tokens per pass over a half's blocks

using Q5HalfFn = void (*)(int64_t, const BlockQ5_0x16*, int, const BlockQ8_0Act* const*, float*,
                          size_t);
constexpr Q5HalfFn kQ5Half[8] = {Q5HalfN<1>, Q5HalfN<2>, Q5HalfN<3>, Q5HalfN<4>,
                                 Q5HalfN<5>, Q5HalfN<6>, Q5HalfN<7>, Q5HalfN<8>};

void GemmQ5_0(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
              float* out, size_t out_stride) {
  const auto* w = static_cast<const BlockQ5_0x16*>(group);
  const char* ac = static_cast<const char*>(act);
  const int64_t nb = k / kQK;
  for (int t0 = 0; t0 < n_act; t0 += kQ5Tokens) {
    const int n = n_act - t0 < kQ5Tokens ? n_act - t0 : kQ5Tokens;
    const BlockQ8_0Act* a[kQ5Tokens];
    for (int t = 0; t < n; ++t) {
      a[t] = reinterpret_cast<const BlockQ8_0Act*>(ac + (t0 + t) * act_row_bytes);
    }
    for (int h = 0; h < kRows / 8; ++h)
      kQ5Half[n - 1](nb, w, h, a, out + t0 * out_stride, out_stride);
  }
}

// Prompt-sized Q5_0 calls (kAvx2WideMinTokens tokens or more): kQ5Slab blocks at a time are
// decoded once per call (per half and chunk the codes' magnitudes and the signed codes, and d_w),
// then tiles of up to kQ5Tokens tokens run chunk by chunk: lane c's accumulators of a tile's
// tokens stay in registers over the slab's blocks (in block order, as Q5HalfN) and live in memory
// between slabs; each token's d_w * d_a per block is multiplied once per slab. Every chunk dot,
// FMA and the final tree are Q5HalfN's, so are the bits.
constexpr int kQ5Slab = 8;  // blocks decoded at a time

struct alignas(32) WideQ5 {
  __m256i x[2][8], q[2][8];  // [half][chunk]: |codes| and the signed codes, lane r = row 8h + r
  __m256 dw[2];              // [half]
};

// Blocks [i0, i0 + ns) (decoded in u) against N tokens, half h: acc[t] (the token's [half][chunk]
// lanes) += each chunk's dot times scale.
template <int N>
void Q5WideTile(const WideQ5* u, int ns, int64_t i0, const BlockQ8_0Act* const* a,
                __m256 (*acc)[2][8]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 scale[kQ5Slab][2][N];  // [block][half][token]
  for (int s = 0; s < ns; ++s) {
    for (int t = 0; t < N; ++t) {
      const __m256 da = _mm256_set1_ps(a[t][i0 + s].d);
      for (int h = 0; h < 2; ++h) scale[s][h][t] = _mm256_mul_ps(u[s].dw[h], da);
    }
  }
  for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 1
    for (int c = 0; c < 8; ++c) {
      __m256 sum[N];  // [token]: lane c of the half's rows
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) sum[t] = acc[t][h][c];
#pragma GCC unroll 1
      for (int s = 0; s < ns; ++s) {
        const __m256i x = u[s].x[h][c], q = u[s].q[h][c];
#pragma GCC unroll 8
        for (int t = 0; t < N; ++t) {
          const __m256i y = _mm256_sign_epi8(Broadcast4(a[t][i0 + s].qs + 4 * c), q);
          const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), ones);
          sum[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale[s][h][t], sum[t]);
        }
      }
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) acc[t][h][c] = sum[t];
    }
  }
}

// Q5WideTile for nt (1..N) tokens.
template <int N>
inline void Q5WideTileOf(int nt, const WideQ5* u, int ns, int64_t i0, const BlockQ8_0Act* const* a,
                         __m256 (*acc)[2][8]) {
  if constexpr (N > 1) {
    if (nt < N) return Q5WideTileOf<N - 1>(nt, u, ns, i0, a, acc);
  }
  Q5WideTile<N>(u, ns, i0, a, acc);
}

void GemmQ5_0Wide(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
                  float* out, size_t out_stride) {
  const auto* w = static_cast<const BlockQ5_0x16*>(group);
  const char* ac = static_cast<const char*>(act);
  const int64_t nb = k / kQK;
  const BlockQ8_0Act* a[kMaxGemmTokens];
  for (int t = 0; t < n_act; ++t)
    a[t] = reinterpret_cast<const BlockQ8_0Act*>(ac + t * act_row_bytes);
  WideQ5 u[kQ5Slab];                 // [block of the slab]
  __m256 acc[kMaxGemmTokens][2][8];  // [token][half][chunk]: lane r = row 8h + r's lane c
  for (int t = 0; t < n_act; ++t) {
    for (int h = 0; h < 2; ++h) {
      for (int c = 0; c < 8; ++c) acc[t][h][c] = _mm256_setzero_ps();
    }
  }
  const int n_tiles = (n_act + kQ5Tokens - 1) / kQ5Tokens;
  for (int64_t i0 = 0; i0 < nb; i0 += kQ5Slab) {
    const int ns = nb - i0 < kQ5Slab ? static_cast<int>(nb - i0) : kQ5Slab;
    for (int s = 0; s < ns; ++s) {
      for (int h = 0; h < 2; ++h) {
        const Q5Half blk(w[i0 + s], h);
        for (int c = 0; c < 8; ++c) {
          const __m256i q = blk.Codes(c);
          u[s].q[h][c] = q;
          u[s].x[h][c] = _mm256_sign_epi8(q, q);
        }
        u[s].dw[h] = Fp16Scales(w[i0 + s].d + 8 * h);
      }
    }
    for (int tt = 0; tt < n_tiles; ++tt) {
      const int t0 = tt * n_act / n_tiles, nt = (tt + 1) * n_act / n_tiles - t0;
      Q5WideTileOf<kQ5Tokens>(nt, u, ns, i0, a + t0, acc + t0);
    }
  }
  // Q5HalfN's tree per row and its 0.0f.
  for (int t = 0; t < n_act; ++t) {
    for (int h = 0; h < 2; ++h) {
      const __m256* l = acc[t][h];
      const __m256 v0 = _mm256_add_ps(l[0], l[4]), v1 = _mm256_add_ps(l[1], l[5]);
      const __m256 v2 = _mm256_add_ps(l[2], l[6]), v3 = _mm256_add_ps(l[3], l[7]);
      const __m256 sum = _mm256_add_ps(_mm256_add_ps(v0, v2), _mm256_add_ps(v1, v3));
      _mm256_storeu_ps(out + t * out_stride + 8 * h, _mm256_add_ps(sum, _mm256_setzero_ps()));
    }
  }
}

void GemmQ5_0Any(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
                 float* out, size_t out_stride) {
  if (n_act >= kAvx2WideMinTokens)
    return GemmQ5_0Wide(k, group, act, act_row_bytes, n_act, out, out_stride);
  GemmQ5_0(k, group, act, act_row_bytes, n_act, out, out_stride);
}

}  // namespace

void RegisterAvx2Interleaved(KernelTable& table) {
  table[static_cast<int>(GgmlType::kQ8_0)].gemm_interleaved = GemmAny<Q8_0x16>;
  table[static_cast<int>(GgmlType::kQ8_0)].gemm_max_tokens = kMaxGemmTokens;
  table[static_cast<int>(GgmlType::kQ4_0)].gemm_interleaved = GemmAny<Q4_0x16>;
  table[static_cast<int>(GgmlType::kIQ4_NL)].gemm_interleaved = GemmAny<IQ4_NLx16>;
  table[static_cast<int>(GgmlType::kMXFP4)].gemm_interleaved = GemmAny<MXFP4x16>;
  table[static_cast<int>(GgmlType::kQ5_0)].gemm_interleaved = GemmQ5_0Any;
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kIQ4_NL, GgmlType::kMXFP4, GgmlType::kQ5_0}) {
    table[static_cast<int>(t)].gemm_max_tokens = kMaxGemmTokens;
  }
}

}  // namespace lamina::quant_internal
