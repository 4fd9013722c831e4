// AVX-512 VNNI kernels for interleaved Q4_K, Q5_K, Q6_K and IQ4_XS weights (BlockQ4_Kx16,
// BlockQ5_Kx16, BlockQ6_Kx16, BlockIQ4_XSx16): one 512-bit lane per row of the 16-row group. Per
// 4-element chunk one 64-byte load (Q4_K: masked or shifted nibbles; Q6_K: nibbles ORed with
// their two high bits; up to 3 tokens each load serves every group whose codes it holds) gives the
// unsigned codes of all rows, and each token adds its 4 activation codes, broadcast (as vpdpbusd's
// own {1to16} memory operand), by one vpdpbusd into a
// per-group sum (Q6_K's starts at -32 * bsums[g]; from 4 tokens that offset is added once per
// super-block by vpdpwssd); vpmulld applies the rows' group scales (from 4 tokens the sum split
// into its low byte and the rest by one vpshufb, and one vpdpwssd against (s, 256 s)) and Q4_K's
// mins term is vpdpwssd of each row's mins against the token's bsums on pairs of 32-value sums;
// IQ4_XS's nibbles become level + 128 by one vpshufb, and each group's sum starts at -128 * (its
// bsums). Every sum is exact, and the float steps are the scalar twin's (separate multiply and add,
// no FMA), so every output is the scalar twin's bits. Prompt-sized calls (16 to 128 tokens) unpack
// the group once into a local copy and run tiles of 8..12 tokens from it (GemmWide), with the same
// sums and float steps. The file also holds the AVX-512 twin of the Q8_K activation quantizer these
// kernels read (QuantizeQ8K in kquants.cpp: the same codes, bsums and d, bit for bit; compiled,
// like the kernels, without multiply-add contraction). GCC 12's AVX-512 headers self-initialise
// their "undefined" vectors, which -Wall reports at every inlined intrinsic (GCC PR105593); the
// warnings say nothing about this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "quant/kernel_registry.h"

namespace lamina::quant_internal {
namespace {

// Q6_K scales its group sums by split bytes and vpdpwssd from this many tokens (StepQ6K; fewer
// would wait on the one vpdpwssd chain per token, as Q4_K's would).
constexpr int kQ6DpwMinTokens = 4;

// Every step prefetches the super-block kPrefetchBlocks ahead of it (prefetches change no result;
// bytes past the matrix are harmless). A super-block's dots take longer than its bytes take to
// arrive (one token included: Q4_K_M decode 1.4x with it), and the hardware prefetcher alone let
// the weight reads and the dots take turns.
// - Up to kBurstMaxTokens tokens (decode, bound by the weights' stream): all its lines at once as
//   the step's first group starts, by one prefetch instruction in a loop. From memory, 2 threads
//   (BM_GemmStreamVsProbe/T/2, share of the read probe, 5 rounds): Q4_K 0.83-0.87 -> 0.90-0.97,
//   Q5_K 0.81-0.92 -> 0.97-1.05, Q6_K 0.79-0.94 -> 0.98-1.08, IQ4_XS 0.79-0.90 -> 0.89-1.02.
//   The same prefetches unrolled (each its own instruction, or 2 or 4 to a turn) streamed no
//   better than the spread form; GCC 12 removed a loop of prefetch intrinsics from some of these
//   functions (a prefetch has no effect it must keep), hence asm volatile. In L2, where nothing
//   needs fetching, the loop costs one token 4% (Q4_K) to 22% (Q6_K, 53 lines). Q4_0's small blocks
//   gain nothing from it (BlockStep).
// - With more tokens (compute-bound): spread over the step's groups (part p of n: its share of
//   the lines); the burst ran B = 8 decode ~8% slower.
constexpr int kPrefetchBlocks = 2;
constexpr int kBurstMaxTokens = 3;
template <int N, class Block>
inline void PrefetchPart(const Block& w, int p, int n) {
  constexpr int kLines = (sizeof(Block) + 63) / 64;
  const char* ahead = reinterpret_cast<const char*>(&w) + kPrefetchBlocks * sizeof(Block);
  if constexpr (N <= kBurstMaxTokens) {
    if (p != 0) return;
#pragma GCC unroll 1
    for (int l = 0; l < kLines; ++l) asm volatile("prefetcht0 %0" : : "m"(ahead[64 * l]));
  } else {
    const int per = (kLines + n - 1) / n;
    for (int l = p * per; l < std::min((p + 1) * per, kLines); ++l) {
      _mm_prefetch(ahead + 64 * l, _MM_HINT_T0);
    }
  }
}

#include "quant/interleaved_avx512_common.inc"

inline __m512i Load(const uint8_t* p) { return _mm512_loadu_si512(p); }

// acc + the word-pair dot of u with the 2 words at p broadcast to every lane (vpdpwssd's {1to16}
// memory operand, as DotBroadcast).
inline __m512i DotWordsBroadcast(__m512i acc, __m512i u, const void* p) {
  asm("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*static_cast<const int32_t*>(p)));
  return acc;
}

inline __m512 LoadHalves(const fp16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// P & 255 zero-extended in the low word and P >> 8 in the high word of each lane (exact for
// |P| < 2^23), for vpdpwssd against (s, 256 * s).
inline __m512i SplitBytes() {
  return _mm512_broadcast_i32x4(
      _mm_setr_epi8(0, -128, 1, 2, 4, -128, 5, 6, 8, -128, 9, 10, 12, -128, 13, 14));
}
// Lane r: s in the low word, 256 * s in the high word (s in [-128, 127]).
inline __m512i SplitScale(__m512i s32) {
  return _mm512_ternarylogic_epi32(_mm512_set1_epi32(0xFFFF), s32, _mm512_slli_epi32(s32, 24),
                                   0xEA);
}

// acc[t] += float(sumi[t]) * (d_w * d_a[t]), lane by lane as the scalar twin.
template <int N>
inline void AddScaled(__m512 dw, const __m512i* sumi, const BlockQ8_K* const* a, int64_t i,
                      __m512* acc) {
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) {
    const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(a[t][i].d));
    acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_cvtepi32_ps(sumi[t]), scale));
  }
}

// Q5_K's fifth bits of 32-value group j, chunk c: bit j of each qh byte moved to bit 4.
inline __m512i HighBitsQ5K(const BlockQ5_Kx16& w, int j, int c) {
  const __m512i h = Load(w.qh + 64 * c);
  const __m512i s = j <= 4 ? _mm512_slli_epi16(h, 4 - j) : _mm512_srli_epi16(h, j - 4);
  return _mm512_and_si512(s, _mm512_set1_epi8(0x10));
}

// One Q4_K or Q5_K super-block of the group against N tokens.
template <class Block, int N>
inline void StepQ45K(const Block& w, const BlockQ8_K* const* a, int64_t i, __m512* acc) {
  // Lane r: row r's scale/min words, unpacked as GGML does into scales 0-3, 4-7, mins 0-3, 4-7.
  const __m512i w0 = Load(w.scales), w1 = Load(w.scales + 64), w2 = Load(w.scales + 128);
  const __m512i m6 = _mm512_set1_epi32(0x3f3f3f3f), m4 = _mm512_set1_epi32(0x0f0f0f0f),
                m2 = _mm512_set1_epi32(0x03030303), byte = _mm512_set1_epi32(0xFF);
  const __m512i sc[2] = {
      _mm512_and_si512(w0, m6),
      _mm512_or_si512(_mm512_and_si512(w2, m4),
                      _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w0, 6), m2), 4))};
  const __m512i mn[2] = {
      _mm512_and_si512(w1, m6),
      _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), m4),
                      _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w1, 6), m2), 4))};
  const __m512i nib = _mm512_set1_epi8(0x0F);
  // From 4 tokens each 32-value group sum P (|P| <= 31 * 128 * 32 < 2^23) is scaled by split bytes:
  // one vpshufb (off the dot's ports) and one vpdpwssd against (s, 256 s) add s * P exactly, where
  // two vpdpwssd on half sums, or vpmulld and an add, take two of the dot's slots; fewer tokens
  // would wait on the one vpdpwssd chain.
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5_Kx16>;
  constexpr bool kSplit = N >= 4;
  const __m512i split = SplitBytes();
  // Up to 3 tokens the groups run in pairs (2h, 2h + 1), each chunk's bytes (and Q5_K's fifth
  // bits) loaded once for both nibbles: the loads, not the dots, bound these kernels, and GCC
  // folds a load into every use. Q4_K's high nibbles are dotted in place: v & 0xF0 = 16 * code,
  // one instruction where a shift and a mask are two; the odd groups' sums are thus 16 times
  // theirs, add into sumi_hi, and sumi += sumi_hi / 16 at the end, exact (|16 s P| summed over
  // 4 groups < 2^28).
  constexpr bool kPairs = N <= 3;
  __m512i sumi[N];
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) sumi[t] = _mm512_setzero_si512();
  if constexpr (kPairs) {
    const __m512i high_nib = _mm512_set1_epi8(static_cast<char>(0xF0));
    __m512i sumi_hi[N];
#pragma GCC unroll 8
    for (int t = 0; t < N; ++t) sumi_hi[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
      PrefetchPart<N>(w, 2 * h, 8);
      PrefetchPart<N>(w, 2 * h + 1, 8);
      __m512i part[2][N];  // [group 2h + o][token]
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) part[0][t] = part[1][t] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m512i v = LoadOnce(w.qs + 64 * (8 * h + c));
        __m512i u[2];
        if constexpr (kQ5) {  // the fifth bits of both groups from one qh load
          const __m512i hb = LoadOnce(w.qh + 64 * c);
          const __m512i five = _mm512_set1_epi8(0x10);
          const auto bit4 = [&](int j) {  // bit j of each qh byte moved to bit 4
            return j <= 4 ? _mm512_slli_epi16(hb, 4 - j) : _mm512_srli_epi16(hb, j - 4);
          };
          u[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(bit4(2 * h), five), nib, v, 0xF8);
          u[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(bit4(2 * h + 1), five), nib,
                                           _mm512_srli_epi16(v, 4), 0xF8);
        } else {
          u[0] = _mm512_and_si512(v, nib);
          u[1] = _mm512_and_si512(v, high_nib);
        }
#pragma GCC unroll 2
        for (int o = 0; o < 2; ++o) {
#pragma GCC unroll 8
          for (int t = 0; t < N; ++t) {
            part[o][t] = DotBroadcast(part[o][t], u[o], a[t][i].qs + 32 * (2 * h + o) + 4 * c);
          }
        }
      }
#pragma GCC unroll 2
      for (int o = 0; o < 2; ++o) {
        const int j = 2 * h + o;
        const __m512i s = _mm512_and_si512(_mm512_srli_epi32(sc[j / 4], 8 * (j % 4)), byte);
        __m512i* into = o == 1 && !kQ5 ? sumi_hi : sumi;
#pragma GCC unroll 8
        for (int t = 0; t < N; ++t) {
          into[t] = _mm512_add_epi32(into[t], _mm512_mullo_epi32(part[o][t], s));
        }
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < N; ++t) {
      if constexpr (!kQ5) sumi[t] = _mm512_add_epi32(sumi[t], _mm512_srai_epi32(sumi_hi[t], 4));
    }
  } else {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      PrefetchPart<N>(w, j, 8);
      const __m512i s0 = _mm512_and_si512(_mm512_srli_epi32(sc[j / 4], 8 * (j % 4)), byte);
      const __m512i s = kSplit ? SplitScale(s0) : s0;
      __m512i part[N];
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) part[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m512i v = Load(w.qs + 64 * (8 * (j / 2) + c));
        __m512i u = _mm512_and_si512(j % 2 == 0 ? v : _mm512_srli_epi16(v, 4), nib);
        if constexpr (kQ5) u = _mm512_or_si512(u, HighBitsQ5K(w, j, c));
#pragma GCC unroll 8
        for (int t = 0; t < N; ++t) {
          part[t] = DotBroadcast(part[t], u, a[t][i].qs + 32 * j + 4 * c);
        }
      }
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        sumi[t] = kSplit ? _mm512_dpwssd_epi32(sumi[t], _mm512_shuffle_epi8(part[t], split), s)
                         : _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(part[t], s));
      }
    }
  }
  AddScaled<N>(LoadHalves(w.d), sumi, a, i, acc);
  const __m512 dmin = LoadHalves(w.dmin);
  // summ = sum_j mn_j * B_j, B_j = bsums[2j] + bsums[2j + 1] (|B_j| <= 32 * 127): four
  // vpdpwssd of the rows' (mn_2k, mn_2k+1) words against the token's (B_2k, B_2k+1).
  const __m512i lo = _mm512_broadcast_i32x4(  // per dword: bytes 0 and 1 as words
      _mm_setr_epi8(0, -128, 1, -128, 4, -128, 5, -128, 8, -128, 9, -128, 12, -128, 13, -128));
  const __m512i hi = _mm512_broadcast_i32x4(  // bytes 2 and 3 as words
      _mm_setr_epi8(2, -128, 3, -128, 6, -128, 7, -128, 10, -128, 11, -128, 14, -128, 15, -128));
  const __m512i mpair[4] = {// [k]: row r's (mn_2k, mn_2k+1) words in lane r
                            _mm512_shuffle_epi8(mn[0], lo), _mm512_shuffle_epi8(mn[0], hi),
                            _mm512_shuffle_epi8(mn[1], lo), _mm512_shuffle_epi8(mn[1], hi)};
  alignas(32) int16_t pairs[N][16];  // [token]: B_0..B_3, (again), B_4..B_7, (again)
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t][i].bsums));
    _mm256_store_si256(reinterpret_cast<__m256i*>(pairs[t]), _mm256_hadd_epi16(b, b));
  }
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) {
    __m512i summ = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      summ = _mm512_dpwssd_epi32(summ, mpair[k], Broadcast4(pairs[t] + 2 * (k % 2) + 8 * (k / 2)));
    }
    const __m512 scale = _mm512_mul_ps(dmin, _mm512_set1_ps(a[t][i].d));
    acc[t] = _mm512_sub_ps(acc[t], _mm512_mul_ps(_mm512_cvtepi32_ps(summ), scale));
  }
}

// The unsigned 6-bit codes of quarter m (0..3) for ql chunk cl and qh chunk ch: (low nibble) |
// (bits 2m, 2m + 1 of the qh byte at bits 4, 5), merged by one vpternlogd (for m < 2 with the ql
// bytes as its memory operand, which GCC does not fold by itself).
inline __m512i CodesQ6K(const BlockQ6_Kx16& w, int m, int cl, int ch) {
  const __m512i h = Load(w.qh + 64 * ch);
  const __m512i hs = m == 0   ? _mm512_slli_epi16(h, 4)
                     : m == 1 ? _mm512_slli_epi16(h, 2)
                     : m == 2 ? h
                              : _mm512_srli_epi16(h, 2);
  __m512i u = _mm512_and_si512(hs, _mm512_set1_epi8(0x30));
  const __m512i nib = _mm512_set1_epi8(0x0F);
  if (m < 2) {  // u | (nib & ql)
    asm("vpternlogd $0xF8, %2, %1, %0"
        : "+v"(u)
        : "v"(nib), "m"(*reinterpret_cast<const __m512i*>(w.ql + 64 * cl)));
    return u;
  }
  return _mm512_ternarylogic_epi32(u, nib, _mm512_srli_epi16(Load(w.ql + 64 * cl), 4), 0xF8);
}

// One Q6_K super-block of the group against N tokens. Group g = 8n + 2m + hh holds elements
// 128n + 32m + 16hh + (0..15): ql chunk 16n + 8(m % 2) + 4hh + c4, qh chunk 8n + 4hh + c4.
//
// The group sum P (|P| <= 63 * 128 * 16 + 32 * 32,768 < 2^21: past a word) is scaled
// by split bytes (kDpw, from kQ6DpwMinTokens tokens): one vpshufb puts P's low byte, zero-extended,
// in the low word and P >> 8 in the high word, and one vpdpwssd against (s, 256 * s) adds
// s * (P & 255) + 256 * s * (P >> 8) = s * P exactly; 256 * s fits a word for s in [-128, 127].
// Otherwise vpmulld and vpaddd.
//
// The -32 offset: with kDpw each group's sum starts at zero (P = sum u * a, |P| < 2^17) and each
// token's sum gets -32 * sum_g s_g * bsums[g] once per super-block, by eight vpdpwssd of the rows'
// (-32 s_2k, -32 s_2k+1) words (|32 s| <= 4,096) against the token's (bsums[2k], bsums[2k + 1])
// as a broadcast operand: 8 instructions per token where a start of -32 * bsums[g] per group took
// 16 broadcast loads. 2 or 3 tokens start each group at -32 * bsums[g], broadcast from one
// vector per token (sign-extend, shift, negate, store); one token by a multiply and a broadcast.
// Every way gives the same integer sums.
template <int N>
inline void StepQ6K(const BlockQ6_Kx16& w, const BlockQ8_K* const* a, int64_t i, __m512* acc) {
  constexpr bool kDpw = N >= kQ6DpwMinTokens;
  const __m512i split = _mm512_broadcast_i32x4(  // per dword: byte 0, zero, bytes 1 and 2
      _mm_setr_epi8(0, -128, 1, 2, 4, -128, 5, 6, 8, -128, 9, 10, 12, -128, 13, 14));
  constexpr bool kNegVec = N >= 2 && !kDpw;
  alignas(64) int32_t neg[kNegVec ? N : 1][16];  // [token][group g]: -32 * bsums[g]
  if constexpr (kNegVec) {
#pragma GCC unroll 8
    for (int t = 0; t < N; ++t) {
      const __m512i b = _mm512_cvtepi16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t][i].bsums)));
      _mm512_store_si512(neg[t], _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(b, 5)));
    }
    asm("" ::: "memory");  // read neg back by broadcast loads, not by shuffles of its registers
  }
  __m512i sumi[N];
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) sumi[t] = _mm512_setzero_si512();
  if constexpr (!kDpw) {
    // Few tokens: the four groups 8n + 2m + hh (m = 0..3) run together, so each qh chunk and
    // each ql chunk is loaded once for all the codes it holds (loads, not dots, bound these
    // kernels; one group at a time loaded a qh chunk 4 times and a ql chunk twice).
    const __m512i nib = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int n = 0; n < 2; ++n) {
#pragma GCC unroll 2
      for (int hh = 0; hh < 2; ++hh) {
        __m512i part[4][N];  // [m][token]: group 8n + 2m + hh
#pragma GCC unroll 4
        for (int m = 0; m < 4; ++m) {
          const int g = 8 * n + 2 * m + hh;
          PrefetchPart<N>(w, g, 16);
#pragma GCC unroll 8
          for (int t = 0; t < N; ++t) {
            part[m][t] =
                kNegVec ? _mm512_set1_epi32(neg[t][g]) : _mm512_set1_epi32(-32 * a[t][i].bsums[g]);
          }
        }
#pragma GCC unroll 4
        for (int c4 = 0; c4 < 4; ++c4) {
          const __m512i h = LoadOnce(w.qh + 64 * (8 * n + 4 * hh + c4));
          const __m512i la = LoadOnce(w.ql + 64 * (16 * n + 4 * hh + c4));      // m = 0, 2
          const __m512i lb = LoadOnce(w.ql + 64 * (16 * n + 8 + 4 * hh + c4));  // m = 1, 3
          const __m512i u[4] = {
              _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_slli_epi16(h, 4), top2), nib, la,
                                        0xF8),
              _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_slli_epi16(h, 2), top2), nib, lb,
                                        0xF8),
              _mm512_ternarylogic_epi32(_mm512_and_si512(h, top2), nib, _mm512_srli_epi16(la, 4),
                                        0xF8),
              _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(h, 2), top2), nib,
                                        _mm512_srli_epi16(lb, 4), 0xF8)};
#pragma GCC unroll 4
          for (int m = 0; m < 4; ++m) {
            const int e0 = 16 * (8 * n + 2 * m + hh) + 4 * c4;
#pragma GCC unroll 8
            for (int t = 0; t < N; ++t)
              part[m][t] = DotBroadcast(part[m][t], u[m], a[t][i].qs + e0);
          }
        }
#pragma GCC unroll 4
        for (int m = 0; m < 4; ++m) {
          const __m512i s = _mm512_cvtepi8_epi32(_mm_loadu_si128(
              reinterpret_cast<const __m128i*>(w.scales + 16 * (8 * n + 2 * m + hh))));
#pragma GCC unroll 8
          for (int t = 0; t < N; ++t) {
            sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(part[m][t], s));
          }
        }
      }
    }
    AddScaled<N>(LoadHalves(w.d), sumi, a, i, acc);
    return;
  }
  // From here kDpw: one group at a time.
  __m512i s_even;     // the even group's scales, sign-extended (lane r: row r)
  __m512i offset[8];  // [k]: lane r holds words (-32 s_2k, -32 s_2k+1) of row r
#pragma GCC unroll 2
  for (int n = 0; n < 2; ++n) {
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
#pragma GCC unroll 2
      for (int hh = 0; hh < 2; ++hh) {
        const int g = 8 * n + 2 * m + hh;
        PrefetchPart<N>(w, g, 16);
        const __m512i s32 = _mm512_cvtepi8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales + 16 * g)));
        // s in the low word, 256 * s in the high word.
        const __m512i s = _mm512_ternarylogic_epi32(_mm512_set1_epi32(0xFFFF), s32,
                                                    _mm512_slli_epi32(s32, 24), 0xEA);
        if (hh == 0) {
          s_even = s32;
        } else {
          const __m512i pair = _mm512_ternarylogic_epi32(_mm512_set1_epi32(0xFFFF), s_even,
                                                         _mm512_slli_epi32(s32, 16), 0xEA);
          offset[g / 2] = _mm512_mullo_epi16(pair, _mm512_set1_epi16(-32));
        }
        __m512i part[N];
#pragma GCC unroll 8
        for (int t = 0; t < N; ++t) part[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c4 = 0; c4 < 4; ++c4) {
          const __m512i u = CodesQ6K(w, m, 16 * n + 8 * (m % 2) + 4 * hh + c4, 8 * n + 4 * hh + c4);
          const int e0 = 16 * g + 4 * c4;
#pragma GCC unroll 8
          for (int t = 0; t < N; ++t) {
            part[t] = DotBroadcast(part[t], u, a[t][i].qs + e0);
          }
        }
#pragma GCC unroll 8
        for (int t = 0; t < N; ++t) {
          sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_shuffle_epi8(part[t], split), s);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) {
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      sumi[t] = DotWordsBroadcast(sumi[t], offset[k], a[t][i].bsums + 2 * k);
    }
  }
  AddScaled<N>(LoadHalves(w.d), sumi, a, i, acc);
}

// One IQ4_XS super-block of the group against N tokens. Chunk c = 4j + c4 of group j holds
// elements 32j + 4c4 + (0..3) in its low nibbles and those + 16 in its high nibbles; a nibble's
// level + 128 (1..241, unsigned) comes from one in-lane table lookup, and the group's sum starts
// at -128 * sum(q), so it is the exact dot with the signed levels. The two halves of a group are
// summed apart (shorter vpdpbusd chains) and added before the scale's vpmulld.
template <int N>
inline void StepIQ4XS(const BlockIQ4_XSx16& w, const BlockQ8_K* const* a, int64_t i, __m512* acc) {
  const __m512i table = LevelTable(kIq4NlLevels);  // level + 128: the sign bit flipped
  const __m512i lo4 = Load(w.scales_l);
  const __m512i hi2 =
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.scales_h)));
  const __m512i nib = _mm512_set1_epi8(0x0F);
  __m512i sumi[N];
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) sumi[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    PrefetchPart<N>(w, j, 8);
    const __m512i ls = _mm512_or_si512(
        _mm512_and_si512(_mm512_srli_epi32(lo4, 4 * j), _mm512_set1_epi32(0xF)),
        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hi2, 2 * j), _mm512_set1_epi32(3)),
                          4));
    const __m512i s = _mm512_sub_epi32(ls, _mm512_set1_epi32(32));
    __m512i lo[N], hi[N];
#pragma GCC unroll 8
    for (int t = 0; t < N; ++t) {
      lo[t] = _mm512_set1_epi32(-128 * (a[t][i].bsums[2 * j] + a[t][i].bsums[2 * j + 1]));
      hi[t] = _mm512_setzero_si512();
    }
#pragma GCC unroll 4
    for (int c4 = 0; c4 < 4; ++c4) {
      const __m512i v = LoadOnce(w.qs + 64 * (4 * j + c4));
      const __m512i ul = _mm512_shuffle_epi8(table, _mm512_and_si512(v, nib));
      const __m512i uh = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), nib));
      const int e0 = 32 * j + 4 * c4;
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        lo[t] = DotBroadcast(lo[t], ul, a[t][i].qs + e0);
        hi[t] = DotBroadcast(hi[t], uh, a[t][i].qs + e0 + 16);
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < N; ++t) {
      sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(_mm512_add_epi32(lo[t], hi[t]), s));
    }
  }
  AddScaled<N>(LoadHalves(w.d), sumi, a, i, acc);
}

// One block of 256 floats as BlockQ8_K, exactly as the scalar QuantizeQ8K: the first element of
// largest magnitude gives iscale = -127 / max, codes min(127, round-half-even(iscale * x)) by
// the 1.5 * 2^23 trick (multiply, then add), bsums per 16, d = 1 / iscale.
void QuantizeBlockQ8K(const float* x, BlockQ8_K* y) {
  __m512 v[16];  // [16 groups of 16 values]
  __m512 amax = _mm512_setzero_ps();
  for (int g = 0; g < 16; ++g) {
    v[g] = _mm512_loadu_ps(x + 16 * g);
    amax = _mm512_max_ps(_mm512_abs_ps(v[g]), amax);  // a NaN lane keeps amax, as the twin
  }
  const float am = _mm512_reduce_max_ps(amax);
  if (!(am > 0.0f)) {  // the scalar twin's amax stays 0 (zeros, or NaNs it never picks)
    std::memset(y, 0, sizeof(BlockQ8_K));
    return;
  }
  float max = 0.0f;
  for (int g = 0; g < 16; ++g) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(v[g]), _mm512_set1_ps(am), _CMP_EQ_OQ);
    if (hit != 0) {
      max = x[16 * g + __builtin_ctz(hit)];
      break;
    }
  }
  const float iscale = -127.f / max;
  const __m512 s = _mm512_set1_ps(iscale), magic = _mm512_set1_ps(12582912.f);
  // bsums from the stored bytes, as the twin sums them: each 4 groups' 64 codes (+128 by their
  // sign bit flipped, so unsigned) summed 8 at a time by vpsadbw, the two halves of a group added
  // and 16 * 128 taken off: exact, where a horizontal sum per group took ~8 instructions.
  __m512i sad[4];  // [4 groups each]: qword 2j + h = sum of (code + 128) over half h of group j
  for (int b = 0; b < 4; ++b) {
    __m128i codes[4];
    for (int j = 0; j < 4; ++j) {
      const int g = 4 * b + j;
      const __m512i bits = _mm512_castps_si512(_mm512_add_ps(_mm512_mul_ps(v[g], s), magic));
      __m512i q = _mm512_sub_epi32(_mm512_and_si512(bits, _mm512_set1_epi32(0x007fffff)),
                                   _mm512_set1_epi32(0x00400000));
      q = _mm512_min_epi32(q, _mm512_set1_epi32(127));
      codes[j] = _mm512_cvtepi32_epi8(q);  // the low byte, as the twin's int8 cast
    }
    __m512i c = _mm512_castsi128_si512(codes[0]);
    c = _mm512_inserti32x4(c, codes[1], 1);
    c = _mm512_inserti32x4(c, codes[2], 2);
    c = _mm512_inserti32x4(c, codes[3], 3);
    _mm512_storeu_si512(y->qs + 64 * b, c);
    sad[b] = _mm512_sad_epu8(_mm512_xor_si512(c, _mm512_set1_epi8(static_cast<char>(0x80))),
                             _mm512_setzero_si512());
  }
  for (int h = 0; h < 2; ++h) {  // groups 8h..8h + 7
    const __m512i a = sad[2 * h], b = sad[2 * h + 1];
    // qword j: group 8h + j's first half, then its second half (from a for j < 4, else b).
    const __m512i first =
        _mm512_permutex2var_epi64(a, _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), b);
    const __m512i second =
        _mm512_permutex2var_epi64(a, _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15), b);
    const __m512i sum =
        _mm512_sub_epi64(_mm512_add_epi64(first, second), _mm512_set1_epi64(16 * 128));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y->bsums + 8 * h), _mm512_cvtepi64_epi16(sum));
  }
  y->d = 1 / iscale;
}

void QuantizeQ8K(const float* x, void* vy, int64_t k) {
  auto* y = static_cast<BlockQ8_K*>(vy);
  for (int64_t i = 0; i < k / kQK_K; ++i) QuantizeBlockQ8K(x + i * kQK_K, y + i);
}

template <class Block, int N>
void GemmN(int64_t nb, const Block* w, const char* act, size_t act_row_bytes, float* out,
           size_t out_stride) {
  const BlockQ8_K* a[N];
  __m512 acc[N];
  for (int t = 0; t < N; ++t) {
    a[t] = reinterpret_cast<const BlockQ8_K*>(act + t * act_row_bytes);
    acc[t] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < nb; ++i) {
    if constexpr (std::is_same_v<Block, BlockQ6_Kx16>) {
      StepQ6K<N>(w[i], a, i, acc);
    } else if constexpr (std::is_same_v<Block, BlockIQ4_XSx16>) {
      StepIQ4XS<N>(w[i], a, i, acc);
    } else {
      StepQ45K<Block, N>(w[i], a, i, acc);
    }
  }
  for (int t = 0; t < N; ++t) _mm512_storeu_ps(out + t * out_stride, acc[t]);
}

// Prompt batches (from kWideMinTokens tokens, Q4_K, Q5_K and Q6_K): the group is unpacked once per
// call, kSlab super-blocks at a time, into a local copy (codes as bytes, scales as the vectors
// vpdpwssd takes, d as floats), and every token runs from that copy in tiles of 8..kWideTile
// tokens; each token's float accumulator lives in acc between super-blocks. The integer sums are
// exact and the float steps per super-block those of the scalar twin, so the outputs are the
// same bits as the one-token kernels'.
constexpr int kWideMinTokens = 16;
constexpr int kWideTile = 12;  // tiles of 8..12 tokens for 16 or more
constexpr int kSlab = 4;       // super-blocks unpacked at a time

// One Q4_K or Q5_K super-block of the group, unpacked.
struct alignas(64) WideQ45K {
  uint8_t codes[64][64];  // [8 * group j + chunk c][16 rows x 4 codes]: elements 32j + 4c + 0..3
  int32_t scale[8][16];   // [group j][row]: SplitScale of the 6-bit scale
  int32_t min[8][16];     // [group j][row]: the 6-bit min in both words
  float d[16], dmin[16];  // [row]
};
// One Q6_K super-block of the group, unpacked.
struct alignas(64) WideQ6K {
  uint8_t codes[64][64];  // [4 * group g + chunk c][16 rows x 4 codes]: elements 16g + 4c + 0..3
  int32_t scale[16][16];  // [group g][row]: SplitScale of the signed scale
  float d[16];            // [row]
};
template <class Block>
using Wide = std::conditional_t<std::is_same_v<Block, BlockQ6_Kx16>, WideQ6K, WideQ45K>;

template <class Block>
void Unpack(const Block& w, WideQ45K* u) {
  const __m512i w0 = Load(w.scales), w1 = Load(w.scales + 64), w2 = Load(w.scales + 128);
  const __m512i m6 = _mm512_set1_epi32(0x3f3f3f3f), m4 = _mm512_set1_epi32(0x0f0f0f0f),
                m2 = _mm512_set1_epi32(0x03030303), byte = _mm512_set1_epi32(0xFF);
  const __m512i sc[2] = {
      _mm512_and_si512(w0, m6),
      _mm512_or_si512(_mm512_and_si512(w2, m4),
                      _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w0, 6), m2), 4))};
  const __m512i mn[2] = {
      _mm512_and_si512(w1, m6),
      _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), m4),
                      _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w1, 6), m2), 4))};
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int j = 0; j < 8; ++j) {
    const __m512i s = _mm512_and_si512(_mm512_srli_epi32(sc[j / 4], 8 * (j % 4)), byte);
    _mm512_store_si512(u->scale[j], SplitScale(s));
    const __m512i m = _mm512_and_si512(_mm512_srli_epi32(mn[j / 4], 8 * (j % 4)), byte);
    _mm512_store_si512(u->min[j], _mm512_or_si512(m, _mm512_slli_epi32(m, 16)));
    for (int c = 0; c < 8; ++c) {
      const __m512i v = Load(w.qs + 64 * (8 * (j / 2) + c));
      __m512i q = _mm512_and_si512(j % 2 == 0 ? v : _mm512_srli_epi16(v, 4), nib);
      if constexpr (std::is_same_v<Block, BlockQ5_Kx16>)
        q = _mm512_or_si512(q, HighBitsQ5K(w, j, c));
      _mm512_store_si512(u->codes[8 * j + c], q);
    }
  }
  _mm512_store_ps(u->d, LoadHalves(w.d));
  _mm512_store_ps(u->dmin, LoadHalves(w.dmin));
}

void Unpack(const BlockQ6_Kx16& w, WideQ6K* u) {
  for (int n = 0; n < 2; ++n) {
    for (int m = 0; m < 4; ++m) {
      for (int hh = 0; hh < 2; ++hh) {
        const int g = 8 * n + 2 * m + hh;
        _mm512_store_si512(u->scale[g], SplitScale(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                            reinterpret_cast<const __m128i*>(w.scales + 16 * g)))));
        for (int c4 = 0; c4 < 4; ++c4) {
          _mm512_store_si512(
              u->codes[4 * g + c4],
              CodesQ6K(w, m, 16 * n + 8 * (m % 2) + 4 * hh + c4, 8 * n + 4 * hh + c4));
        }
      }
    }
  }
  _mm512_store_ps(u->d, LoadHalves(w.d));
}

// acc[t] (in memory) += float(sumi[t]) * (d_w * d_a[t]), or -= for kSub.
template <int N, bool kSub>
inline void AddScaledTo(const float* dw, const __m512i* sumi, const BlockQ8_K* const* a, int64_t i,
                        float (*acc)[16]) {
  const __m512 d = _mm512_load_ps(dw);
#pragma GCC unroll 12
  for (int t = 0; t < N; ++t) {
    const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(a[t][i].d));
    const __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(sumi[t]), scale);
    const __m512 v = _mm512_load_ps(acc[t]);
    _mm512_store_ps(acc[t], kSub ? _mm512_sub_ps(v, x) : _mm512_add_ps(v, x));
  }
}

// Super-block i (unpacked in u) against N tokens: Q4_K / Q5_K.
template <int N>
inline void WideStep(const WideQ45K& u, const BlockQ8_K* const* a, int64_t i, float (*acc)[16]) {
  const __m512i split = SplitBytes();
  __m512i sumi[N];
#pragma GCC unroll 12
  for (int t = 0; t < N; ++t) sumi[t] = _mm512_setzero_si512();
#pragma GCC unroll 1
  for (int j = 0; j < 8; ++j) {
    __m512i part[N];
#pragma GCC unroll 12
    for (int t = 0; t < N; ++t) part[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m512i q = _mm512_load_si512(u.codes[8 * j + c]);
#pragma GCC unroll 12
      for (int t = 0; t < N; ++t) {
        part[t] = _mm512_dpbusd_epi32(part[t], q, Broadcast4(a[t][i].qs + 32 * j + 4 * c));
      }
    }
    // |part| <= 31 * 128 * 32 < 2^23: split bytes times (s, 256 s) add s * part exactly.
    const __m512i s = _mm512_load_si512(u.scale[j]);
#pragma GCC unroll 12
    for (int t = 0; t < N; ++t) {
      sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_shuffle_epi8(part[t], split), s);
    }
  }
  AddScaledTo<N, false>(u.d, sumi, a, i, acc);
#pragma GCC unroll 12
  for (int t = 0; t < N; ++t) sumi[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    const __m512i m = _mm512_load_si512(u.min[j]);
#pragma GCC unroll 12
    for (int t = 0; t < N; ++t) {
      sumi[t] = _mm512_dpwssd_epi32(sumi[t], m, Broadcast4(a[t][i].bsums + 2 * j));
    }
  }
  AddScaledTo<N, true>(u.dmin, sumi, a, i, acc);
}

// Q6_K: each 16-value group's sum starts at -32 * bsums[g] (from neg, this tile's copy).
template <int N>
inline void WideStep(const WideQ6K& u, const BlockQ8_K* const* a, int64_t i, float (*acc)[16]) {
  const __m512i split = SplitBytes();
  alignas(64) int32_t neg[N][16];  // [token][group g]: -32 * bsums[g]
#pragma GCC unroll 12
  for (int t = 0; t < N; ++t) {
    const __m512i b =
        _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t][i].bsums)));
    _mm512_store_si512(neg[t], _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(b, 5)));
  }
  __m512i sumi[N];
#pragma GCC unroll 12
  for (int t = 0; t < N; ++t) sumi[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
  for (int g = 0; g < 16; ++g) {
    __m512i part[N];
#pragma GCC unroll 12
    for (int t = 0; t < N; ++t) part[t] = _mm512_set1_epi32(neg[t][g]);
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i q = _mm512_load_si512(u.codes[4 * g + c]);
#pragma GCC unroll 12
      for (int t = 0; t < N; ++t) {
        part[t] = _mm512_dpbusd_epi32(part[t], q, Broadcast4(a[t][i].qs + 16 * g + 4 * c));
      }
    }
    const __m512i s = _mm512_load_si512(u.scale[g]);
#pragma GCC unroll 12
    for (int t = 0; t < N; ++t) {
      sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_shuffle_epi8(part[t], split), s);
    }
  }
  AddScaledTo<N, false>(u.d, sumi, a, i, acc);
}

// Super-blocks [i0, i0 + ns) (unpacked in u) against the N tokens at act.
template <class Block, int N>
void WideTile(const Wide<Block>* u, int ns, int64_t i0, const char* act, size_t act_row_bytes,
              float (*acc)[16]) {
  const BlockQ8_K* a[N];
  for (int t = 0; t < N; ++t) a[t] = reinterpret_cast<const BlockQ8_K*>(act + t * act_row_bytes);
  for (int s = 0; s < ns; ++s) WideStep<N>(u[s], a, i0 + s, acc);
}

template <class Block>
void GemmWide(int64_t nb, const Block* w, const char* act, size_t act_row_bytes, int n_act,
              float* out, size_t out_stride) {
  Wide<Block> u[kSlab];                            // [super-block of the slab]
  alignas(64) float acc[kMaxGemmTokens][16] = {};  // [token][row]
  const int n_tiles = (n_act + kWideTile - 1) / kWideTile;
  for (int64_t i0 = 0; i0 < nb; i0 += kSlab) {
    const int ns = static_cast<int>(std::min<int64_t>(kSlab, nb - i0));
    for (int s = 0; s < ns; ++s) Unpack(w[i0 + s], &u[s]);
    for (int tt = 0; tt < n_tiles; ++tt) {
      const int t0 = tt * n_act / n_tiles, nt = (tt + 1) * n_act / n_tiles - t0;
      const char* a = act + t0 * act_row_bytes;
      switch (nt) {  // 8..12 from kWideMinTokens tokens
        case 8:
          WideTile<Block, 8>(u, ns, i0, a, act_row_bytes, acc + t0);
          break;
        case 9:
          WideTile<Block, 9>(u, ns, i0, a, act_row_bytes, acc + t0);
          break;
        case 10:
          WideTile<Block, 10>(u, ns, i0, a, act_row_bytes, acc + t0);
          break;
        case 11:
          WideTile<Block, 11>(u, ns, i0, a, act_row_bytes, acc + t0);
          break;
        default:
          WideTile<Block, 12>(u, ns, i0, a, act_row_bytes, acc + t0);
          break;
      }
    }
  }
  for (int t = 0; t < n_act; ++t) _mm512_storeu_ps(out + t * out_stride, _mm512_load_ps(acc[t]));
}

template <class Block>
void GemmFew(int64_t nb, const Block* w, const char* a, size_t act_row_bytes, int n_act, float* out,
             size_t out_stride) {
  switch (n_act) {
    case 1:
      return GemmN<Block, 1>(nb, w, a, act_row_bytes, out, out_stride);
    case 2:
      return GemmN<Block, 2>(nb, w, a, act_row_bytes, out, out_stride);
    case 3:
      return GemmN<Block, 3>(nb, w, a, act_row_bytes, out, out_stride);
    case 4:
      return GemmN<Block, 4>(nb, w, a, act_row_bytes, out, out_stride);
    case 5:
      return GemmN<Block, 5>(nb, w, a, act_row_bytes, out, out_stride);
    case 6:
      return GemmN<Block, 6>(nb, w, a, act_row_bytes, out, out_stride);
    case 7:
      return GemmN<Block, 7>(nb, w, a, act_row_bytes, out, out_stride);
    default:
      return GemmN<Block, 8>(nb, w, a, act_row_bytes, out, out_stride);
  }
}

template <class Block>
void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  const auto* w = static_cast<const Block*>(group);
  const char* a = static_cast<const char*>(act);
  const int64_t nb = k / kQK_K;
  constexpr bool kWide = !std::is_same_v<Block, BlockIQ4_XSx16>;
  if (kWide && n_act >= kWideMinTokens) {
    if constexpr (kWide) GemmWide<Block>(nb, w, a, act_row_bytes, n_act, out, out_stride);
    return;
  }
  // Even tiles of up to kMaxMultiDot tokens (9: 5 + 4).
  const int n_tiles = (n_act + kMaxMultiDot - 1) / kMaxMultiDot;
  for (int tt = 0; tt < n_tiles; ++tt) {
    const int t0 = tt * n_act / n_tiles, nt = (tt + 1) * n_act / n_tiles - t0;
    GemmFew<Block>(nb, w, a + t0 * act_row_bytes, act_row_bytes, nt, out + t0 * out_stride,
                   out_stride);
  }
}

}  // namespace

void RegisterAvx512InterleavedK(KernelTable& table) {
  table[static_cast<int>(GgmlType::kQ8_K)].quantize = QuantizeQ8K;
  table[static_cast<int>(GgmlType::kQ4_K)].gemm_interleaved = Gemm<BlockQ4_Kx16>;
  table[static_cast<int>(GgmlType::kQ5_K)].gemm_interleaved = Gemm<BlockQ5_Kx16>;
  table[static_cast<int>(GgmlType::kQ6_K)].gemm_interleaved = Gemm<BlockQ6_Kx16>;
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    table[static_cast<int>(t)].gemm_max_tokens = kMaxGemmTokens;
  }
  table[static_cast<int>(GgmlType::kIQ4_XS)].gemm_interleaved = Gemm<BlockIQ4_XSx16>;
  // The AVX2 IQ4_XS kernel this replaces took prompt-sized calls; this one tiles them by 8.
  table[static_cast<int>(GgmlType::kIQ4_XS)].gemm_max_tokens = kMaxMultiDot;
}

}  // namespace lamina::quant_internal
