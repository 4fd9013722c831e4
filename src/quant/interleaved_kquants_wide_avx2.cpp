// AVX2 prompt-sized kernels for interleaved Q4_K, Q5_K, Q6_K and IQ4_XS weights (BlockQ4_Kx16,
// BlockQ5_Kx16, BlockQ6_Kx16, BlockIQ4_XSx16), from kAvx2WideMinTokens tokens a call: each
// super-block of the 16-row group is unpacked once per call (codes as bytes, one 256-bit vector per
// half of 8 rows and 4-value chunk; scales and mins in both words of each row's lane; d as floats),
// four super-blocks at a time, and every token runs from that copy in tiles. Per chunk and token
// one maddubs gives each row's pair sums (at most 2 * 63 * 128 in magnitude); those of a run of one
// scale's chunks are added as words, which they fit (Q4_K / Q5_K: 4 chunks, 8 * 31 * 128 < 2^15;
// Q6_K: 2, 4 * 63 * 128), and one madd against the scale adds sc * sum, exact in int32. Q4_K's mins
// and Q6_K's -32 offset are the AVX2 kernels' madd against the bsums pairs. IQ4_XS keeps its levels
// and their magnitudes (one madd per chunk, as the 1-8-token kernel). Every integer sum is
// exact and the float steps per super-block are the scalar twin's (separate multiply and add, no
// FMA), so the outputs are the scalar twin's bits, whatever the batch.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "quant/kernel_registry.h"

namespace lamina::quant_internal {
namespace {

constexpr int kSlab = 4;  // super-blocks unpacked at a time
// Tokens per register tile: an int32 sum per token besides a run's codes (Q4_K / Q5_K: 4 chunks,
// Q6_K: 2), the scale and two temporaries.
constexpr int kTileQ45K = 8;
constexpr int kTileQ6K = 10;
constexpr int kTileIQ4XS = 8;  // a sum per token, a chunk's magnitudes and levels, the scale

#include "quant/interleaved_kquants_avx2_common.inc"

inline __m256i LoadA(const void* p) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
}
inline void StoreA(void* p, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }

// One Q4_K or Q5_K super-block of the group, unpacked.
struct alignas(32) WideQ45K {
  uint8_t codes[2][64][32];  // [half][8 * group j + chunk c][8 rows x 4 codes]: 32j + 4c + 0..3
  int32_t scale[2][8][8];    // [half][group j][row]: the 6-bit scale in both words
  int32_t min[2][8][8];      // [half][group j][row]: the 6-bit min in both words
  float d[16], dmin[16];     // [row]
};
// One Q6_K super-block of the group, unpacked.
struct alignas(32) WideQ6K {
  uint8_t codes[2][64][32];  // [half][4 * group g + chunk c][8 rows x 4 codes]: 16g + 4c + 0..3
  int32_t scale[2][16][8];   // [half][group g][row]: the signed scale in both words
  int32_t pair[2][8][8];     // [half][pair p][row]: scales 2p (low word) and 2p + 1 (high word)
  float d[16];               // [row]
};
// One IQ4_XS super-block of the group, unpacked.
struct alignas(32) WideIQ4XS {
  uint8_t mag[2][64][32];  // [half][8 * group j + chunk c][8 rows x 4 |levels|]: 32j + 4c + 0..3
  int8_t lvl[2][64][32];   // [half][8 * group j + chunk c][8 rows x 4 levels], the same values
  int32_t scale[2][8][8];  // [half][group j][row]: ls - 32 in both words
  float d[16];             // [row]
};
template <class Block>
using Wide = std::conditional_t<
    std::is_same_v<Block, BlockQ6_Kx16>, WideQ6K,
    std::conditional_t<std::is_same_v<Block, BlockIQ4_XSx16>, WideIQ4XS, WideQ45K>>;
template <class Block>
constexpr int kTile = std::is_same_v<Block, BlockQ6_Kx16>     ? kTileQ6K
                      : std::is_same_v<Block, BlockIQ4_XSx16> ? kTileIQ4XS
                                                              : kTileQ45K;

template <class Block>
void Unpack(const Block& w, WideQ45K* u) {
  const __m256i byte = _mm256_set1_epi32(0xFF);
  const __m256i nib = _mm256_set1_epi8(0x0F);
  for (int h = 0; h < 2; ++h) {
    __m256i sc[2], mn[2];  // lane r: row 8h + r's scales / mins, a byte per group
    ScalesMinsQ45K(w, h, sc, mn);
    for (int j = 0; j < 8; ++j) {
      StoreA(u->scale[h][j],
             DupWord(_mm256_and_si256(_mm256_srli_epi32(sc[j / 4], 8 * (j % 4)), byte)));
      StoreA(u->min[h][j],
             DupWord(_mm256_and_si256(_mm256_srli_epi32(mn[j / 4], 8 * (j % 4)), byte)));
      for (int c = 0; c < 8; ++c) {
        const __m256i v = Load(w.qs + 64 * (8 * (j / 2) + c) + 32 * h);
        __m256i q = _mm256_and_si256(j % 2 == 0 ? v : _mm256_srli_epi16(v, 4), nib);
        if constexpr (std::is_same_v<Block, BlockQ5_Kx16>) {
          // The fifth bit: bit j of each qh byte moved to bit 4.
          const __m256i hb = Load(w.qh + 64 * c + 32 * h);
          const __m256i s = j <= 4 ? _mm256_slli_epi16(hb, 4 - j) : _mm256_srli_epi16(hb, j - 4);
          q = _mm256_or_si256(q, _mm256_and_si256(s, _mm256_set1_epi8(0x10)));
        }
        StoreA(u->codes[h][8 * j + c], q);
      }
    }
  }
  _mm256_store_ps(u->d, LoadHalves(w.d));
  _mm256_store_ps(u->d + 8, LoadHalves(w.d + 8));
  _mm256_store_ps(u->dmin, LoadHalves(w.dmin));
  _mm256_store_ps(u->dmin + 8, LoadHalves(w.dmin + 8));
}

void Unpack(const BlockQ6_Kx16& w, WideQ6K* u) {
  const __m256i low = _mm256_set1_epi8(0x0F), high = _mm256_set1_epi8(0x30);
  for (int h = 0; h < 2; ++h) {
    for (int g = 0; g < 16; ++g) {
      const __m256i s = _mm256_cvtepi8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.scales + 16 * g + 8 * h)));
      StoreA(u->scale[h][g], DupWord(s));
      if (g % 2 == 0) {
        const __m256i s1 = _mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.scales + 16 * (g + 1) + 8 * h)));
        StoreA(u->pair[h][g / 2], _mm256_or_si256(_mm256_and_si256(s, _mm256_set1_epi32(0xFFFF)),
                                                  _mm256_slli_epi32(s1, 16)));
      }
      // Group g = 8n + 2m + hh: ql chunk 16n + 8(m % 2) + 4hh + c, qh chunk 8n + 4hh + c; the
      // low nibble (m < 2) or high one, and qh bits 2m, 2m + 1 moved to bits 4, 5.
      const int n = g / 8, m = (g % 8) / 2, hh = g % 2;
      for (int c = 0; c < 4; ++c) {
        const __m256i l = Load(w.ql + 64 * (16 * n + 8 * (m % 2) + 4 * hh + c) + 32 * h);
        const __m256i hb = Load(w.qh + 64 * (8 * n + 4 * hh + c) + 32 * h);
        const __m256i lo = _mm256_and_si256(m < 2 ? l : _mm256_srli_epi16(l, 4), low);
        const __m256i hs = m == 0   ? _mm256_slli_epi16(hb, 4)
                           : m == 1 ? _mm256_slli_epi16(hb, 2)
                           : m == 2 ? hb
                                    : _mm256_srli_epi16(hb, 2);
        StoreA(u->codes[h][4 * g + c], _mm256_or_si256(lo, _mm256_and_si256(hs, high)));
      }
    }
  }
  _mm256_store_ps(u->d, LoadHalves(w.d));
  _mm256_store_ps(u->d + 8, LoadHalves(w.d + 8));
}

// IQ4_XS: group j's chunk c holds elements 32j + 4c .. + 3, the low nibbles of qs chunk 4j + c
// for c < 4, the high ones of chunk 4j + c - 4 after (HalfStepIQ4XS's pairing).
void Unpack(const BlockIQ4_XSx16& w, WideIQ4XS* u) {
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlLevels)));
  const __m256i nib = _mm256_set1_epi8(0x0F);
  for (int h = 0; h < 2; ++h) {
    const __m256i lo4 = Load(w.scales_l + 32 * h);
    const __m256i hi2 = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales_h + 8 * h)));
    for (int j = 0; j < 8; ++j) {
      const __m256i ls = _mm256_or_si256(
          _mm256_and_si256(_mm256_srli_epi32(lo4, 4 * j), _mm256_set1_epi32(0xF)),
          _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hi2, 2 * j), _mm256_set1_epi32(3)),
                            4));
      StoreA(u->scale[h][j], DupWord(_mm256_sub_epi32(ls, _mm256_set1_epi32(32))));
      for (int c = 0; c < 4; ++c) {
        const __m256i v = Load(w.qs + 64 * (4 * j + c) + 32 * h);
        const __m256i ll = _mm256_shuffle_epi8(table, _mm256_and_si256(v, nib));
        const __m256i lh =
            _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
        StoreA(u->lvl[h][8 * j + c], ll);
        StoreA(u->mag[h][8 * j + c], _mm256_abs_epi8(ll));
        StoreA(u->lvl[h][8 * j + 4 + c], lh);
        StoreA(u->mag[h][8 * j + 4 + c], _mm256_abs_epi8(lh));
      }
    }
  }
  _mm256_store_ps(u->d, LoadHalves(w.d));
  _mm256_store_ps(u->d + 8, LoadHalves(w.d + 8));
}

// acc[t] (8 floats in memory) += float(sumi[t]) * (d_w * d_a[t]), or -= for kSub.
template <int N, bool kSub>
inline void AddScaledTo(const float* dw, const __m256i* sumi, const BlockQ8_K* const* a, int64_t i,
                        float* const* acc) {
  const __m256 d = _mm256_load_ps(dw);
#pragma GCC unroll 12
  for (int t = 0; t < N; ++t) {
    const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(a[t][i].d));
    const __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi[t]), scale);
    const __m256 v = _mm256_load_ps(acc[t]);
    _mm256_store_ps(acc[t], kSub ? _mm256_sub_ps(v, x) : _mm256_add_ps(v, x));
  }
}

// Super-block i (unpacked in u), rows [8h, 8h + 8), against N tokens: Q4_K / Q5_K. Each run of
// 4 chunks (16 values of one group) is held in registers while every token adds its 4 pair sums
// as words and one madd by the group's scale.
template <class Block, int N>
inline void WideStep(const WideQ45K& u, int h, const BlockQ8_K* const* a, int64_t i,
                     float* const* acc) {
  __m256i sumi[N];
#pragma GCC unroll 12
  for (int t = 0; t < N; ++t) sumi[t] = _mm256_setzero_si256();
#pragma GCC unroll 1
  for (int r = 0; r < 16; ++r) {  // run r: group r / 2, chunks 4 (r % 2) .. + 3
    const __m256i s = LoadA(u.scale[h][r / 2]);
    const __m256i q0 = LoadA(u.codes[h][4 * r]), q1 = LoadA(u.codes[h][4 * r + 1]),
                  q2 = LoadA(u.codes[h][4 * r + 2]), q3 = LoadA(u.codes[h][4 * r + 3]);
#pragma GCC unroll 12
    for (int t = 0; t < N; ++t) {
      const int8_t* qa = a[t][i].qs + 16 * r;
      const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(q0, Broadcast4(qa)),
                                           _mm256_maddubs_epi16(q1, Broadcast4(qa + 4)));
      const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(q2, Broadcast4(qa + 8)),
                                           _mm256_maddubs_epi16(q3, Broadcast4(qa + 12)));
      sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(_mm256_add_epi16(p01, p23), s));
    }
  }
  AddScaledTo<N, false>(u.d + 8 * h, sumi, a, i, acc);
  // summ = sum_j mn_j * (bsums[2j] + bsums[2j + 1]): the min in both words of the lane.
#pragma GCC unroll 12
  for (int t = 0; t < N; ++t) sumi[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    const __m256i m = LoadA(u.min[h][j]);
#pragma GCC unroll 12
    for (int t = 0; t < N; ++t) {
      sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(m, Broadcast4(a[t][i].bsums + 2 * j)));
    }
  }
  AddScaledTo<N, true>(u.dmin + 8 * h, sumi, a, i, acc);
}

// Q6_K: sumi = sum_g sc_g * dot_g - 32 * sum_g sc_g * bsums[g].
template <class Block, int N>
inline void WideStep(const WideQ6K& u, int h, const BlockQ8_K* const* a, int64_t i,
                     float* const* acc) {
  __m256i sumi[N];
#pragma GCC unroll 12
  for (int t = 0; t < N; ++t) sumi[t] = _mm256_setzero_si256();
#pragma GCC unroll 1
  for (int g = 0; g < 16; ++g) {
    const __m256i s = LoadA(u.scale[h][g]);
#pragma GCC unroll 2
    for (int c = 0; c < 4; c += 2) {
      const __m256i q0 = LoadA(u.codes[h][4 * g + c]), q1 = LoadA(u.codes[h][4 * g + c + 1]);
#pragma GCC unroll 12
      for (int t = 0; t < N; ++t) {
        const int8_t* qa = a[t][i].qs + 16 * g + 4 * c;
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(q0, Broadcast4(qa)),
                                           _mm256_maddubs_epi16(q1, Broadcast4(qa + 4)));
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, s));
      }
    }
  }
#pragma GCC unroll 12
  for (int t = 0; t < N; ++t) {
    __m256i corr = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) {
      corr = _mm256_add_epi32(
          corr, _mm256_madd_epi16(LoadA(u.pair[h][p]), Broadcast4(a[t][i].bsums + 2 * p)));
    }
    sumi[t] = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(corr, 5));
  }
  AddScaledTo<N, false>(u.d + 8 * h, sumi, a, i, acc);
}

// IQ4_XS: sumi = sum_j (ls_j - 32) * dot_j, one maddubs (the levels' magnitudes against the
// token's codes with the levels' signs, pairs at most 2 * 127 * 127) and one madd by the scale per
// chunk, as HalfStepIQ4XS.
template <class Block, int N>
inline void WideStep(const WideIQ4XS& u, int h, const BlockQ8_K* const* a, int64_t i,
                     float* const* acc) {
  __m256i sumi[N];
#pragma GCC unroll 12
  for (int t = 0; t < N; ++t) sumi[t] = _mm256_setzero_si256();
#pragma GCC unroll 1
  for (int j = 0; j < 8; ++j) {
    const __m256i s = LoadA(u.scale[h][j]);
#pragma GCC unroll 1
    for (int c = 0; c < 8; ++c) {
      const __m256i m = LoadA(u.mag[h][8 * j + c]), l = LoadA(u.lvl[h][8 * j + c]);
#pragma GCC unroll 12
      for (int t = 0; t < N; ++t) {
        const __m256i q = _mm256_sign_epi8(Broadcast4(a[t][i].qs + 32 * j + 4 * c), l);
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(m, q), s));
      }
    }
  }
  AddScaledTo<N, false>(u.d + 8 * h, sumi, a, i, acc);
}

// Super-blocks [i0, i0 + ns) (unpacked in u) against the N tokens at act, both halves.
template <class Block, int N>
void WideTile(const Wide<Block>* u, int ns, int64_t i0, const char* act, size_t act_row_bytes,
              float (*acc)[16]) {
  const BlockQ8_K* a[N];
  float* acc_h[2][N];  // [half][token]
  for (int t = 0; t < N; ++t) {
    a[t] = reinterpret_cast<const BlockQ8_K*>(act + t * act_row_bytes);
    acc_h[0][t] = acc[t];
    acc_h[1][t] = acc[t] + 8;
  }
  for (int h = 0; h < 2; ++h) {
    for (int s = 0; s < ns; ++s) WideStep<Block, N>(u[s], h, a, i0 + s, acc_h[h]);
  }
}

// WideTile for nt (1..N) tokens.
template <class Block, int N>
inline void TileOf(int nt, const Wide<Block>* u, int ns, int64_t i0, const char* act,
                   size_t act_row_bytes, float (*acc)[16]) {
  if constexpr (N > 1) {
    if (nt < N) return TileOf<Block, N - 1>(nt, u, ns, i0, act, act_row_bytes, acc);
  }
  WideTile<Block, N>(u, ns, i0, act, act_row_bytes, acc);
}

template <class Block>
void GemmWide(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
              float* out, size_t out_stride) {
  constexpr int kN = kTile<Block>;
  const auto* w = static_cast<const Block*>(group);
  const char* a0 = static_cast<const char*>(act);
  const int64_t nb = k / kQK_K;
  Wide<Block> u[kSlab];                            // [super-block of the slab]
  alignas(32) float acc[kMaxGemmTokens][16] = {};  // [token][row]
  const int n_tiles = (n_act + kN - 1) / kN;
  for (int64_t i0 = 0; i0 < nb; i0 += kSlab) {
    const int ns = static_cast<int>(std::min<int64_t>(kSlab, nb - i0));
    for (int s = 0; s < ns; ++s) Unpack(w[i0 + s], &u[s]);
    for (int tt = 0; tt < n_tiles; ++tt) {
      const int t0 = tt * n_act / n_tiles, nt = (tt + 1) * n_act / n_tiles - t0;
      const char* a = a0 + t0 * act_row_bytes;
      TileOf<Block, kN>(nt, u, ns, i0, a, act_row_bytes, acc + t0);
    }
  }
  for (int t = 0; t < n_act; ++t) {
    _mm256_storeu_ps(out + t * out_stride, _mm256_load_ps(acc[t]));
    _mm256_storeu_ps(out + t * out_stride + 8, _mm256_load_ps(acc[t] + 8));
  }
}

}  // namespace

void GemmWideAvx2Q4K(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
                     float* out, size_t out_stride) {
  GemmWide<BlockQ4_Kx16>(k, group, act, act_row_bytes, n_act, out, out_stride);
}
void GemmWideAvx2Q5K(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
                     float* out, size_t out_stride) {
  GemmWide<BlockQ5_Kx16>(k, group, act, act_row_bytes, n_act, out, out_stride);
}
void GemmWideAvx2Q6K(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
                     float* out, size_t out_stride) {
  GemmWide<BlockQ6_Kx16>(k, group, act, act_row_bytes, n_act, out, out_stride);
}
void GemmWideAvx2IQ4XS(int64_t k, const void* group, const void* act, size_t act_row_bytes,
                       int n_act, float* out, size_t out_stride) {
  GemmWide<BlockIQ4_XSx16>(k, group, act, act_row_bytes, n_act, out, out_stride);
}

}  // namespace lamina::quant_internal
