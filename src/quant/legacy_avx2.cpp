// AVX2 + FMA + F16C kernels for F32, F16, BF16, the legacy quants and the 32-element table
// types (IQ4_NL, MXFP4): dot products, the several-activation dot products used for prompt
// processing, and the activation quantizers (byte-identical to the scalar ones in legacy.cpp).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "quant/kernel_registry.h"

namespace lamina::quant_internal {
namespace {

inline float HsumPs(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline int HsumI32(__m256i v) {
  __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  r = _mm_add_epi32(r, _mm_unpackhi_epi64(r, r));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(r);
}

inline float HalfToF32(fp16_t h) { return _cvtsh_ss(h); }

// A weight block's f32 scale: its fp16 d, or MXFP4's halved E8M0 exponent (as the scalar twin).
template <class Block>
inline float BlockScale(const Block& b) {
  return HalfToF32(b.d);
}
inline float BlockScale(const BlockMXFP4& b) { return E8M0ToF32Half(b.e); }

// ---------------------------------------------------------------------------------------------
// Float types. Loads widen 8 elements to f32; products are exact for F16 / BF16, so only the
// summation order differs from the scalar twin.

struct F32Src {
  using T = float;
  static __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
  static float One(const float* p) { return *p; }
};
struct F16Src {
  using T = fp16_t;
  static __m256 Load8(const fp16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static float One(const fp16_t* p) { return HalfToF32(*p); }
};
struct BF16Src {
  using T = bf16_t;
  static __m256 Load8(const bf16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static float One(const bf16_t* p) { return Bf16ToF32(*p); }
};

// SW: the weights' element type, SA: the activations' (F16 weights take f32 activations).
// F16 weights' activations: rounded to f16 and widened back (the scalar RoundF16AsF32).
void RoundF16AsF32(const float* x, void* vy, int64_t k) {
  float* y = static_cast<float*>(vy);
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
  }
  for (; i < k; ++i) y[i] = _cvtsh_ss(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}

// The elements past the last whole 8-element step, summed in order (shared by the multi and
// the tile kernels, so both round the tail alike).
template <class SW, class SA>
inline float FloatTail(const typename SW::T* w, const typename SA::T* a, int64_t i, int64_t k) {
  float tail = 0.0f;
  for (int64_t t = i; t < k; ++t) tail += SW::One(w + t) * SA::One(a + t);
  return tail;
}

template <class SW, class SA, int N>
void VecDotFloatMultiN(int64_t k, const void* vw, const char* act, size_t stride, float* out) {
  using TW = typename SW::T;
  using TA = typename SA::T;
  const TW* w = static_cast<const TW*>(vw);
  const TA* a[N];
  __m256 acc[N];
  for (int j = 0; j < N; ++j) {
    a[j] = reinterpret_cast<const TA*>(act + j * stride);
    acc[j] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256 wv = SW::Load8(w + i);
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) acc[j] = _mm256_fmadd_ps(wv, SA::Load8(a[j] + i), acc[j]);
  }
  for (int j = 0; j < N; ++j) out[j] = HsumPs(acc[j]) + FloatTail<SW, SA>(w, a[j], i, k);
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

// Float tiles: R weight rows x N activation rows (N <= 3) per register block. Each pair keeps
// the one 8-lane accumulator, FMA sequence, tail and reduction of VecDotFloatMultiN, so every
// output is that kernel's bits. The gain is for few tokens (decode, short verify windows): one
// accumulator per pair is a chain of dependent FMAs, and R rows make R x N independent chains,
// while each widened weight vector still serves every token of the block. From 4 tokens on,
// the multi kernel already has enough chains and widens each weight vector once for all.
template <class SW, class SA, int R, int N>
void VecDotFloatTileBlock(int64_t k, const typename SW::T* const* w, const typename SA::T* const* a,
                          float* out, size_t out_stride) {
  __m256 acc[R][N];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < N; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 av[N];
#pragma GCC unroll 4
    for (int j = 0; j < N; ++j) av[j] = SA::Load8(a[j] + i);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 wv = SW::Load8(w[r] + i);
#pragma GCC unroll 4
      for (int j = 0; j < N; ++j) acc[r][j] = _mm256_fmadd_ps(wv, av[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < N; ++j) {
      out[j * out_stride + r] = HsumPs(acc[r][j]) + FloatTail<SW, SA>(w[r], a[j], i, k);
    }
  }
}

template <class SW, class SA, int R>
void VecDotFloatTileRows(int64_t k, const typename SW::T* const* w, const char* act,
                         size_t act_row_bytes, int n_act, float* out, size_t out_stride) {
  using TA = typename SA::T;
  const TA* a[3];
  for (int j = 0; j < n_act && j < 3; ++j) {
    a[j] = reinterpret_cast<const TA*>(act + j * act_row_bytes);
  }
  switch (n_act) {
    case 1:
      return VecDotFloatTileBlock<SW, SA, R, 1>(k, w, a, out, out_stride);
    case 2:
      return VecDotFloatTileBlock<SW, SA, R, 2>(k, w, a, out, out_stride);
    default:
      return VecDotFloatTileBlock<SW, SA, R, 3>(k, w, a, out, out_stride);
  }
}

template <class SW, class SA>
void VecDotFloatTile(int64_t k, const void* vw, size_t w_row_bytes, int n_rows, const void* act,
                     size_t act_row_bytes, int n_act, float* out, size_t out_stride) {
  using T = typename SW::T;
  const char* wc = static_cast<const char*>(vw);
  if (n_act > 3) {  // groups of up to three tokens (4 + 4 for four; 3 + 3 + 2 for eight)
    for (int j0 = 0; j0 < n_act;) {
      const int left = n_act - j0;
      const int nj = left == 4 ? 2 : std::min(3, left);
      VecDotFloatTile<SW, SA>(k, vw, w_row_bytes, n_rows,
                              static_cast<const char*>(act) + j0 * act_row_bytes, act_row_bytes, nj,
                              out + j0 * out_stride, out_stride);
      j0 += nj;
    }
    return;
  }
  // One token: up to 8 rows (8 chains, 10 registers); two or three tokens: 4 rows at a time
  // (up to 12 accumulators, 3 activation vectors and the widened weight vector).
  const int rows_per_block = n_act == 1 ? 8 : 4;
  const char* a = static_cast<const char*>(act);
  for (int r0 = 0; r0 < n_rows; r0 += rows_per_block) {
    const int nr = std::min(rows_per_block, n_rows - r0);
    const T* w[8];
    for (int r = 0; r < nr; ++r) w[r] = reinterpret_cast<const T*>(wc + (r0 + r) * w_row_bytes);
    float* o = out + r0;
    switch (nr) {
      case 1:
        VecDotFloatTileRows<SW, SA, 1>(k, w, a, act_row_bytes, n_act, o, out_stride);
        break;
      case 2:
        VecDotFloatTileRows<SW, SA, 2>(k, w, a, act_row_bytes, n_act, o, out_stride);
        break;
      case 3:
        VecDotFloatTileRows<SW, SA, 3>(k, w, a, act_row_bytes, n_act, o, out_stride);
        break;
      case 4:
        VecDotFloatTileRows<SW, SA, 4>(k, w, a, act_row_bytes, n_act, o, out_stride);
        break;
      case 5:  // 5..8 rows: one token only
        VecDotFloatTileRows<SW, SA, 5>(k, w, a, act_row_bytes, n_act, o, out_stride);
        break;
      case 6:
        VecDotFloatTileRows<SW, SA, 6>(k, w, a, act_row_bytes, n_act, o, out_stride);
        break;
      case 7:
        VecDotFloatTileRows<SW, SA, 7>(k, w, a, act_row_bytes, n_act, o, out_stride);
        break;
      default:
        VecDotFloatTileRows<SW, SA, 8>(k, w, a, act_row_bytes, n_act, o, out_stride);
        break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Legacy quants. Each weight block unpacks to 32 bytes in element order; signed types (Q4_0,
// Q5_0, Q8_0, IQ4_NL, MXFP4) give codes in [-128, 127] and multiply via abs/sign, unsigned ones
// (Q4_1, Q5_1) give [0, 31] and feed maddubs directly. Activation codes must be in [-127, 127] (as
// every lamina / GGML quantizer writes them): sign_epi8 cannot negate -128.

// 32 nibbles to bytes: low nibbles are elements 0..15, high nibbles elements 16..31.
inline __m256i UnpackNibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

// Byte p = 0x10 where bit p of the 32-bit qh is set (the fifth bit of element p).
inline __m256i HighBits(const uint8_t* qh) {
  uint32_t x;
  std::memcpy(&x, qh, sizeof(x));
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101,
                                         0x0000000000000000);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuf);
  const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, sel), sel);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

struct Q4_0W {
  using Block = BlockQ4_0;
  using Act = BlockQ8_0;
  static constexpr bool kSigned = true;
  static __m256i Codes(const Block& b) {
    return _mm256_sub_epi8(UnpackNibbles(b.qs), _mm256_set1_epi8(8));
  }
};
struct Q5_0W {
  using Block = BlockQ5_0;
  using Act = BlockQ8_0;
  static constexpr bool kSigned = true;
  static __m256i Codes(const Block& b) {
    return _mm256_sub_epi8(_mm256_or_si256(UnpackNibbles(b.qs), HighBits(b.qh)),
                           _mm256_set1_epi8(16));
  }
};
struct Q8_0W {
  using Block = BlockQ8_0;
  using Act = BlockQ8_0;
  static constexpr bool kSigned = true;
  static __m256i Codes(const Block& b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
  }
};
// Table types: the nibbles index 16 int8 levels, looked up by one in-lane byte shuffle (the
// table sits in both 128-bit lanes). The levels are in [-127, 113]: sign_epi8 can take them.
inline __m256i LookUp16(const int8_t* levels, __m256i nibbles) {
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(levels)));
  return _mm256_shuffle_epi8(table, nibbles);
}
struct IQ4_NLW {
  using Block = BlockIQ4_NL;
  using Act = BlockQ8_0;
  static constexpr bool kSigned = true;
  static __m256i Codes(const Block& b) { return LookUp16(kIq4NlLevels, UnpackNibbles(b.qs)); }
};
struct MXFP4W {
  using Block = BlockMXFP4;
  using Act = BlockQ8_0;
  static constexpr bool kSigned = true;
  static __m256i Codes(const Block& b) { return LookUp16(kMxfp4Levels, UnpackNibbles(b.qs)); }
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

// A weight block prepared once and dotted with any number of activation blocks.
template <class W>
struct Prepared {
  __m256i mul;  // unsigned operand of maddubs: |codes| or the codes themselves
  __m256i sgn;  // codes, whose signs are moved onto the activation (signed types only)
  float d;
  float m = 0.0f;

  explicit Prepared(const typename W::Block& b) {
    const __m256i c = W::Codes(b);
    if constexpr (W::kSigned) {
      mul = _mm256_sign_epi8(c, c);
      sgn = c;
    } else {
      mul = c;
      sgn = c;
      m = HalfToF32(b.m);
    }
    d = BlockScale(b);
  }

  // Eight int32 lanes summing to dot(codes, activation codes).
  __m256i Dot(const int8_t* qs) const {
    __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
    if constexpr (W::kSigned) y = _mm256_sign_epi8(y, sgn);
    const __m256i p16 = _mm256_maddubs_epi16(mul, y);
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
  }
};

#include "quant/legacy_quant_dot.inc"

// Quant tiles for prompt batches (Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 weights; Q8_0 activations): R
// weight rows x N activation rows per register block. Each pair keeps VecDotQuantMultiN's one
// accumulator, its per-block int32 lanes (maddubs(|w|, sign(y, w)) then madd: exact, so any order
// of the integer work gives them), its scale d_w * d_a and its FMA order, so every output is that
// kernel's bits. A weight block is unpacked once per tile, the activation scales are widened
// once per call, and the R x N scale products take one 4-lane multiply per row and block,
// read back by broadcast loads (no shuffle per pair). Only matmuls of many tokens use it
// (tile_min_tokens): with a token or two per row the rows stream from memory, and interleaving
// several of them cost more than the saved loads.
constexpr int kTileRows = 2;  // weight rows per register block (3 x 4 and 4 x 3 measured no faster)
constexpr int kTileActs = 4;  // activation rows per register block
constexpr int kQuantTileMinTokens = 16;   // see above; measured in docs/PERFORMANCE.md
constexpr int64_t kTileMaxBlocks = 2048;  // longer rows (k > 65536) take the row kernel

template <class W, int R, int N>
void QuantTileBlock(int64_t nb, const typename W::Block* const* w, const BlockQ8_0* const* a,
                    const float* da, float* out, size_t out_stride) {
  static_assert(W::kSigned, "unsigned types carry a second term");
  static_assert(N <= 4);
  __m256 acc[R][N];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < N; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  alignas(16) float scale[R][4];  // d_w[r] * d_a[j] of block i
  for (int64_t i = 0; i < nb; ++i) {
    const __m128 dav = _mm_load_ps(da + i * 4);  // [4] activation scales
    __m256i wm[R], ws[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      ws[r] = W::Codes(w[r][i]);
      wm[r] = _mm256_sign_epi8(ws[r], ws[r]);
      _mm_store_ps(scale[r], _mm_mul_ps(_mm_set1_ps(BlockScale(w[r][i])), dav));
    }
#pragma GCC unroll 4
    for (int j = 0; j < N; ++j) {
      const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[j][i].qs));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256i p16 = _mm256_maddubs_epi16(wm[r], _mm256_sign_epi8(y, ws[r]));
        const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        acc[r][j] = _mm256_fmadd_ps(s, _mm256_broadcast_ss(&scale[r][j]), acc[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < N; ++j) out[j * out_stride + r] = HsumPs(acc[r][j]) + 0.0f;
  }
}

template <class W, int N>
void QuantTileRows(int64_t nb, const typename W::Block* const* w, int nr, const BlockQ8_0* const* a,
                   const float* da, float* out, size_t out_stride) {
  static_assert(kTileRows == 2);
  if (nr == 2) return QuantTileBlock<W, 2, N>(nb, w, a, da, out, out_stride);
  QuantTileBlock<W, 1, N>(nb, w, a, da, out, out_stride);
}

template <class W>
void VecDotQuantTile(int64_t k, const void* vw, size_t w_row_bytes, int n_rows, const void* act,
                     size_t act_row_bytes, int n_act, float* out, size_t out_stride) {
  const int64_t nb = k / kQK;
  const char* wc = static_cast<const char*>(vw);
  const char* ac = static_cast<const char*>(act);
  if (nb > kTileMaxBlocks) {
    for (int r = 0; r < n_rows; ++r) {
      float row_out[kMaxMultiDot];
      VecDotQuantMulti<W>(k, wc + r * w_row_bytes, act, act_row_bytes, n_act, row_out);
      for (int j = 0; j < n_act; ++j) out[j * out_stride + r] = row_out[j];
    }
    return;
  }
  alignas(16) float da[kTileMaxBlocks * 4];  // [nb][4] activation scales, zero-padded
  for (int j0 = 0; j0 < n_act; j0 += kTileActs) {
    const int nj = std::min(kTileActs, n_act - j0);
    const BlockQ8_0* a[4];
    for (int j = 0; j < nj; ++j) {
      a[j] = reinterpret_cast<const BlockQ8_0*>(ac + (j0 + j) * act_row_bytes);
    }
    for (int64_t i = 0; i < nb; ++i) {
      for (int j = 0; j < 4; ++j) da[i * 4 + j] = j < nj ? HalfToF32(a[j][i].d) : 0.0f;
    }
    for (int r0 = 0; r0 < n_rows; r0 += kTileRows) {
      const int nr = std::min(kTileRows, n_rows - r0);
      const typename W::Block* w[kTileRows];
      for (int r = 0; r < nr; ++r) {
        w[r] = reinterpret_cast<const typename W::Block*>(wc + (r0 + r) * w_row_bytes);
      }
      float* o = out + j0 * out_stride + r0;
      switch (nj) {
        case 1:
          QuantTileRows<W, 1>(nb, w, nr, a, da, o, out_stride);
          break;
        case 2:
          QuantTileRows<W, 2>(nb, w, nr, a, da, o, out_stride);
          break;
        case 3:
          QuantTileRows<W, 3>(nb, w, nr, a, da, o, out_stride);
          break;
        default:
          QuantTileRows<W, 4>(nb, w, nr, a, da, o, out_stride);
          break;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Activation quantizers: the same arithmetic as the scalar ones (amax, d = amax / 127,
// id = 127 / amax, x * id rounded to nearest even by cvtps2dq).

// Quantizes 32 floats into qs; returns d and the sum of the codes.
inline float QuantizeBlock8(const float* x, int8_t* qs, int* code_sum) {
  __m256 v0 = _mm256_loadu_ps(x);
  __m256 v1 = _mm256_loadu_ps(x + 8);
  __m256 v2 = _mm256_loadu_ps(x + 16);
  __m256 v3 = _mm256_loadu_ps(x + 24);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1));
  m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const float d = amax / 127.f;
  const float id = amax != 0.0f ? 127.f / amax : 0.0f;
  const __m256 mul = _mm256_set1_ps(id);
  const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, mul));
  const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, mul));
  const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, mul));
  const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, mul));
  if (code_sum != nullptr) {
    *code_sum = HsumI32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
  }
  // The in-lane packs interleave 4-element groups; the permute restores element order.
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  const __m256i q = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), q);
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

void QuantizeF16(const float* x, void* vy, int64_t k) {
  fp16_t* y = static_cast<fp16_t*>(vy);
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), h);
  }
  for (; i < k; ++i) y[i] = F32ToFp16(x[i]);
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

void RegisterAvx2Legacy(KernelTable& table) {
  auto set = [&](GgmlType t, VecDotFn dot, VecDotMultiFn multi) {
    table[static_cast<int>(t)].vec_dot = dot;
    table[static_cast<int>(t)].vec_dot_multi = multi;
  };
  set(GgmlType::kF32, VecDotFloatOne<F32Src, F32Src>, VecDotFloatMulti<F32Src, F32Src>);
  set(GgmlType::kF16, VecDotFloatOne<F16Src, F32Src>, VecDotFloatMulti<F16Src, F32Src>);
  set(GgmlType::kBF16, VecDotFloatOne<BF16Src, BF16Src>, VecDotFloatMulti<BF16Src, BF16Src>);
  set(GgmlType::kQ4_0, VecDotQuantOne<Q4_0W>, VecDotQuantMulti<Q4_0W>);
  set(GgmlType::kQ4_1, VecDotQuantOne<Q4_1W>, VecDotQuantMulti<Q4_1W>);
  set(GgmlType::kQ5_0, VecDotQuantOne<Q5_0W>, VecDotQuantMulti<Q5_0W>);
  set(GgmlType::kQ5_1, VecDotQuantOne<Q5_1W>, VecDotQuantMulti<Q5_1W>);
  set(GgmlType::kQ8_0, VecDotQuantOne<Q8_0W>, VecDotQuantMulti<Q8_0W>);
  set(GgmlType::kIQ4_NL, VecDotQuantOne<IQ4_NLW>, VecDotQuantMulti<IQ4_NLW>);
  set(GgmlType::kMXFP4, VecDotQuantOne<MXFP4W>, VecDotQuantMulti<MXFP4W>);
  table[static_cast<int>(GgmlType::kF32)].vec_dot_tile = VecDotFloatTile<F32Src, F32Src>;
  table[static_cast<int>(GgmlType::kF16)].vec_dot_tile = VecDotFloatTile<F16Src, F32Src>;
  table[static_cast<int>(GgmlType::kBF16)].vec_dot_tile = VecDotFloatTile<BF16Src, BF16Src>;
  for (GgmlType t :
       {GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ8_0, GgmlType::kIQ4_NL, GgmlType::kMXFP4}) {
    table[static_cast<int>(t)].tile_min_tokens = kQuantTileMinTokens;
  }
  table[static_cast<int>(GgmlType::kQ4_0)].vec_dot_tile = VecDotQuantTile<Q4_0W>;
  table[static_cast<int>(GgmlType::kQ5_0)].vec_dot_tile = VecDotQuantTile<Q5_0W>;
  table[static_cast<int>(GgmlType::kQ8_0)].vec_dot_tile = VecDotQuantTile<Q8_0W>;
  table[static_cast<int>(GgmlType::kIQ4_NL)].vec_dot_tile = VecDotQuantTile<IQ4_NLW>;
  table[static_cast<int>(GgmlType::kMXFP4)].vec_dot_tile = VecDotQuantTile<MXFP4W>;
  table[static_cast<int>(GgmlType::kQ8_0)].quantize = QuantizeQ8_0;
  table[static_cast<int>(GgmlType::kQ8_1)].quantize = QuantizeQ8_1;
  table[static_cast<int>(GgmlType::kF16)].quantize = QuantizeF16;
  table[static_cast<int>(GgmlType::kF16)].quantize_act = RoundF16AsF32;
}

}  // namespace lamina::quant_internal
