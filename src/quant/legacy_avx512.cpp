// AVX-512 (F/BW/VL/DQ/VNNI) kernels for F32, F16, BF16, the legacy quants and the 32-element
// table types (IQ4_NL, MXFP4). Float types use 512-bit FMAs with masked tails; quant blocks use
// VNNI dot products, which accumulate u8 x s8 products straight into int32 lanes: 256-bit (one
// 32-byte block per register) for Q4_1, Q5_0 and Q5_1, and 512-bit register-blocked tiles (two
// blocks per register) for Q4_0, Q8_0, IQ4_NL and MXFP4.
// GCC 12's AVX-512 headers self-initialise their "undefined" vectors, which -Wall reports at
// every inlined intrinsic (GCC PR105593); the warnings say nothing about this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "quant/kernel_registry.h"

namespace lamina::quant_internal {
namespace {

constexpr int kAvx512TileRows = 4;  // rows per register block of the tiles below

inline float HsumPs(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline float HalfToF32(fp16_t h) { return _cvtsh_ss(h); }

// ---------------------------------------------------------------------------------------------
// Float types: 16 lanes per step, masked loads for the k % 16 tail.

struct F32Src {
  using T = float;
  static __m512 Load(const float* p) { return _mm512_loadu_ps(p); }
  static __m512 LoadMasked(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};
struct F16Src {
  using T = fp16_t;
  static __m512 Load(const fp16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 LoadMasked(const fp16_t* p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
};
struct BF16Src {
  using T = bf16_t;
  static __m512 Widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 Load(const bf16_t* p) {
    return Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 LoadMasked(const bf16_t* p, __mmask16 m) {
    return Widen(_mm256_maskz_loadu_epi16(m, p));
  }
};

inline __mmask16 TailMask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

constexpr size_t kPrefetchAhead = 2048;  // bytes of a lone weight row's stream read ahead

// Sixteen _mm512_reduce_add_ps at once, transposed: the same additions of the same lanes (GCC's
// tree: x[i] + x[i + 8], then + the lane 4 up, then lanes 0 + 2 and 1 + 3, then those two; IEEE
// addition commutes, so the operands' order within a pair does not matter), three shuffles and
// adds per two vectors and step instead of a shuffle chain per vector. v[i]'s sum lands in
// res[ReducedSlot(i)].
constexpr int ReducedSlot(int i) { return 4 * (i % 4) + i / 4; }
__attribute__((always_inline)) inline void ReduceAdd16(const __m512* v, float* res) {
  __m512 u[8], w[4], z[2];
  for (int m = 0; m < 8; ++m) {  // [T3(v[2m]) | T3(v[2m + 1])], T3[i] = x[i] + x[i + 8]
    u[m] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int m = 0; m < 4; ++m) {  // per 128-bit lane L: T6(v[4m + L]), T6[i] = T3[i] + T3[i + 4]
    w[m] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * m], u[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u[2 * m], u[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  for (int m = 0; m < 2; ++m) {  // per lane: T6[0] + T6[2], T6[1] + T6[3] of w[2m], then w[2m + 1]
    z[m] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * m], w[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * m], w[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // Lane L, element e: the sum of v[4e + L].
  _mm512_storeu_ps(res, _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1))));
}

// One 16-element step of a block: each of the R weight vectors (widened once) against each of
// the N activation vectors (loaded once, kept in a register for the R rows: left to itself the
// compiler folds the load into every FMA, R loads where one does).
template <class SW, class SA, int R, int N, bool kMasked>
__attribute__((always_inline)) inline void FloatStep(__m512* acc, const typename SW::T* const* w,
                                                     const typename SA::T* const* a, int64_t i,
                                                     __mmask16 m) {
  __m512 wv[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) wv[r] = kMasked ? SW::LoadMasked(w[r] + i, m) : SW::Load(w[r] + i);
#pragma GCC unroll 16
  for (int j = 0; j < N; ++j) {
    __m512 av = kMasked ? SA::LoadMasked(a[j] + i, m) : SA::Load(a[j] + i);
    if constexpr (R > 1) __asm__("" : "+v"(av));
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r * N + j] = _mm512_fmadd_ps(wv[r], av, acc[r * N + j]);
  }
}

// The canonical order of a float dot on AVX-512 (F32, F16, BF16; every kernel below keeps it, so
// vec_dot, vec_dot_multi and the tiles of any shape give the same bits for a (row, token) pair):
// one 16-lane accumulator, lane l summing w[i] a[i] for i = l (mod 16) by FMAs in increasing i,
// the k % 16 tail (masked) last; then _mm512_reduce_add_ps's fixed tree of 15 additions. One pass
// with nothing stored: each pair is one dependent FMA chain, so a block runs R weight rows × N
// activation rows as R × N independent chains (8 rows for one token, a decode step; 2 rows × 9
// tokens for a verify window), each loaded (widened) weight vector serving N tokens and each
// activation vector R rows. The AVX2 kernels keep their own order (8 lanes, a scalar tail).
//
// `ahead`: R rows further on, row r at ahead + r * ahead_stride bytes, which the block prefetches
// line by line as it reads its own rows, so a later block's weights are on their way from L3
// while this one computes (a block's rows are a few short streams, too short for the hardware
// prefetcher to get ahead of). Prefetches change no result.
template <class SW, class SA, int R, int N>
void VecDotFloatBlock(int64_t k, const typename SW::T* const* w, const typename SA::T* const* a,
                      float* out, size_t out_stride, const char* ahead, size_t ahead_stride) {
  using TW = typename SW::T;
  constexpr int kPairs = R * N;
  __m512 acc[kPairs];  // [R rows][N tokens] the pairs' 16-lane sums
#pragma GCC unroll 32
  for (int p = 0; p < kPairs; ++p) acc[p] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {  // two steps per 64-byte line of f16 weights prefetched
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      for (size_t b = 0; b < 32 * sizeof(TW); b += 64) {
        _mm_prefetch(ahead + r * ahead_stride + i * sizeof(TW) + b, _MM_HINT_T0);
      }
    }
    FloatStep<SW, SA, R, N, false>(acc, w, a, i, 0);
    FloatStep<SW, SA, R, N, false>(acc, w, a, i + 16, 0);
  }
  if (i + 16 <= k) {
    FloatStep<SW, SA, R, N, false>(acc, w, a, i, 0);
    i += 16;
  }
  if (i < k) FloatStep<SW, SA, R, N, true>(acc, w, a, i, TailMask(k - i));
  // The reductions: sixteen at a time (ReduceAdd16), a remainder of up to four one by one.
  constexpr int kFull = kPairs / 16 * 16, kRest = kPairs - kFull;
  constexpr bool kPad = kRest > 4;
  float res[kFull + (kPad ? 16 : kRest)];
#pragma GCC unroll 2
  for (int p = 0; p < kFull; p += 16) ReduceAdd16(acc + p, res + p);
  if constexpr (kPad) {
    __m512 v[16];
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p) v[p] = p < kRest ? acc[kFull + p] : _mm512_setzero_ps();
    ReduceAdd16(v, res + kFull);
  } else {
#pragma GCC unroll 4
    for (int p = 0; p < kRest; ++p) res[kFull + p] = _mm512_reduce_add_ps(acc[kFull + p]);
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      const int p = r * N + j;
      out[j * out_stride + r] =
          p >= kFull && !kPad ? res[p] : res[p / 16 * 16 + ReducedSlot(p % 16)];
    }
  }
}

// One weight row against N activation rows (vec_dot, vec_dot_multi): a lone row's stream is
// prefetched kPrefetchAhead bytes on (past the row's end: the matmul's next rows, which a
// row-by-row caller reads next; a prefetch of bytes past an array is harmless).
// SW: the weights' element type, SA: the activations' (F16 weights take f32 activations).
template <class SW, class SA, int N>
void VecDotFloatMultiN(int64_t k, const void* vw, const char* act, size_t stride, float* out) {
  using TW = typename SW::T;
  using TA = typename SA::T;
  const TW* w[1] = {static_cast<const TW*>(vw)};
  const TA* a[N];
  for (int j = 0; j < N; ++j) a[j] = reinterpret_cast<const TA*>(act + j * stride);
  VecDotFloatBlock<SW, SA, 1, N>(k, w, a, out, 1,
                                 reinterpret_cast<const char*>(w[0]) + kPrefetchAhead, 0);
}

template <class SW, class SA>
void VecDotFloatMulti(int64_t k, const void* w, const void* act, size_t stride, int n, float* out) {
  const char* a = static_cast<const char*>(act);
  switch (n) {
    case 1:
      return VecDotFloatMultiN<SW, SA, 1>(k, w, a, stride, out);
    case 2:
      return VecDotFloatMultiN<SW, SA, 2>(k, w, a, stride, out);
    case 3:
      return VecDotFloatMultiN<SW, SA, 3>(k, w, a, stride, out);
    case 4:
      return VecDotFloatMultiN<SW, SA, 4>(k, w, a, stride, out);
    case 5:
      return VecDotFloatMultiN<SW, SA, 5>(k, w, a, stride, out);
    case 6:
      return VecDotFloatMultiN<SW, SA, 6>(k, w, a, stride, out);
    case 7:
      return VecDotFloatMultiN<SW, SA, 7>(k, w, a, stride, out);
    case 8:
      return VecDotFloatMultiN<SW, SA, 8>(k, w, a, stride, out);
    default:
      for (int j = 0; j < n; ++j) VecDotFloatMultiN<SW, SA, 1>(k, w, a + j * stride, 0, &out[j]);
  }
}

// Rows per block for n tokens. One or two tokens: kMaxTileRows (8 or 16 independent FMA chains;
// two FMA ports of 4 cycles' latency need 8; with the 8 weight vectors and an activation vector,
// 25 registers at most). More: R x N accumulators within kFloatTileAccs (with R weight vectors
// and an activation vector, 31 of the 32 registers at most: 3 rows x 9 tokens), at most
// kAvx512TileRows. 27 rather than 24 accumulators: a 9-token window runs blocks of 3 rows (each
// widened weight vector serves 9 FMAs, each activation vector 3), ~10% faster than 2 rows.
constexpr int kFloatTileAccs = 27;
constexpr int kPrefetchRows = 8;  // a float tile block prefetches the rows this far on
constexpr int FloatTileRows(int n) {
  return n <= 2 ? kMaxTileRows : std::min(kAvx512TileRows, kFloatTileAccs / n);
}

template <class SW, class SA, int N, int R>
void VecDotFloatTileBlockR(int64_t k, const typename SW::T* const* w,
                           const typename SA::T* const* a, float* out, size_t out_stride,
                           const char* ahead, size_t ahead_stride) {
  if constexpr (R <= FloatTileRows(N)) {
    VecDotFloatBlock<SW, SA, R, N>(k, w, a, out, out_stride, ahead, ahead_stride);
  }
}

template <class SW, class SA, int N>
void VecDotFloatTileN(int64_t k, const char* vw, size_t w_row_bytes, int n_rows, const char* act,
                      size_t act_row_bytes, float* out, size_t out_stride) {
  using TW = typename SW::T;
  using TA = typename SA::T;
  constexpr int kR = FloatTileRows(N);
  const TA* a[N];
  for (int j = 0; j < N; ++j) a[j] = reinterpret_cast<const TA*>(act + j * act_row_bytes);
  const int n_blocks = (n_rows + kR - 1) / kR;
  for (int b = 0; b < n_blocks; ++b) {  // blocks as even as possible (8 rows by 3: 3, 3, 2)
    const int r0 = b * n_rows / n_blocks, nr = (b + 1) * n_rows / n_blocks - r0;
    const TW* w[kR];
    for (int r = 0; r < nr; ++r) w[r] = reinterpret_cast<const TW*>(vw + (r0 + r) * w_row_bytes);
    float* o = out + r0;
    // The rows kPrefetchRows on (past the call's last row: the caller's next rows, or bytes a
    // prefetch may touch harmlessly); consecutive blocks prefetch every row once.
    const char* ahead = vw + (r0 + kPrefetchRows) * w_row_bytes;
    // [kR] the block for 1..kR rows
    static constexpr auto kBlocks = []<int... I>(std::integer_sequence<int, I...>) {
      return std::array{&VecDotFloatTileBlockR<SW, SA, N, I + 1>...};
    }
    (std::make_integer_sequence<int, kR>{});
    kBlocks[nr - 1](k, w, a, o, out_stride, ahead, w_row_bytes);
  }
}

// All n_act tokens (1..kMaxTileTokens) share one block, so each weight vector is loaded (and,
// for F16, widened) once per call; rows go in blocks of FloatTileRows(n_act) (8 for one token,
// 2 from 9 tokens).
template <class SW, class SA>
void VecDotFloatTile(int64_t k, const void* vw, size_t w_row_bytes, int n_rows, const void* act,
                     size_t act_row_bytes, int n_act, float* out, size_t out_stride) {
  // [kMaxTileTokens] the block for 1..kMaxTileTokens tokens
  static constexpr auto kTiles = []<int... I>(std::integer_sequence<int, I...>) {
    return std::array{&VecDotFloatTileN<SW, SA, I + 1>...};
  }
  (std::make_integer_sequence<int, kMaxTileTokens>{});
  kTiles[std::min(n_act, kMaxTileTokens) - 1](k, static_cast<const char*>(vw), w_row_bytes, n_rows,
                                              static_cast<const char*>(act), act_row_bytes, out,
                                              out_stride);
}
static_assert(kMaxTileTokens == 12 && kFloatTileAccs / kMaxTileTokens >= 2);
static_assert(FloatTileRows(1) == kMaxTileRows && kMaxTileRows == kPrefetchRows);

// ---------------------------------------------------------------------------------------------
// Legacy quants with VNNI (Q4_0 and Q8_0 use the tiles below). dpbusd multiplies unsigned by
// signed bytes. Unsigned weight codes (Q4_1, Q5_1: [0, 31]) go in as they are. For signed codes
// w (Q5_0) the activation is made unsigned instead: (y ^ 0x80) = y + 128, so dpbusd gives
// sum(y w) + 128 sum(w), and the accumulator starts at -128 sum(w), computed once per weight
// block. This is exact for every byte value, -128 included.

inline __m256i UnpackNibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

inline __m256i HighBits(const uint8_t* qh) {
  uint32_t x;
  std::memcpy(&x, qh, sizeof(x));
  return _mm256_maskz_mov_epi8(x, _mm256_set1_epi8(0x10));
}

struct Q5_0W {
  using Block = BlockQ5_0;
  using Act = BlockQ8_0;
  static constexpr bool kSigned = true;
  static __m256i Codes(const Block& b) {
    return _mm256_sub_epi8(_mm256_or_si256(UnpackNibbles(b.qs), HighBits(b.qh)),
                           _mm256_set1_epi8(16));
  }
};
struct Q4_1W {
  using Block = BlockQ4_1;
  using Act = BlockQ8_1;
  static constexpr bool kSigned = false;
  static __m256i Codes(const Block& b) { return UnpackNibbles(b.qs); }
};
struct Q5_1W {
  using Block = BlockQ5_1;
  using Act = BlockQ8_1;
  static constexpr bool kSigned = false;
  static __m256i Codes(const Block& b) {
    return _mm256_or_si256(UnpackNibbles(b.qs), HighBits(b.qh));
  }
};

template <class W>
struct Prepared {
  __m256i codes;
  __m256i init;  // dpbusd start value: -128 * sum(codes) per lane for signed codes, else 0
  float d;
  float m = 0.0f;

  explicit Prepared(const typename W::Block& b) {
    codes = W::Codes(b);
    if constexpr (W::kSigned) {
      const __m256i bias = _mm256_dpbusd_epi32(_mm256_setzero_si256(),
                                               _mm256_set1_epi8(static_cast<char>(0x80)), codes);
      init = _mm256_sub_epi32(_mm256_setzero_si256(), bias);
    } else {
      init = _mm256_setzero_si256();
      m = HalfToF32(b.m);
    }
    d = HalfToF32(b.d);
  }

  // Eight int32 lanes summing to dot(codes, activation codes).
  __m256i Dot(const int8_t* qs) const {
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
    if constexpr (W::kSigned) {
      const __m256i yu = _mm256_xor_si256(y, _mm256_set1_epi8(static_cast<char>(0x80)));
      return _mm256_dpbusd_epi32(init, yu, codes);
    } else {
      return _mm256_dpbusd_epi32(init, codes, y);
    }
  }
};

#include "quant/legacy_quant_dot.inc"

// ---------------------------------------------------------------------------------------------
// Register-blocked tiles for Q8_0, Q4_0, IQ4_NL and MXFP4 weights: R weight rows x N activation
// rows per inner loop, two 32-element blocks per 512-bit register (lanes 0-7 the even block, 8-15
// the odd one). Here the weights are made unsigned, u = w + C (C = 128 for Q8_0 by a sign flip,
// 8 for Q4_0, whose nibbles already are w + 8, 128 for the table types, whose table holds the
// levels + 128), and the activation carries the correction: dpbusd starts
// from -C * sum(y) per lane, so per block pair a token pays its load, bias and scales once for
// all R rows, a row its decode and scales once for all N tokens, and each (row, token) one
// dpbusd, one convert, one multiply and one FMA. The token-side bias (not a row-side one) keeps
// R x N accumulators plus R rows' codes and scales within the 32 vector registers.
//
// Every output runs the same lane-wise sequence whatever R, N or its place in the tile: 16 f32
// lanes accumulate acc += float(dot) * (d_w * d_a) in block-pair order (an odd last block
// enters lanes 0-7 with zero codes and zero scales above), then one fixed reduction. So
// vec_dot, vec_dot_multi and the tile (all built from DotTile) agree bit for bit.

inline __m512i Join(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
inline __m256i Load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

struct Q8_0Tile {
  using Block = BlockQ8_0;
  static constexpr char kOffset = static_cast<char>(0x80);
  static __m512i Codes2(const Block& b0, const Block& b1) {
    return _mm512_xor_si512(Join(Load256(b0.qs), Load256(b1.qs)), _mm512_set1_epi8(kOffset));
  }
  static __m512i Codes1(const Block& b) {
    return _mm512_zextsi256_si512(_mm256_xor_si256(Load256(b.qs), _mm256_set1_epi8(kOffset)));
  }
};
// The nibbles of two blocks as bytes in element order: block 0 in bytes 0-31, block 1 in 32-63.
inline __m512i UnpackNibbles2(const uint8_t* qs0, const uint8_t* qs1) {
  const __m256i q = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1)), 1);
  // 128-bit lanes [b0 low, b1 low, b0 high, b1 high] -> [b0 low, b0 high, b1 low, b1 high].
  const __m512i z = Join(q, _mm256_srli_epi16(q, 4));
  const __m512i o = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
  return _mm512_and_si512(o, _mm512_set1_epi8(0x0F));
}

struct Q4_0Tile {
  using Block = BlockQ4_0;
  static constexpr char kOffset = 8;
  static __m512i Codes2(const Block& b0, const Block& b1) { return UnpackNibbles2(b0.qs, b1.qs); }
  static __m512i Codes1(const Block& b) { return _mm512_zextsi256_si512(UnpackNibbles(b.qs)); }
};

// IQ4_NL and MXFP4: each nibble looks up its level + 128 (the int8 level with its sign bit
// flipped) by an in-lane byte shuffle; a lone block's upper half stays zero.
template <class B, const int8_t (&kLevels)[16]>
struct Table4Tile {
  using Block = B;
  static constexpr char kOffset = static_cast<char>(0x80);
  static __m128i Table() {
    return _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kLevels)),
                         _mm_set1_epi8(static_cast<char>(0x80)));
  }
  static __m512i Codes2(const Block& b0, const Block& b1) {
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(Table()), UnpackNibbles2(b0.qs, b1.qs));
  }
  static __m512i Codes1(const Block& b) {
    return _mm512_zextsi256_si512(
        _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(Table()), UnpackNibbles(b.qs)));
  }
};
using IQ4_NLTile = Table4Tile<BlockIQ4_NL, kIq4NlLevels>;
using MXFP4Tile = Table4Tile<BlockMXFP4, kMxfp4Levels>;

// Eight copies of each block's fp16 scale as f32, lanes 8-15 zero for a lone block. (A masked
// load plus a word permute is fewer instructions, but its index vector makes the 4 x 4 tile
// spill accumulators.)
inline __m512 Scales2(fp16_t d0, fp16_t d1) {
  return _mm512_cvtph_ps(
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<short>(d0))),
                              _mm_set1_epi16(static_cast<short>(d1)), 1));
}
inline __m512 Scales1(fp16_t d) {
  return _mm512_cvtph_ps(_mm256_zextsi128_si256(_mm_set1_epi16(static_cast<short>(d))));
}
// A weight block pair's scales as Scales2 / Scales1 give them: fp16 d, or MXFP4's halved E8M0
// exponent (as the scalar twin).
template <class Block>
inline __m512 WeightScales2(const Block& b0, const Block& b1) {
  return Scales2(b0.d, b1.d);
}
template <class Block>
inline __m512 WeightScales1(const Block& b) {
  return Scales1(b.d);
}
inline __m512 WeightScales2(const BlockMXFP4& b0, const BlockMXFP4& b1) {
  return _mm512_insertf32x8(_mm512_set1_ps(E8M0ToF32Half(b0.e)),
                            _mm256_set1_ps(E8M0ToF32Half(b1.e)), 1);
}
inline __m512 WeightScales1(const BlockMXFP4& b) {
  return _mm512_zextps256_ps512(_mm256_set1_ps(E8M0ToF32Half(b.e)));
}

// dpbusd start value: -C * sum(y) per lane, exact for every activation byte.
template <class W>
inline __m512i ActBias(__m512i y) {
  const __m512i zero = _mm512_setzero_si512();
  return _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(W::kOffset), y));
}
inline float ReduceTile(__m512 v) {
  return HsumPs(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

template <class W, int R, int N>
void DotTile(int64_t nb, const char* w, size_t w_stride, const char* act, size_t a_stride,
             float* out, size_t out_stride) {
  using Block = typename W::Block;
  const Block* wr[R];
  const BlockQ8_0* at[N];
  __m512 acc[R][N];
  for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const Block*>(w + r * w_stride);
  for (int t = 0; t < N; ++t) at[t] = reinterpret_cast<const BlockQ8_0*>(act + t * a_stride);
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < N; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    __m512i codes[R];
    __m512 dw[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      codes[r] = W::Codes2(wr[r][i], wr[r][i + 1]);
      dw[r] = WeightScales2(wr[r][i], wr[r][i + 1]);
    }
#pragma GCC unroll 8
    for (int t = 0; t < N; ++t) {
      const __m512i y = Join(Load256(at[t][i].qs), Load256(at[t][i + 1].qs));
      const __m512i bias = ActBias<W>(y);
      const __m512 da = Scales2(at[t][i].d, at[t][i + 1].d);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias, codes[r], y));
        acc[r][t] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw[r], da), acc[r][t]);
      }
    }
  }
  if (i < nb) {
    __m512i codes[R];
    __m512 dw[R];
    for (int r = 0; r < R; ++r) {
      codes[r] = W::Codes1(wr[r][i]);
      dw[r] = WeightScales1(wr[r][i]);
    }
    for (int t = 0; t < N; ++t) {
      const __m512i y = _mm512_zextsi256_si512(Load256(at[t][i].qs));
      const __m512i bias = ActBias<W>(y);
      const __m512 da = Scales1(at[t][i].d);
      for (int r = 0; r < R; ++r) {
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias, codes[r], y));
        acc[r][t] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw[r], da), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < N; ++t) out[t * out_stride + r] = ReduceTile(acc[r][t]);
  }
}

// Widest token group per row count that keeps R x N accumulators plus R rows' codes, biases
// and scales within the 32 vector registers.
constexpr int kTileTokens[kAvx512TileRows + 1] = {0, 8, 6, 4, 4};

template <class W, int R>
void DotTileRows(int64_t nb, const char* w, size_t w_stride, const char* act, size_t a_stride,
                 int n_act, float* out, size_t out_stride) {
  constexpr int kN = kTileTokens[R];
  int t = 0;
  for (; t + kN <= n_act; t += kN) {
    DotTile<W, R, kN>(nb, w, w_stride, act + t * a_stride, a_stride, out + t * out_stride,
                      out_stride);
  }
  const char* a = act + t * a_stride;
  float* o = out + t * out_stride;
  switch (n_act - t) {
    case 0:
      return;
    case 1:
      return DotTile<W, R, 1>(nb, w, w_stride, a, a_stride, o, out_stride);
    case 2:
      return DotTile<W, R, 2>(nb, w, w_stride, a, a_stride, o, out_stride);
    case 3:
      return DotTile<W, R, 3>(nb, w, w_stride, a, a_stride, o, out_stride);
    case 4:
      return DotTile<W, R, 4>(nb, w, w_stride, a, a_stride, o, out_stride);
    case 5:
      return DotTile<W, R, 5>(nb, w, w_stride, a, a_stride, o, out_stride);
    case 6:
      return DotTile<W, R, 6>(nb, w, w_stride, a, a_stride, o, out_stride);
    case 7:
      return DotTile<W, R, 7>(nb, w, w_stride, a, a_stride, o, out_stride);
  }
}

template <class W>
void VecDotTile(int64_t k, const void* w, size_t w_row_bytes, int n_rows, const void* act,
                size_t act_row_bytes, int n_act, float* out, size_t out_stride) {
  const int64_t nb = k / kQK;
  const char* wc = static_cast<const char*>(w);
  const char* ac = static_cast<const char*>(act);
  if (n_act == 1) {
    // Decode streams the weights from memory: one row at a time keeps a single sequential
    // stream for the prefetcher, where four interleaved rows measured ~40% slower end to end.
    for (int r = 0; r < n_rows; ++r) {
      DotTile<W, 1, 1>(nb, wc + r * w_row_bytes, 0, ac, 0, out + r, 0);
    }
    return;
  }
  switch (n_rows) {
    case 1:
      return DotTileRows<W, 1>(nb, wc, w_row_bytes, ac, act_row_bytes, n_act, out, out_stride);
    case 2:
      return DotTileRows<W, 2>(nb, wc, w_row_bytes, ac, act_row_bytes, n_act, out, out_stride);
    case 3:
      return DotTileRows<W, 3>(nb, wc, w_row_bytes, ac, act_row_bytes, n_act, out, out_stride);
    case 4:
      return DotTileRows<W, 4>(nb, wc, w_row_bytes, ac, act_row_bytes, n_act, out, out_stride);
  }
}

template <class W>
void VecDotTileOne(int64_t k, float* s, const void* w, const void* a) {
  DotTile<W, 1, 1>(k / kQK, static_cast<const char*>(w), 0, static_cast<const char*>(a), 0, s, 0);
}
template <class W>
void VecDotTileMulti(int64_t k, const void* w, const void* act, size_t stride, int n, float* out) {
  DotTileRows<W, 1>(k / kQK, static_cast<const char*>(w), 0, static_cast<const char*>(act), stride,
                    n, out, 1);
}

// ---------------------------------------------------------------------------------------------
// Activation quantizers, byte-identical to the scalar ones: amax, d = amax / 127,
// id = 127 / amax, x * id rounded to nearest even by cvtps2dq, saturating narrow (a no-op, the
// codes are within [-127, 127]).

inline float QuantizeBlock8(const float* x, int8_t* qs, int* code_sum) {
  const __m512 v0 = _mm512_loadu_ps(x);
  const __m512 v1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const float d = amax / 127.f;
  const float id = amax != 0.0f ? 127.f / amax : 0.0f;
  const __m512 mul = _mm512_set1_ps(id);
  const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, mul));
  const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, mul));
  if (code_sum != nullptr) *code_sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), _mm512_cvtsepi32_epi8(i0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 16), _mm512_cvtsepi32_epi8(i1));
  return d;
}

void QuantizeQ8_0(const float* x, void* vy, int64_t k) {
  BlockQ8_0* y = static_cast<BlockQ8_0*>(vy);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    y[i].d = _cvtss_sh(QuantizeBlock8(x + i * kQK, y[i].qs, nullptr), _MM_FROUND_TO_NEAREST_INT);
  }
}

void QuantizeQ8_1(const float* x, void* vy, int64_t k) {
  BlockQ8_1* y = static_cast<BlockQ8_1*>(vy);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    int sum = 0;
    const float d = QuantizeBlock8(x + i * kQK, y[i].qs, &sum);
    y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    y[i].s = _cvtss_sh(d * static_cast<float>(sum), _MM_FROUND_TO_NEAREST_INT);
  }
}

}  // namespace

// The registered single-row dots are the multi kernels with one row: out[j] of a multi call
// then never depends on how many rows share it, so a token gives bit-identical results in a
// prompt batch and in single-token decode (the KV write-path tests rely on this).
template <class SW, class SA>
void VecDotFloatOne(int64_t k, float* s, const void* w, const void* a) {
  VecDotFloatMultiN<SW, SA, 1>(k, w, static_cast<const char*>(a), 0, s);
}
template <class W>
void VecDotQuantOne(int64_t k, float* s, const void* w, const void* a) {
  VecDotQuantMultiN<W, 1>(k, w, static_cast<const char*>(a), 0, s);
}

// These tiles block at most kAvx512TileRows rows; a caller may pass up to kMaxTileRows (the AVX2
// float tile's one-token shape), so the registered kernels take them four at a time.
template <VecDotTileFn kTile>
void InTilesOfFour(int64_t k, const void* w, size_t w_row_bytes, int n_rows, const void* act,
                   size_t act_row_bytes, int n_act, float* out, size_t out_stride) {
  for (int r = 0; r < n_rows; r += kAvx512TileRows) {
    kTile(k, static_cast<const char*>(w) + r * w_row_bytes, w_row_bytes,
          std::min(kAvx512TileRows, n_rows - r), act, act_row_bytes, n_act, out + r, out_stride);
  }
}

void RegisterAvx512Legacy(KernelTable& table) {
  // A tile inherited from the AVX2 table gives the AVX2 kernel's bits: every type whose dot
  // product is replaced here loses it, and the types with an AVX-512 tile set theirs below.
  auto set = [&](GgmlType t, VecDotFn dot, VecDotMultiFn multi) {
    table[static_cast<int>(t)].vec_dot = dot;
    table[static_cast<int>(t)].vec_dot_multi = multi;
    table[static_cast<int>(t)].vec_dot_tile = nullptr;
    table[static_cast<int>(t)].tile_min_tokens = 1;
    table[static_cast<int>(t)].tile_max_tokens = kMaxMultiDot;
  };
  set(GgmlType::kF32, VecDotFloatOne<F32Src, F32Src>, VecDotFloatMulti<F32Src, F32Src>);
  set(GgmlType::kF16, VecDotFloatOne<F16Src, F32Src>, VecDotFloatMulti<F16Src, F32Src>);
  set(GgmlType::kBF16, VecDotFloatOne<BF16Src, BF16Src>, VecDotFloatMulti<BF16Src, BF16Src>);
  table[static_cast<int>(GgmlType::kF32)].vec_dot_tile = VecDotFloatTile<F32Src, F32Src>;
  table[static_cast<int>(GgmlType::kF16)].vec_dot_tile = VecDotFloatTile<F16Src, F32Src>;
  table[static_cast<int>(GgmlType::kBF16)].vec_dot_tile = VecDotFloatTile<BF16Src, BF16Src>;
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    table[static_cast<int>(t)].tile_max_tokens = kMaxTileTokens;
  }
  set(GgmlType::kQ4_0, VecDotTileOne<Q4_0Tile>, VecDotTileMulti<Q4_0Tile>);
  table[static_cast<int>(GgmlType::kQ4_0)].vec_dot_tile = InTilesOfFour<VecDotTile<Q4_0Tile>>;
  set(GgmlType::kQ4_1, VecDotQuantOne<Q4_1W>, VecDotQuantMulti<Q4_1W>);
  set(GgmlType::kQ5_0, VecDotQuantOne<Q5_0W>, VecDotQuantMulti<Q5_0W>);
  set(GgmlType::kQ5_1, VecDotQuantOne<Q5_1W>, VecDotQuantMulti<Q5_1W>);
  set(GgmlType::kQ8_0, VecDotTileOne<Q8_0Tile>, VecDotTileMulti<Q8_0Tile>);
  table[static_cast<int>(GgmlType::kQ8_0)].vec_dot_tile = InTilesOfFour<VecDotTile<Q8_0Tile>>;
  set(GgmlType::kIQ4_NL, VecDotTileOne<IQ4_NLTile>, VecDotTileMulti<IQ4_NLTile>);
  table[static_cast<int>(GgmlType::kIQ4_NL)].vec_dot_tile = InTilesOfFour<VecDotTile<IQ4_NLTile>>;
  set(GgmlType::kMXFP4, VecDotTileOne<MXFP4Tile>, VecDotTileMulti<MXFP4Tile>);
  table[static_cast<int>(GgmlType::kMXFP4)].vec_dot_tile = InTilesOfFour<VecDotTile<MXFP4Tile>>;
  table[static_cast<int>(GgmlType::kQ8_0)].quantize = QuantizeQ8_0;
  table[static_cast<int>(GgmlType::kQ8_1)].quantize = QuantizeQ8_1;
  // F16 activations keep the AVX2 F16C quantizer inherited from the AVX2 table.
}

}  // namespace lamina::quant_internal
