// AVX2 kernels for interleaved Q4_K, Q5_K, Q6_K and IQ4_XS weights (BlockQ4_Kx16, BlockQ5_Kx16,
// BlockQ6_Kx16, BlockIQ4_XSx16): the 16-row group as two halves of 8 rows, one 256-bit lane per
// row. Per 4-element chunk one 32-byte load gives a half's unsigned codes, and each token's 4
// codes, broadcast, go through maddubs (pairs, at most 2 * 63 * 128 in magnitude: no saturation);
// the pairs of several chunks of one group add up in int16 (8 chunks for Q4_K, 4 for Q5_K, 2 for
// Q6_K: at most 32256 in magnitude) before one madd with the rows' group scale in both words of
// the lane: exact int32 sc * dot (IQ4_XS: one madd per chunk). Q4_K's mins
// and Q6_K's -32 offset are madd of the rows' mins or scale pairs against the token's bsums pairs.
// IQ4_XS's nibbles become signed levels by one vpshufb; maddubs takes their magnitudes against the
// token's codes with the levels' signs (pairs at most 2 * 127 * 127). The float steps are the
// scalar twin's (no FMA), so every output is the scalar twin's bits. The first half's pass over
// each super-block prefetches the one kAhead further on (decode is memory-bound). The file also
// holds the AVX2 twin of the Q8_K activation quantizer these kernels read (QuantizeQ8K in
// kquants.cpp: the same codes, bsums and d, bit for bit).
#include <immintrin.h>

#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "quant/kernel_registry.h"

namespace lamina::quant_internal {
namespace {

constexpr int kRows = kQ8_0x16Rows;
constexpr int kTokens = 4;  // tokens per register block
// Super-blocks prefetched ahead of the one read (past a group's end: the next group's, which a
// caller running consecutive groups reads next; a prefetch past the array is harmless and
// changes no result).
constexpr int kAhead = 2;

#include "quant/interleaved_kquants_avx2_common.inc"

// acc += sc * dot(u, q) per lane, exact.
inline __m256i ScaledDot(__m256i acc, __m256i u, __m256i q, __m256i sc) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), sc));
}

template <int N>
inline void AddScaled(__m256 dw, const __m256i* sumi, const BlockQ8_K* const* a, int64_t i,
                      __m256* acc) {
#pragma GCC unroll 4
  for (int t = 0; t < N; ++t) {
    const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(a[t][i].d));
    acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_cvtepi32_ps(sumi[t]), scale));
  }
}

// Q5_K's fifth bits of 32-value group j, chunk c, rows of half h: bit j of each qh byte moved
// to bit 4.
inline __m256i HighBitsQ5K(const BlockQ5_Kx16& w, int h, int j, int c) {
  const __m256i v = Load(w.qh + 64 * c + 32 * h);
  const __m256i s = j <= 4 ? _mm256_slli_epi16(v, 4 - j) : _mm256_srli_epi16(v, j - 4);
  return _mm256_and_si256(s, _mm256_set1_epi8(0x10));
}

// Rows [8h, 8h + 8) of one Q4_K or Q5_K super-block against N tokens.
template <class Block, int N>
inline void HalfStepQ45K(const Block& w, int h, const BlockQ8_K* const* a, int64_t i, __m256* acc) {
  const __m256i byte = _mm256_set1_epi32(0xFF);
  __m256i sc[2], mn[2];  // lane r: row 8h + r's scales / mins, a byte per group
  ScalesMinsQ45K(w, h, sc, mn);
  const __m256i nib = _mm256_set1_epi8(0x0F);
  // Chunks whose maddubs pairs are summed in int16 before the scale's madd: each pair is at most
  // 2 * 15 * 128 = 3840 (Q4_K, 8 chunks: 30720) or 2 * 31 * 128 = 7936 (Q5_K, 4 chunks: 31744).
  constexpr int kRun = std::is_same_v<Block, BlockQ5_Kx16> ? 4 : 8;
  __m256i sumi[N];
  for (int t = 0; t < N; ++t) sumi[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    const __m256i s = DupWord(_mm256_and_si256(_mm256_srli_epi32(sc[j / 4], 8 * (j % 4)), byte));
#pragma GCC unroll 2
    for (int c0 = 0; c0 < 8; c0 += kRun) {
      __m256i s16[N];  // [token]: the run's pair sums, int16 per row lane
#pragma GCC unroll 8
      for (int c = c0; c < c0 + kRun; ++c) {
        const __m256i v = Load(w.qs + 64 * (8 * (j / 2) + c) + 32 * h);
        __m256i u = _mm256_and_si256(j % 2 == 0 ? v : _mm256_srli_epi16(v, 4), nib);
        if constexpr (std::is_same_v<Block, BlockQ5_Kx16>) {
          u = _mm256_or_si256(u, HighBitsQ5K(w, h, j, c));
        }
#pragma GCC unroll 4
        for (int t = 0; t < N; ++t) {
          const __m256i p = _mm256_maddubs_epi16(u, Broadcast4(a[t][i].qs + 32 * j + 4 * c));
          s16[t] = c == c0 ? p : _mm256_add_epi16(s16[t], p);
        }
      }
#pragma GCC unroll 4
      for (int t = 0; t < N; ++t) sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(s16[t], s));
    }
  }
  AddScaled<N>(LoadHalves(w.d + 8 * h), sumi, a, i, acc);
  const __m256 dmin = LoadHalves(w.dmin + 8 * h);
#pragma GCC unroll 4
  for (int t = 0; t < N; ++t) {
    __m256i summ = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m256i m = DupWord(_mm256_and_si256(_mm256_srli_epi32(mn[j / 4], 8 * (j % 4)), byte));
      summ = _mm256_add_epi32(summ, _mm256_madd_epi16(m, Broadcast4(a[t][i].bsums + 2 * j)));
    }
    const __m256 scale = _mm256_mul_ps(dmin, _mm256_set1_ps(a[t][i].d));
    acc[t] = _mm256_sub_ps(acc[t], _mm256_mul_ps(_mm256_cvtepi32_ps(summ), scale));
  }
}

// A half's unsigned 6-bit codes of quarter m (0..3) for ql chunk cl and qh chunk ch.
inline __m256i CodesQ6K(const BlockQ6_Kx16& w, int h, int m, int cl, int ch) {
  const __m256i l = Load(w.ql + 64 * cl + 32 * h), hb = Load(w.qh + 64 * ch + 32 * h);
  const __m256i lo = _mm256_and_si256(m < 2 ? l : _mm256_srli_epi16(l, 4), _mm256_set1_epi8(0x0F));
  const __m256i hs = m == 0   ? _mm256_slli_epi16(hb, 4)
                     : m == 1 ? _mm256_slli_epi16(hb, 2)
                     : m == 2 ? hb
                              : _mm256_srli_epi16(hb, 2);
  return _mm256_or_si256(lo, _mm256_and_si256(hs, _mm256_set1_epi8(0x30)));
}

// Rows [8h, 8h + 8) of one Q6_K super-block against N tokens (groups as in the AVX-512 file).
// Groups go by pairs g = 2p, 2p + 1 (p = 4n + m): one vector holds both groups' scales as int16
// words per row lane, which is the offset's madd operand against the bsums pair and, with each
// word duplicated by one vpshufb, the scale of each group's chunks.
template <int N>
inline void HalfStepQ6K(const BlockQ6_Kx16& w, int h, const BlockQ8_K* const* a, int64_t i,
                        __m256* acc) {
  const __m256i dup[2] = {_mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1,
                                           0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13),
                          _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15,
                                           2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15)};
  __m256i sumi[N], corr[N];
  for (int t = 0; t < N; ++t) sumi[t] = corr[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
  for (int n = 0; n < 2; ++n) {
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
      const int p = 4 * n + m;
      const __m128i s0 =
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.scales + 32 * p + 8 * h));
      const __m128i s1 =
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.scales + 32 * p + 16 + 8 * h));
      // [row lane]: (scale of group 2p, scale of group 2p + 1), int16
      const __m256i pair = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(s0, s1));
#pragma GCC unroll 4
      for (int t = 0; t < N; ++t) {
        corr[t] =
            _mm256_add_epi32(corr[t], _mm256_madd_epi16(pair, Broadcast4(a[t][i].bsums + 2 * p)));
      }
#pragma GCC unroll 2
      for (int hh = 0; hh < 2; ++hh) {
        const int g = 2 * p + hh;
        const __m256i s = _mm256_shuffle_epi8(pair, dup[hh]);
        // Two chunks' maddubs pairs (each at most 2 * 63 * 128 = 16128) summed in int16, then
        // the scale's madd.
#pragma GCC unroll 2
        for (int c2 = 0; c2 < 4; c2 += 2) {
          __m256i s16[N];  // [token]: two chunks' pair sums, int16 per row lane
#pragma GCC unroll 2
          for (int c4 = c2; c4 < c2 + 2; ++c4) {
            const __m256i u =
                CodesQ6K(w, h, m, 16 * n + 8 * (m % 2) + 4 * hh + c4, 8 * n + 4 * hh + c4);
#pragma GCC unroll 4
            for (int t = 0; t < N; ++t) {
              const __m256i q = Broadcast4(a[t][i].qs + 16 * g + 4 * c4);
              const __m256i d = _mm256_maddubs_epi16(u, q);
              s16[t] = c4 == c2 ? d : _mm256_add_epi16(s16[t], d);
            }
          }
#pragma GCC unroll 4
          for (int t = 0; t < N; ++t) {
            sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(s16[t], s));
          }
        }
      }
    }
  }
  // The offset: sumi -= 32 * sum_g sc_g * bsums[g].
#pragma GCC unroll 4
  for (int t = 0; t < N; ++t) sumi[t] = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(corr[t], 5));
  AddScaled<N>(LoadHalves(w.d + 8 * h), sumi, a, i, acc);
}

// Rows [8h, 8h + 8) of one IQ4_XS super-block against N tokens (chunks as in the AVX-512 file).
template <int N>
inline void HalfStepIQ4XS(const BlockIQ4_XSx16& w, int h, const BlockQ8_K* const* a, int64_t i,
                          __m256* acc) {
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlLevels)));
  const __m256i lo4 = Load(w.scales_l + 32 * h);
  const __m256i hi2 =
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales_h + 8 * h)));
  const __m256i nib = _mm256_set1_epi8(0x0F);
  __m256i sumi[N];
  for (int t = 0; t < N; ++t) sumi[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    const __m256i ls = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi32(lo4, 4 * j), _mm256_set1_epi32(0xF)),
        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hi2, 2 * j), _mm256_set1_epi32(3)),
                          4));
    const __m256i s = DupWord(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)));
#pragma GCC unroll 4
    for (int c4 = 0; c4 < 4; ++c4) {
      const __m256i v = Load(w.qs + 64 * (4 * j + c4) + 32 * h);
      const __m256i ll = _mm256_shuffle_epi8(table, _mm256_and_si256(v, nib));
      const __m256i lh = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
      const __m256i al = _mm256_abs_epi8(ll), ah = _mm256_abs_epi8(lh);
      const int e0 = 32 * j + 4 * c4;
#pragma GCC unroll 4
      for (int t = 0; t < N; ++t) {
        const __m256i ql = _mm256_sign_epi8(Broadcast4(a[t][i].qs + e0), ll);
        const __m256i qh = _mm256_sign_epi8(Broadcast4(a[t][i].qs + e0 + 16), lh);
        sumi[t] = ScaledDot(sumi[t], al, ql, s);
        sumi[t] = ScaledDot(sumi[t], ah, qh, s);
      }
    }
  }
  AddScaled<N>(LoadHalves(w.d + 8 * h), sumi, a, i, acc);
}

template <class Block, int N>
void GemmHalfN(int64_t nb, const Block* w, int h, const char* act, size_t act_row_bytes, float* out,
               size_t out_stride) {
  const BlockQ8_K* a[N];
  __m256 acc[N];
  for (int t = 0; t < N; ++t) {
    a[t] = reinterpret_cast<const BlockQ8_K*>(act + t * act_row_bytes);
    acc[t] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < nb; ++i) {
    if (h == 0) {  // the first pass over a super-block prefetches the one kAhead further on
      const char* next = reinterpret_cast<const char*>(w + i + kAhead);
      for (size_t b = 0; b < sizeof(Block); b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
    }
    if constexpr (std::is_same_v<Block, BlockQ6_Kx16>) {
      HalfStepQ6K<N>(w[i], h, a, i, acc);
    } else if constexpr (std::is_same_v<Block, BlockIQ4_XSx16>) {
      HalfStepIQ4XS<N>(w[i], h, a, i, acc);
    } else {
      HalfStepQ45K<Block, N>(w[i], h, a, i, acc);
    }
  }
  for (int t = 0; t < N; ++t) _mm256_storeu_ps(out + t * out_stride + 8 * h, acc[t]);
}

template <class Block>
void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  const auto* w = static_cast<const Block*>(group);
  const char* a = static_cast<const char*>(act);
  const int64_t nb = k / kQK_K;
  for (int t = 0; t < n_act; t += kTokens) {
    const int n = n_act - t < kTokens ? n_act - t : kTokens;
    const char* at = a + t * act_row_bytes;
    float* o = out + t * out_stride;
    for (int h = 0; h < kRows / 8; ++h) {
      switch (n) {
        case 1:
          GemmHalfN<Block, 1>(nb, w, h, at, act_row_bytes, o, out_stride);
          break;
        case 2:
          GemmHalfN<Block, 2>(nb, w, h, at, act_row_bytes, o, out_stride);
          break;
        case 3:
          GemmHalfN<Block, 3>(nb, w, h, at, act_row_bytes, o, out_stride);
          break;
        default:
          GemmHalfN<Block, 4>(nb, w, h, at, act_row_bytes, o, out_stride);
      }
    }
  }
}

// One block of 256 floats as BlockQ8_K, exactly as the scalar QuantizeQ8K (kquants.cpp): the
// first element of largest magnitude gives iscale = -127 / max, codes min(127,
// round-half-even(iscale * x)) by the 1.5 * 2^23 trick (multiply, then add), bsums per 16 (exact
// int32 sums), d = 1 / iscale.
void QuantizeBlockQ8K(const float* x, BlockQ8_K* y) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 v[32];  // [32 runs of 8 values]
  __m256 amax = _mm256_setzero_ps();
  for (int g = 0; g < 32; ++g) {
    v[g] = _mm256_loadu_ps(x + 8 * g);
    amax = _mm256_max_ps(_mm256_and_ps(v[g], abs_mask), amax);  // a NaN lane keeps amax
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float am = _mm_cvtss_f32(m);
  if (!(am > 0.0f)) {  // the scalar twin's amax stays 0 (zeros, or NaNs it never picks)
    std::memset(y, 0, sizeof(BlockQ8_K));
    return;
  }
  float max = 0.0f;
  for (int g = 0; g < 32; ++g) {
    const int hit = _mm256_movemask_ps(
        _mm256_cmp_ps(_mm256_and_ps(v[g], abs_mask), _mm256_set1_ps(am), _CMP_EQ_OQ));
    if (hit != 0) {
      max = x[8 * g + __builtin_ctz(hit)];
      break;
    }
  }
  const float iscale = -127.f / max;
  const __m256 s = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.f);
  const __m256i mant = _mm256_set1_epi32(0x007fffff), half = _mm256_set1_epi32(0x00400000);
  __m256i sums[16];              // [group of 16]: lane sums of its two runs
  for (int j = 0; j < 8; ++j) {  // 32 values: runs 4j .. 4j + 3
    __m256i q[4];
    for (int r = 0; r < 4; ++r) {
      const __m256i bits =
          _mm256_castps_si256(_mm256_add_ps(_mm256_mul_ps(v[4 * j + r], s), magic));
      q[r] = _mm256_min_epi32(_mm256_sub_epi32(_mm256_and_si256(bits, mant), half),
                              _mm256_set1_epi32(127));
    }
    // The in-lane packs interleave 4-value pieces; the permute restores the order.
    const __m256i p =
        _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y->qs + 32 * j),
                        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    sums[2 * j] = _mm256_add_epi32(q[0], q[1]);
    sums[2 * j + 1] = _mm256_add_epi32(q[2], q[3]);
  }
  __m128i total[4];  // [4 groups each]: the groups' sums
  for (int g = 0; g < 4; ++g) {
    const __m256i u = _mm256_hadd_epi32(_mm256_hadd_epi32(sums[4 * g], sums[4 * g + 1]),
                                        _mm256_hadd_epi32(sums[4 * g + 2], sums[4 * g + 3]));
    total[g] = _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(y->bsums), _mm_packs_epi32(total[0], total[1]));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(y->bsums + 8), _mm_packs_epi32(total[2], total[3]));
  y->d = 1 / iscale;
}

void QuantizeQ8K(const float* x, void* vy, int64_t k) {
  auto* y = static_cast<BlockQ8_K*>(vy);
  for (int64_t i = 0; i < k / kQK_K; ++i) QuantizeBlockQ8K(x + i * kQK_K, y + i);
}

// Up to kMaxGemmTokens tokens: prompt-sized calls unpack the group once
// (interleaved_kquants_wide_avx2.cpp), fewer run Gemm.
template <class Block, GemmInterleavedFn kWide>
void GemmAny(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
             float* out, size_t out_stride) {
  if (n_act >= kAvx2WideMinTokens)
    return kWide(k, group, act, act_row_bytes, n_act, out, out_stride);
  Gemm<Block>(k, group, act, act_row_bytes, n_act, out, out_stride);
}

}  // namespace

void RegisterAvx2InterleavedK(KernelTable& table) {
  table[static_cast<int>(GgmlType::kQ4_K)].gemm_interleaved =
      GemmAny<BlockQ4_Kx16, GemmWideAvx2Q4K>;
  table[static_cast<int>(GgmlType::kQ5_K)].gemm_interleaved =
      GemmAny<BlockQ5_Kx16, GemmWideAvx2Q5K>;
  table[static_cast<int>(GgmlType::kQ6_K)].gemm_interleaved =
      GemmAny<BlockQ6_Kx16, GemmWideAvx2Q6K>;
  table[static_cast<int>(GgmlType::kIQ4_XS)].gemm_interleaved =
      GemmAny<BlockIQ4_XSx16, GemmWideAvx2IQ4XS>;
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_XS}) {
    table[static_cast<int>(t)].gemm_max_tokens = kMaxGemmTokens;
  }
  table[static_cast<int>(GgmlType::kQ8_K)].quantize = QuantizeQ8K;
}

}  // namespace lamina::quant_internal
