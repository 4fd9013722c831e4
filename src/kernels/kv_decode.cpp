// Scalar KV row decoders and scorers, query quantization, and runtime selection.
#include "kernels/kv_decode.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/kv_encode.h"
#include "util/cpu_features.h"

namespace lamina {

namespace {
constexpr int kScoreGroup = 32;  // values per scale in int8 / q4_0 rows with head_dim >= 32

template <KvRowFormat F>
void DecodeScalar(const uint8_t* rows, int n_rows, int head_dim, float* out) {
  const size_t row_bytes = KvRowBytes(F, head_dim);
  for (int r = 0; r < n_rows; ++r) {
    DecodeKvRow(F, rows + r * row_bytes, head_dim, out + static_cast<int64_t>(r) * head_dim);
  }
}

// Signed code of element i (< 32) of one group.
template <KvRowFormat F>
inline int GroupCode(const uint8_t* codes, int i) {
  if constexpr (F == KvRowFormat::kInt8) {
    return static_cast<int8_t>(codes[i]);
  } else {
    return i < 16 ? (codes[i] & 0x0F) - 8 : (codes[i - 16] >> 4) - 8;
  }
}

template <KvRowFormat F>
void ScoreScalar(const uint8_t* rows, int n_rows, int head_dim, int nq, const int16_t* qq,
                 const float* qd, float scale, float* out, int64_t out_stride) {
  const size_t row_bytes = KvRowBytes(F, head_dim);
  const int n_groups = head_dim / kScoreGroup;
  const size_t group_bytes = row_bytes / n_groups;
  for (int qi = 0; qi < nq; ++qi) {
    const int16_t* qv = qq + static_cast<int64_t>(qi) * head_dim;
    const float* qs = qd + static_cast<int64_t>(qi) * n_groups;
    for (int j = 0; j < n_rows; ++j) {
      const uint8_t* row = rows + j * row_bytes;
      float s = 0.0f;
      for (int g = 0; g < n_groups; ++g) {
        const uint8_t* grp = row + g * group_bytes;
        fp16_t d16;
        std::memcpy(&d16, grp, 2);
        const int16_t* qg = qv + g * kScoreGroup;
        int32_t dot = 0;
        for (int k = 0; k < 2; ++k) {  // runs of 16 values, evens then odds
          for (int m = 0; m < 8; ++m) {
            dot += GroupCode<F>(grp + 2, 16 * k + 2 * m) * qg[16 * k + m];
            dot += GroupCode<F>(grp + 2, 16 * k + 2 * m + 1) * qg[16 * k + 8 + m];
          }
        }
        s = std::fma(static_cast<float>(dot), Fp16ToF32(d16) * qs[g], s);
      }
      out[qi * out_stride + j] = s * scale;
    }
  }
}

// The tiled twin of ScoreScalar<F> (int8 or q4_0 tiles): the same group dots (exact int32) and
// the same float steps in the same order, reading each cell's scale and codes from its tile slot.
template <KvRowFormat F>
void ScoreTilesScalar(const uint8_t* tiles, int first, int n_cells, int head_dim, int nq,
                      const int16_t* qq, const float* qd, float scale, float* out,
                      int64_t out_stride) {
  constexpr int kCodeBytes = F == KvRowFormat::kInt8 ? kScoreGroup : kScoreGroup / 2;
  const int n_groups = head_dim / kScoreGroup;
  const size_t tile_group = static_cast<size_t>(kKvTileCells) * (2 + kCodeBytes);
  const size_t tile_bytes = tile_group * n_groups;
  for (int qi = 0; qi < nq; ++qi) {
    const int16_t* qv = qq + static_cast<int64_t>(qi) * head_dim;
    const float* qs = qd + static_cast<int64_t>(qi) * n_groups;
    for (int j = 0; j < n_cells; ++j) {
      const int c = first + j, cell = c % kKvTileCells;
      const uint8_t* tile = tiles + (c / kKvTileCells) * tile_bytes;
      float s = 0.0f;
      for (int g = 0; g < n_groups; ++g) {
        const uint8_t* grp = tile + g * tile_group;
        fp16_t d16;
        std::memcpy(&d16, grp + 2 * cell, 2);
        const uint8_t* codes = grp + 2 * kKvTileCells + 4 * cell;  // chunk t at 64 t
        const int16_t* qg = qv + g * kScoreGroup;
        int32_t dot = 0;
        for (int i = 0; i < kScoreGroup; ++i) {
          int code;
          if constexpr (F == KvRowFormat::kInt8) {
            code = static_cast<int8_t>(codes[64 * (i / 4) + i % 4]);
          } else {  // dim i < 16: the low nibble of code byte i, else the high one of i - 16
            const int b = i % 16;
            const int byte = codes[64 * (b / 4) + b % 4];
            code = (i < 16 ? byte & 0x0F : byte >> 4) - 8;
          }
          const int r = i % 16;  // query codes: each run of 16 evens first, then odds
          dot += code * qg[16 * (i / 16) + (r % 2) * 8 + r / 2];
        }
        s = std::fma(static_cast<float>(dot), Fp16ToF32(d16) * qs[g], s);
      }
      out[qi * out_stride + j] = s * scale;
    }
  }
}

template <KvRowFormat F>
void AccumulateScalar(const uint8_t* rows, int n_rows, int head_dim, int nq, const float* p,
                      int64_t p_stride, const int* lim, float* acc) {
  const size_t row_bytes = KvRowBytes(F, head_dim);
  std::vector<float> x(head_dim);  // [head_dim] one decoded row
  for (int j = 0; j < n_rows; ++j) {
    DecodeKvRow(F, rows + j * row_bytes, head_dim, x.data());
    for (int qi = 0; qi < nq; ++qi) {
      if (j >= lim[qi]) continue;
      const float w = p[qi * p_stride + j];
      float* a = acc + static_cast<int64_t>(qi) * head_dim;
      for (int i = 0; i < head_dim; ++i) a[i] += w * x[i];
    }
  }
}

// Signed level of element i (< 32) of one group (int8: the code; q4_0: nibble - 8; q4_nl: its
// level).
template <KvRowFormat F>
inline int GroupLevel(const uint8_t* codes, int i) {
  if constexpr (F == KvRowFormat::kInt8) return static_cast<int8_t>(codes[i]);
  const int nibble = i < 16 ? (codes[i] & 0x0F) : (codes[i - 16] >> 4);
  if constexpr (F == KvRowFormat::kQ4Nl) {
    return kQ4NlLevels[nibble];
  } else {
    return nibble - 8;
  }
}

// The integer V sums (kv_decode.h), written out: exact int32 dots, then one fma per column.
template <KvRowFormat F, int kWmax>
void IntAccumulateScalar(const uint8_t* rows, int n_rows, int head_dim, int nq, const float* p,
                         int64_t p_stride, const int* lim, float* acc) {
  if (head_dim % kScoreGroup != 0) {
    AccumulateScalar<F>(rows, n_rows, head_dim, nq, p, p_stride, lim, acc);
    return;
  }
  const size_t row_bytes = KvRowBytes(F, head_dim);
  const int n_groups = head_dim / kScoreGroup;
  const size_t group_bytes = row_bytes / n_groups;
  const float wmax = static_cast<float>(kWmax);
  float w[kIntAccRows];    // [rows of the pass] one query's weights in one group
  int32_t c[kIntAccRows];  // [rows of the pass] their codes, signed by the row's scale
  for (int j0 = 0; j0 < n_rows; j0 += kIntAccRows) {
    const int nr = std::min(kIntAccRows, n_rows - j0);
    for (int qi = 0; qi < nq; ++qi) {
      const int m = std::clamp(lim[qi] - j0, 0, nr);
      const float* pq = p + qi * p_stride + j0;
      float* a = acc + static_cast<int64_t>(qi) * head_dim;
      if (m == 0) continue;
      for (int g = 0; g < n_groups; ++g) {
        const uint8_t* grp0 = rows + j0 * row_bytes + g * group_bytes;
        float amax = 0.0f;
        bool finite = true;
        for (int j = 0; j < m; ++j) {
          fp16_t d16;
          std::memcpy(&d16, grp0 + j * row_bytes, 2);
          const float pj = pq[j] < 0.0f ? 0.0f : pq[j];  // a negative weight is 0; NaN stays
          w[j] = pj * std::fabs(Fp16ToF32(d16));
          amax = std::max(amax, w[j]);
          finite &= std::fabs(w[j]) <= std::numeric_limits<float>::max();
        }
        float* ag = a + g * kScoreGroup;
        if (!finite) {
          std::fill(ag, ag + kScoreGroup, std::numeric_limits<float>::quiet_NaN());
          continue;
        }
        if (!(amax >= 1e-30f)) continue;
        const float inv = wmax / amax, step = amax / wmax;
        for (int j = 0; j < m; ++j) {
          fp16_t d16;
          std::memcpy(&d16, grp0 + j * row_bytes, 2);
          const float q = std::clamp(std::nearbyint(w[j] * inv), 0.0f, wmax);
          c[j] = static_cast<int32_t>(q) * (std::signbit(Fp16ToF32(d16)) ? -1 : 1);
        }
        for (int i = 0; i < kScoreGroup; ++i) {
          int32_t v = 0;
          for (int j = 0; j < m; ++j) v += c[j] * GroupLevel<F>(grp0 + j * row_bytes + 2, i);
          ag[i] = std::fma(static_cast<float>(v), step, ag[i]);
        }
      }
    }
  }
}

void ScoreF16TilesScalar(const uint8_t* tiles, int first, int n_cells, int head_dim, int nq,
                         const float* q, float scale, float* out, int64_t out_stride) {
  const size_t tile_bytes = KvRowBytes(KvRowFormat::kF16, head_dim) * kKvTileCells;
  for (int qi = 0; qi < nq; ++qi) {
    const float* qv = q + static_cast<int64_t>(qi) * head_dim;
    for (int j = 0; j < n_cells; ++j) {
      const int c = first + j, cell = c % kKvTileCells;
      const uint8_t* tile = tiles + (c / kKvTileCells) * tile_bytes;  // [head_dim][16] halves
      float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};                          // [chain] the four chains
      for (int i = 0; i < head_dim; ++i) {
        fp16_t k16;
        std::memcpy(&k16, tile + 2 * (static_cast<size_t>(i) * kKvTileCells + cell), 2);
        s[i % 4] = std::fma(qv[i], Fp16ToF32(k16), s[i % 4]);
      }
      out[qi * out_stride + j] = ((s[0] + s[2]) + (s[1] + s[3])) * scale;
    }
  }
}

void AnchorScoresScalar(const float* w, int64_t w_tile_stride, int n_terms, const float* tables,
                        const float* rest, const uint8_t* flags, int n_cells, int nq,
                        const int* lim, float scale, float* scores, int64_t score_stride) {
  for (int qi = 0; qi < nq; ++qi) {
    float* srow = scores + qi * score_stride;
    const int n = std::min(lim[qi], n_cells);
    for (int c = 0; c < n; ++c) {
      if (flags[c] == 0) continue;  // unflagged: untouched (kv_decode.h)
      const int k = c % kAnchorTileCells;
      const float* wt = w + c / kAnchorTileCells * w_tile_stride;  // [n_terms][nq] its tile's
      float sum = rest[qi];
      for (int t = 0; t < n_terms; ++t)
        sum =
            std::fma(wt[static_cast<int64_t>(t) * nq + qi], tables[t * kAnchorTileCells + k], sum);
      const float f = scale * static_cast<float>(flags[c]);
      srow[c] = std::fma(f, sum, srow[c]);
    }
  }
}

}  // namespace

KvRowDecodeFn ScalarKvRowDecoder(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kF32:
      return DecodeScalar<KvRowFormat::kF32>;
    case KvRowFormat::kF16:
      return DecodeScalar<KvRowFormat::kF16>;
    case KvRowFormat::kInt8:
      return DecodeScalar<KvRowFormat::kInt8>;
    case KvRowFormat::kQ4_0:
      return DecodeScalar<KvRowFormat::kQ4_0>;
    case KvRowFormat::kQ4Nl:
      return DecodeScalar<KvRowFormat::kQ4Nl>;
  }
  return nullptr;
}

namespace {
constexpr int kRowFormats = static_cast<int>(KvRowFormat::kQ4Nl) + 1;

// One function per row format, chosen on first use and kept: choosing asks Highway which
// targets the CPU supports (CPUID, which traps to the hypervisor on a VM), far too slow to
// repeat per attention call.
template <typename Fn>
using PerFormat = std::array<Fn, kRowFormats>;

template <typename Fn, typename Choose>
PerFormat<Fn> ChooseEach(Choose choose) {
  PerFormat<Fn> table{};
  for (int i = 0; i < kRowFormats; ++i) table[i] = choose(static_cast<KvRowFormat>(i));
  return table;
}

KvRowDecodeFn ChooseKvRowDecoder(KvRowFormat format) {
  if (HasAvx512()) {
    if (KvRowDecodeFn f = Avx512KvRowDecoder(format)) return f;
  }
  if (HasAvx2()) {
    if (KvRowDecodeFn f = Avx2KvRowDecoder(format)) return f;
  }
  return ScalarKvRowDecoder(format);
}
}  // namespace

KvRowDecodeFn BestKvRowDecoder(KvRowFormat format) {
  static const PerFormat<KvRowDecodeFn> best = ChooseEach<KvRowDecodeFn>(ChooseKvRowDecoder);
  return best[static_cast<int>(format)];
}

KvAccumulateFn ScalarKvAccumulator(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kF32:
      return AccumulateScalar<KvRowFormat::kF32>;
    case KvRowFormat::kF16:
      return AccumulateScalar<KvRowFormat::kF16>;
    case KvRowFormat::kInt8:
      return AccumulateScalar<KvRowFormat::kInt8>;
    case KvRowFormat::kQ4_0:
      return AccumulateScalar<KvRowFormat::kQ4_0>;
    case KvRowFormat::kQ4Nl:
      return AccumulateScalar<KvRowFormat::kQ4Nl>;
  }
  return nullptr;
}

KvAccumulateFn ScalarKvInt16Accumulator(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kInt8:
      return IntAccumulateScalar<KvRowFormat::kInt8, kInt16AccWeightMax>;
    case KvRowFormat::kQ4_0:
      return IntAccumulateScalar<KvRowFormat::kQ4_0, kInt16AccWeightMax>;
    case KvRowFormat::kQ4Nl:
      return IntAccumulateScalar<KvRowFormat::kQ4Nl, kInt16AccWeightMax>;
    default:
      return nullptr;
  }
}

KvAccumulateFn BestKvAccumulator(KvRowFormat format) {
  static const PerFormat<KvAccumulateFn> best =
      ChooseEach<KvAccumulateFn>([](KvRowFormat f) -> KvAccumulateFn {
        if (HasAvx512()) {
          // int8 and 4-bit rows: integer V sums in int16 pairs (kv_decode.h); docs/PERFORMANCE.md.
          if (KvAccumulateFn i16 = Avx512KvInt16Accumulator(f)) return i16;
          return Avx512KvAccumulator(f);
        }
        return HasAvx2() ? Avx2KvAccumulator(f) : nullptr;
      });
  return best[static_cast<int>(format)];
}

bool KvIntScoreSupported(KvRowFormat format, int head_dim) {
  return (format == KvRowFormat::kInt8 || format == KvRowFormat::kQ4_0) && head_dim > 0 &&
         head_dim % kScoreGroup == 0;
}

// int8 codes for both K formats: GGML's q8_0 query, and what vpdpbusd multiplies.
int KvQueryCodeMax(KvRowFormat /*format*/) { return 127; }

void QuantizeQueryInt16(KvRowFormat format, const float* q, int head_dim, int16_t* qq, float* qd) {
  const float code_max = static_cast<float>(KvQueryCodeMax(format));
  for (int g = 0; g < head_dim / kScoreGroup; ++g) {
    const float* x = q + g * kScoreGroup;
    const float amax = KvAbsMax(x, kScoreGroup);
    const float d = amax / code_max;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    bool finite = true;  // a NaN or infinite query (a model gone non-finite) scores NaN
    for (int i = 0; i < kScoreGroup; ++i) {
      const int k = i / 16, m = (i % 16) / 2;
      const int slot = 16 * k + (i % 2) * 8 + m;
      // nearbyint's code: equal for |v| < 2^22, and beyond that both clamp to the same one.
      float c = std::clamp(KvRoundHalfEven(x[i] * id), -code_max, code_max);
      if (std::isnan(c)) {  // casting NaN to int16 is undefined
        c = 0.0f;
        finite = false;
      }
      qq[g * kScoreGroup + slot] = static_cast<int16_t>(c);
    }
    qd[g] = finite ? d : std::numeric_limits<float>::quiet_NaN();
  }
}

KvScoreFn ScalarKvScorer(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kInt8:
      return ScoreScalar<KvRowFormat::kInt8>;
    case KvRowFormat::kQ4_0:
      return ScoreScalar<KvRowFormat::kQ4_0>;
    default:
      return nullptr;
  }
}

KvF16TileScoreFn ScalarKvF16TileScorer() { return ScoreF16TilesScalar; }

KvF16TileScoreFn BestKvF16TileScorer() {
  static const KvF16TileScoreFn best = [] {
    KvF16TileScoreFn f = nullptr;
    if (HasAvx512()) f = Avx512KvF16TileScorer();
    if (f == nullptr && HasAvx2()) f = Avx2KvF16TileScorer();
    return f != nullptr ? f : ScoreF16TilesScalar;
  }();
  return best;
}

KvAnchorScoreFn ScalarKvAnchorScorer() { return AnchorScoresScalar; }

KvAnchorScoreFn BestKvAnchorScorer() {
  static const KvAnchorScoreFn best = [] {
    KvAnchorScoreFn f = nullptr;
    if (HasAvx512()) f = Avx512KvAnchorScorer();
    if (f == nullptr && HasAvx2()) f = Avx2KvAnchorScorer();
    return f != nullptr ? f : AnchorScoresScalar;
  }();
  return best;
}

KvTileScoreFn ScalarKvTileScorer(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kInt8:
      return ScoreTilesScalar<KvRowFormat::kInt8>;
    case KvRowFormat::kQ4_0:
      return ScoreTilesScalar<KvRowFormat::kQ4_0>;
    default:
      return nullptr;
  }
}

KvTileScoreFn BestKvTileScorer(KvRowFormat format) {
  static const PerFormat<KvTileScoreFn> best =
      ChooseEach<KvTileScoreFn>([](KvRowFormat f) -> KvTileScoreFn {
        KvTileScoreFn fn = nullptr;
        if (HasAvx512()) fn = Avx512KvTileScorer(f);
        if (fn == nullptr && HasAvx2()) fn = Avx2KvTileScorer(f);
        return fn;
      });
  return best[static_cast<int>(format)];
}

KvScoreFn BestKvScorer(KvRowFormat format) {
  static const PerFormat<KvScoreFn> best = ChooseEach<KvScoreFn>([](KvRowFormat f) -> KvScoreFn {
    if (HasAvx512()) return Avx512KvScorer(f);
    return HasAvx2() ? Avx2KvScorer(f) : nullptr;
  });
  return best[static_cast<int>(format)];
}

}  // namespace lamina
