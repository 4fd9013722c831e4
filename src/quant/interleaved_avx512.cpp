// AVX-512 VNNI kernels for interleaved Q8_0, Q4_0, IQ4_NL and MXFP4 weights (BlockQ8_0x16, ...):
// one 512-bit lane per row of the 16-row group. Per 4-element chunk one 64-byte load of the
// unsigned codes (4-bit types: one load, masked and shifted, gives two chunks; up to 4 tokens it
// is loaded once for both) serves every token, and each token adds its 4 codes, broadcast to all
// lanes, by one vpdpbusd; the int32 lanes start at -C
// * sum(q) (C = 128, 8), so after 8 chunks each holds its row's exact block dot. Then per block and
// token: convert, (d_w * d_a), multiply and add, lane by lane as the scalar twin (separate multiply
// and add, no FMA), so every output is the scalar vec_dot's bits. Q5_0 (BlockQ5_0x16, below) keeps
// the SIMD row kernel's eight-lane order instead, a pair of rows per register. GCC 12's AVX-512
// headers self-initialise their "undefined" vectors, which -Wall reports at every inlined intrinsic
// (GCC PR105593); the warnings say nothing about this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>
#include <initializer_list>

#include "quant/kernel_registry.h"

namespace lamina::quant_internal {
namespace {

constexpr int kRows = kQ8_0x16Rows;

#include "quant/interleaved_avx512_common.inc"

// The 16 rows' fp16 scales as f32.
inline __m512 Fp16Scales(const fp16_t* d) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d)));
}

// The unsigned codes of chunk c of a 4-bit table type (nibbles as BlockQ4_0x16's): each nibble
// looks up its level + 128.
inline __m512i TableCodes(const int8_t* levels, const uint8_t* qs, int c) {
  const __m512i v = _mm512_loadu_si512(qs + 64 * (c % 4));
  const __m512i nib = _mm512_and_si512(c < 4 ? v : _mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
  return _mm512_shuffle_epi8(LevelTable(levels), nib);
}
// Chunks cp and cp + 4 of a 4-bit table type (the low and high nibbles of one 64-byte load).
inline void TableCodePair(const int8_t* levels, const uint8_t* qs, int cp, __m512i* lo,
                          __m512i* hi) {
  const __m512i table = LevelTable(levels);
  const __m512i v = LoadOnce(qs + 64 * cp), nib = _mm512_set1_epi8(0x0F);
  *lo = _mm512_shuffle_epi8(table, _mm512_and_si512(v, nib));
  *hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), nib));
}

// The unsigned codes of chunk c (elements 4c..4c+3 of every row) and the offset they carry.
struct Q8_0x16 {
  using Block = BlockQ8_0x16;
  static constexpr int kOffset = 128;
  static constexpr bool kPrefetchOneToken = false;  // BlockStep
  static constexpr bool kNibbles = false;           // BlockStep: CodePair
  static __m512i Codes(const Block& w, int c) { return _mm512_loadu_si512(w.qs + 64 * c); }
  static __m512 Scales(const Block& w) { return Fp16Scales(w.d); }
};
struct Q4_0x16 {
  using Block = BlockQ4_0x16;
  static constexpr int kOffset = 8;
  static constexpr bool kPrefetchOneToken = true;
  static __m512i Codes(const Block& w, int c) {
    const __m512i v = _mm512_loadu_si512(w.qs + 64 * (c % 4));
    return _mm512_and_si512(c < 4 ? v : _mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
  }
  // Chunks cp and cp + 4 from one load; the high nibbles in place (16 * code: kHighTimes16).
  static constexpr bool kNibbles = true;
  static constexpr bool kHighTimes16 = true;
  static void CodePair(const Block& w, int cp, __m512i* lo, __m512i* hi) {
    const __m512i v = LoadOnce(w.qs + 64 * cp);
    *lo = _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
    *hi = _mm512_and_si512(v, _mm512_set1_epi8(static_cast<char>(0xF0)));
  }
  static __m512 Scales(const Block& w) { return Fp16Scales(w.d); }
};

struct IQ4_NLx16 {
  using Block = BlockIQ4_NLx16;
  static constexpr int kOffset = 128;
  static constexpr bool kPrefetchOneToken = true;
  static __m512i Codes(const Block& w, int c) { return TableCodes(kIq4NlLevels, w.qs, c); }
  static constexpr bool kNibbles = true;
  static constexpr bool kHighTimes16 = false;
  static void CodePair(const Block& w, int cp, __m512i* lo, __m512i* hi) {
    TableCodePair(kIq4NlLevels, w.qs, cp, lo, hi);
  }
  static __m512 Scales(const Block& w) { return Fp16Scales(w.d); }
};

// MXFP4: the E2M1 levels the same way; the scale is E8M0ToF32Half of the row's exponent e, built
// as its f32 bits: (e - 1) << 23, or for e < 2 the subnormals 0x00200000 << e.
struct MXFP4x16 {
  using Block = BlockMXFP4x16;
  static constexpr int kOffset = 128;
  static constexpr bool kPrefetchOneToken = true;
  static __m512i Codes(const Block& w, int c) { return TableCodes(kMxfp4Levels, w.qs, c); }
  static constexpr bool kNibbles = true;
  static constexpr bool kHighTimes16 = false;
  static void CodePair(const Block& w, int cp, __m512i* lo, __m512i* hi) {
    TableCodePair(kMxfp4Levels, w.qs, cp, lo, hi);
  }
  static __m512 Scales(const Block& w) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.e)));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    const __mmask16 tiny = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(tiny, normal, sub));
  }
};

// One block of the group against N tokens: acc[t] += float(dot) * (d_w * d_a[t]).
// Every call prefetches the weight bytes this far ahead, one line per chunk (a block's 8 chunks and
// one more cover its bytes). With several tokens a block's dots take longer than its bytes take to
// arrive, and the hardware prefetcher alone let the weight reads and the dots take turns. One
// token: Q4_0 gains a few percent from them, Q8_0 (544-byte blocks, 9 lines a call) loses ~8%
// (AMD EPYC Zen 5, weights in huge pages: depth-0 decode 242-258 tok/s with them, 266-275
// without, docs/PERFORMANCE.md), so a layout says whether one token prefetches
// (kPrefetchOneToken). Prefetches change no result (bytes past the matrix are harmless).
constexpr int kPrefetchBlocks = 8;
// Up to this many tokens the 4-bit layouts take two chunks per load (BlockStep).
constexpr int kPairMaxTokens = 4;

template <class L, int N>
inline void BlockStep(const typename L::Block& w, const BlockQ8_0Act* const* a, int64_t i,
                      __m512* acc) {
  if constexpr (N > 1 || L::kPrefetchOneToken) {
    const char* ahead = reinterpret_cast<const char*>(&w) + kPrefetchBlocks * sizeof(w);
#pragma GCC unroll 9
    for (size_t b = 0; b < sizeof(w); b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
  }
  __m512i sum[N];
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) sum[t] = _mm512_set1_epi32(-L::kOffset * a[t][i].sum);
  if constexpr (L::kNibbles && N <= kPairMaxTokens) {
    // 4-bit codes, few tokens: chunks cp and cp + 4 from one load (the loads bound these
    // kernels), into two chains per token; Q4_0's high nibbles dotted as 16 * code and the chain
    // divided by 16 at the end (exact). Integer addition keeps every sum exact.
    __m512i high[N];
#pragma GCC unroll 8
    for (int t = 0; t < N; ++t) high[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int cp = 0; cp < 4; ++cp) {
      __m512i lo, hi;
      L::CodePair(w, cp, &lo, &hi);
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        sum[t] = DotBroadcast(sum[t], lo, a[t][i].qs + 4 * cp);
        high[t] = DotBroadcast(high[t], hi, a[t][i].qs + 4 * (cp + 4));
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < N; ++t) {
      sum[t] = _mm512_add_epi32(sum[t], L::kHighTimes16 ? _mm512_srai_epi32(high[t], 4) : high[t]);
    }
  } else if constexpr (N == 1) {
    // Decode: two chains (even and odd chunks) halve the vpdpbusd latency chain; integer
    // addition keeps the sum exact.
    __m512i odd = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 8; c += 2) {
      sum[0] = _mm512_dpbusd_epi32(sum[0], L::Codes(w, c), Broadcast4(a[0][i].qs + 4 * c));
      odd = _mm512_dpbusd_epi32(odd, L::Codes(w, c + 1), Broadcast4(a[0][i].qs + 4 * (c + 1)));
    }
    sum[0] = _mm512_add_epi32(sum[0], odd);
  } else {
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m512i u = L::Codes(w, c);
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        sum[t] = _mm512_dpbusd_epi32(sum[t], u, Broadcast4(a[t][i].qs + 4 * c));
      }
    }
  }
  const __m512 dw = L::Scales(w);
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) {
    const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(a[t][i].d));
    acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_cvtepi32_ps(sum[t]), scale));
  }
}

template <class L, int N>
void GemmN(int64_t nb, const typename L::Block* w, const char* act, size_t act_row_bytes,
           float* out, size_t out_stride) {
  const BlockQ8_0Act* a[N];
  __m512 acc[N];
  for (int t = 0; t < N; ++t) {
    a[t] = reinterpret_cast<const BlockQ8_0Act*>(act + t * act_row_bytes);
    acc[t] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < nb; ++i) BlockStep<L, N>(w[i], a, i, acc);
  for (int t = 0; t < N; ++t) _mm512_storeu_ps(out + t * out_stride, acc[t]);
}

template <class L>
void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  const auto* w = static_cast<const typename L::Block*>(group);
  const char* a = static_cast<const char*>(act);
  const int64_t nb = k / kQK;
  switch (n_act) {
    case 1:
      return GemmN<L, 1>(nb, w, a, act_row_bytes, out, out_stride);
    case 2:
      return GemmN<L, 2>(nb, w, a, act_row_bytes, out, out_stride);
    case 3:
      return GemmN<L, 3>(nb, w, a, act_row_bytes, out, out_stride);
    case 4:
      return GemmN<L, 4>(nb, w, a, act_row_bytes, out, out_stride);
    case 5:
      return GemmN<L, 5>(nb, w, a, act_row_bytes, out, out_stride);
    case 6:
      return GemmN<L, 6>(nb, w, a, act_row_bytes, out, out_stride);
    case 7:
      return GemmN<L, 7>(nb, w, a, act_row_bytes, out, out_stride);
    default:
      return GemmN<L, 8>(nb, w, a, act_row_bytes, out, out_stride);
  }
}

// ---------------------------------------------------------------------------------------------
// Q5_0 (BlockQ5_0x16) in the SIMD vec_dot's order (GemmQ5_0x16Lanes, interleaved.cpp): per row
// eight float lanes, lane c summing fma(float(dot of elements 4c..4c+3), d_w * d_a) over the
// blocks. One 512-bit register holds a pair of rows, eight int32 / f32 lanes each, so per block
// and token a pair pays one vpdpbusd, one convert, one multiply and one FMA for 16 such lanes
// (the row kernel pays them per row). The codes go in signed, q = u - 16 (the nibbles, less 16
// where the 64-bit fifth-bit mask is clear), against the token's codes made unsigned (a + 128,
// one broadcast of its 32 bytes to both halves); the int32 lanes start at -128 * sum(q) over their
// 4 elements, computed once per pair and block, so each holds its exact chunk dot.

struct Q5Pair {
  __m512i q;     // row 2p's signed codes in bytes 0-31, row 2p + 1's in 32-63, element order
  __m512i init;  // -128 * sum(q) per 4-element lane
  __m512 dw;     // row 2p's d in lanes 0-7, row 2p + 1's in 8-15
};

inline Q5Pair PreparePair(const BlockQ5_0x16& w, int p, __m512 dw_all) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs + 32 * p));
  // 128-bit lanes [row 0 low, row 1 low, row 0 high, row 1 high] -> [r0 low, r0 high, r1 ...].
  const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(b), _mm256_srli_epi16(b, 4), 1);
  const __m512i nib =
      _mm512_and_si512(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), _mm512_set1_epi8(0x0F));
  uint64_t hb;
  std::memcpy(&hb, w.qh + 8 * p, sizeof(hb));
  Q5Pair r;
  r.q = _mm512_mask_sub_epi8(nib, _cvtu64_mask64(~hb), nib, _mm512_set1_epi8(16));
  r.init = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)),
                               _mm512_sub_epi8(_mm512_setzero_si512(), r.q));
  const __m512i idx = _mm512_add_epi32(
      _mm512_set1_epi32(2 * p), _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
  r.dw = _mm512_permutexvar_ps(idx, dw_all);
  return r;
}

// HsumPs's tree over lanes 8s..8s + 7 of v (legacy_avx2.cpp), plus the row kernel's 0.0f.
inline float HsumLanes8(const float* l) {
  const float v0 = l[0] + l[4], v1 = l[1] + l[5], v2 = l[2] + l[6], v3 = l[3] + l[7];
  return ((v0 + v2) + (v1 + v3)) + 0.0f;
}

// Pairs [p0, p0 + P) against N tokens.
template <int P, int N>
void Q5PairsN(int64_t nb, const BlockQ5_0x16* w, const BlockQ8_0Act* const* a, int p0, float* out,
              size_t out_stride) {
  __m512 acc[P][N];
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < N; ++t) acc[p][t] = _mm512_setzero_ps();
  }
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < nb; ++i) {
    const __m512 dw_all =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].d)));
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) {
      const Q5Pair wp = PreparePair(w[i], p0 + p, dw_all);
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        const __m512i au = _mm512_xor_si512(_mm512_broadcast_i64x4(_mm256_loadu_si256(
                                                reinterpret_cast<const __m256i*>(a[t][i].qs))),
                                            flip);
        const __m512i dot = _mm512_dpbusd_epi32(wp.init, au, wp.q);
        const __m512 scale = _mm512_mul_ps(wp.dw, _mm512_set1_ps(a[t][i].d));
        acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[p][t]);
      }
    }
  }
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < N; ++t) {
      alignas(64) float l[16];
      _mm512_store_ps(l, acc[p][t]);
      out[t * out_stride + 2 * (p0 + p)] = HsumLanes8(l);
      out[t * out_stride + 2 * (p0 + p) + 1] = HsumLanes8(l + 8);
    }
  }
}

template <int N>
void Q5GemmN(int64_t nb, const BlockQ5_0x16* w, const char* act, size_t act_row_bytes, float* out,
             size_t out_stride) {
  const BlockQ8_0Act* a[N];
  for (int t = 0; t < N; ++t) a[t] = reinterpret_cast<const BlockQ8_0Act*>(act + t * act_row_bytes);
  // P pairs x N tokens of accumulators stay within the 32 registers with the pairs' codes.
  constexpr int P = N <= 2 ? 4 : 2;
  for (int p0 = 0; p0 < kRows / 2; p0 += P) Q5PairsN<P, N>(nb, w, a, p0, out, out_stride);
}

void GemmQ5_0(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
              float* out, size_t out_stride) {
  const auto* w = static_cast<const BlockQ5_0x16*>(group);
  const char* a = static_cast<const char*>(act);
  const int64_t nb = k / kQK;
  switch (n_act) {
    case 1:
      return Q5GemmN<1>(nb, w, a, act_row_bytes, out, out_stride);
    case 2:
      return Q5GemmN<2>(nb, w, a, act_row_bytes, out, out_stride);
    case 3:
      return Q5GemmN<3>(nb, w, a, act_row_bytes, out, out_stride);
    case 4:
      return Q5GemmN<4>(nb, w, a, act_row_bytes, out, out_stride);
    case 5:
      return Q5GemmN<5>(nb, w, a, act_row_bytes, out, out_stride);
    case 6:
      return Q5GemmN<6>(nb, w, a, act_row_bytes, out, out_stride);
    case 7:
      return Q5GemmN<7>(nb, w, a, act_row_bytes, out, out_stride);
    default:
      return Q5GemmN<8>(nb, w, a, act_row_bytes, out, out_stride);
  }
}

}  // namespace

void RegisterAvx512Interleaved(KernelTable& table) {
  table[static_cast<int>(GgmlType::kQ8_0)].gemm_interleaved = Gemm<Q8_0x16>;
  table[static_cast<int>(GgmlType::kQ4_0)].gemm_interleaved = Gemm<Q4_0x16>;
  table[static_cast<int>(GgmlType::kIQ4_NL)].gemm_interleaved = Gemm<IQ4_NLx16>;
  table[static_cast<int>(GgmlType::kMXFP4)].gemm_interleaved = Gemm<MXFP4x16>;
  // The AVX2 kernels these replace took prompt-sized calls; these take kMaxMultiDot.
  for (GgmlType t :
       {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kIQ4_NL, GgmlType::kMXFP4, GgmlType::kQ5_0}) {
    table[static_cast<int>(t)].gemm_max_tokens = kMaxMultiDot;
  }
  // Q5_0: this kernel keeps the row kernel's order (GemmQ5_0x16Lanes).
  table[static_cast<int>(GgmlType::kQ5_0)].gemm_interleaved = GemmQ5_0;
}

}  // namespace lamina::quant_internal
