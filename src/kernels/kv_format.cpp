// KV head-row codecs and the Hadamard rotation (the scale search and the butterflies run as
// kv_encode.h kernels; the attention kernels decode tiles through DecodeKvRow).
#include "kernels/kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/kv_encode.h"
#include "quant/quant.h"
#include "util/check.h"

namespace lamina {

int KvGroupSize(int head_dim) { return std::min(32, head_dim); }

size_t KvRowBytes(KvRowFormat format, int head_dim) {
  switch (format) {
    case KvRowFormat::kF32:
      return 4u * head_dim;
    case KvRowFormat::kF16:
      return 2u * head_dim;
    case KvRowFormat::kInt8:
    case KvRowFormat::kQ4_0:
    case KvRowFormat::kQ4Nl: {
      const int g = KvGroupSize(head_dim);
      if (g % 2 != 0 || head_dim % g != 0) return 0;
      const size_t per_group = format == KvRowFormat::kInt8 ? 2 + g : 2 + g / 2;
      return per_group * (head_dim / g);
    }
  }
  return 0;
}

namespace {
// Code bytes per group of a tiled format's rows: g (int8) or g / 2 (q4_0 nibbles).
inline int TileGroupCodeBytes(KvRowFormat format, int g) {
  LAMINA_CHECK(format == KvRowFormat::kInt8 || format == KvRowFormat::kQ4_0);
  return format == KvRowFormat::kInt8 ? g : g / 2;
}

// Byte offset, within a tile's group of b code bytes per cell, of cell `cell`'s code byte i (< b).
inline size_t TileCodeOffset(int b, int cell, int i) {
  const int t = i / 4, w = std::min(4, b - 4 * t);
  return 2 * kKvTileCells + static_cast<size_t>(kKvTileCells) * 4 * t + cell * w + (i - 4 * t);
}
}  // namespace

void TileKvRow(const uint8_t* row, int head_dim, uint8_t* tile, int cell, KvRowFormat format) {
  if (format == KvRowFormat::kF16) {  // dim i of the cell: half i * kKvTileCells + cell
    for (int i = 0; i < head_dim; ++i) {
      std::memcpy(tile + 2 * (static_cast<size_t>(i) * kKvTileCells + cell), row + 2 * i, 2);
    }
    return;
  }
  const int g = KvGroupSize(head_dim), b = TileGroupCodeBytes(format, g);
  const size_t tile_group = static_cast<size_t>(kKvTileCells) * (2 + b);
  for (int k = 0; k < head_dim / g; ++k) {
    const uint8_t* src = row + k * (2 + b);  // { fp16 d; b code bytes }
    uint8_t* dst = tile + k * tile_group;
    std::memcpy(dst + 2 * cell, src, 2);
    for (int i = 0; i < b; ++i) dst[TileCodeOffset(b, cell, i)] = src[2 + i];
  }
}

void UntileKvRow(const uint8_t* tile, int cell, int head_dim, uint8_t* row, KvRowFormat format) {
  if (format == KvRowFormat::kF16) {
    for (int i = 0; i < head_dim; ++i) {
      std::memcpy(row + 2 * i, tile + 2 * (static_cast<size_t>(i) * kKvTileCells + cell), 2);
    }
    return;
  }
  const int g = KvGroupSize(head_dim), b = TileGroupCodeBytes(format, g);
  const size_t tile_group = static_cast<size_t>(kKvTileCells) * (2 + b);
  for (int k = 0; k < head_dim / g; ++k) {
    const uint8_t* src = tile + k * tile_group;
    uint8_t* dst = row + k * (2 + b);
    std::memcpy(dst, src + 2 * cell, 2);
    for (int i = 0; i < b; ++i) dst[2 + i] = src[TileCodeOffset(b, cell, i)];
  }
}

void DecodeKvTileCells(const uint8_t* tiles, int first, int n, int head_dim, float* out,
                       KvRowFormat format) {
  const size_t row_bytes = KvRowBytes(format, head_dim);
  if (format == KvRowFormat::kF16) {  // straight from the tiles' halves
    for (int j = 0; j < n; ++j) {
      const int c = first + j;
      const uint8_t* tile = tiles + (c / kKvTileCells) * kKvTileCells * row_bytes;
      for (int i = 0; i < head_dim; ++i) {
        fp16_t h;
        std::memcpy(&h, tile + 2 * (static_cast<size_t>(i) * kKvTileCells + c % kKvTileCells), 2);
        out[static_cast<size_t>(j) * head_dim + i] = Fp16ToF32(h);
      }
    }
    return;
  }
  std::vector<uint8_t> row(row_bytes);  // [row_bytes] one cell's row
  uint8_t* r = row.data();
  for (int j = 0; j < n; ++j) {
    const int c = first + j;
    UntileKvRow(tiles + (c / kKvTileCells) * kKvTileCells * row_bytes, c % kKvTileCells, head_dim,
                r, format);
    DecodeKvRow(format, r, head_dim, out + static_cast<size_t>(j) * head_dim);
  }
}

namespace {
constexpr float kFp16Max = 65504.0f;
// Q4_0 scale search: candidates max / (-8 + kQ4ScaleStep * s) for |s| <= kQ4ScaleSteps.
constexpr int kQ4ScaleSteps = 20;
constexpr float kQ4ScaleStep = 0.1f;
// int8 scale search: candidates amax / (127 - kInt8ScaleStep * s) for 0 <= s <= kInt8ScaleSteps.
constexpr int kInt8ScaleSteps = 40;
constexpr float kInt8ScaleStep = 0.25f;

constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Least-error step in [lo, hi] (ties: the first seen): every 4th step, then the neighbours of the
// best within 3. Error(0) (the plain scale) is always evaluated, so the plain scale is never beaten
// by a worse one. About 17 evaluations instead of 41; the errors are bumpy in the step, so this
// finds the best step most of the time, not always. `errors(steps, n, err)` evaluates n <=
// kKvScaleCandidates steps at once, one call per round (0 and the coarse steps, then the
// neighbours); the choice replays each round's steps in the order given.
template <typename ErrorsFn>
int SearchScaleStep(int lo, int hi, ErrorsFn errors) {
  int steps[kKvScaleCandidates];  // [n] this round's steps, in the order they are considered
  float err[kKvScaleCandidates];  // [n] their errors
  LAMINA_CHECK(lo <= 0 && 2 + (hi - lo) / 4 <= kKvScaleCandidates);
  int n = 0;
  steps[n++] = 0;
  for (int step = lo; step <= hi; step += 4) {
    if (step != 0) steps[n++] = step;
  }
  errors(steps, n, err);
  int best = 0;
  float best_err = err[0];
  auto replay = [&](int first) {
    for (int k = first; k < n; ++k) {
      if (err[k] < best_err) {
        best_err = err[k];
        best = steps[k];
      }
    }
  };
  replay(1);
  const int center = best;
  n = 0;
  for (int delta = 1; delta <= 3; ++delta) {
    for (const int step : {center - delta, center + delta}) {
      if (step >= lo && step <= hi && step != 0) steps[n++] = step;
    }
  }
  if (n > 0) {
    errors(steps, n, err);
    replay(0);
  }
  return best;
}

// The first x[i] of magnitude amax = KvAbsMax(x, g) (0 when amax is 0): the signed value of
// largest magnitude that a running "if |x[i]| > best" loop keeps.
float GroupSignedMax(const float* x, int g, float amax) {
  if (!(amax > 0.0f)) return 0.0f;
  for (int i = 0; i < g; ++i) {
    if (std::fabs(x[i]) == amax) return x[i];
  }
  return 0.0f;
}

void EncodeInt8Group(const float* x, int g, const RoundingKey* key, uint32_t element0,
                     uint8_t* out) {
  const float amax = KvAbsMax(x, g);
  // The scale maps amax to 127 - 0.25 s (s in [0, 40]); s = 0 is amax / 127 and larger s give
  // coarser steps that never clip. The encoder keeps the s with the least squared error of the
  // codes against the stored fp16 scale: ~28% lower RMS error for 8-value groups, ~12% for 32.
  // Scales beyond the fp16 range saturate (codes then clamp) rather than become inf.
  float d = std::min(amax / 127.0f, kFp16Max);
  if (amax > 0.0f && amax / 127.0f < kFp16Max) {
    static const KvScaleErrorsFn int8_errors = BestKvScaleErrors(KvRowFormat::kInt8);
    const int s = SearchScaleStep(0, kInt8ScaleSteps, [&](const int* steps, int n, float* err) {
      float cand[kKvScaleCandidates];  // [n]
      for (int k = 0; k < n; ++k) cand[k] = amax / (127.0f - kInt8ScaleStep * steps[k]);
      int8_errors(x, g, cand, n, err);
      for (int k = 0; k < n; ++k) {
        if (cand[k] > kFp16Max) err[k] = INFINITY;
      }
    });
    d = amax / (127.0f - kInt8ScaleStep * s);
  }
  const fp16_t d16 = F32ToFp16(d);
  const float ds = Fp16ToF32(d16);
  const float id = ds != 0.0f ? 1.0f / ds : 0.0f;
  std::memcpy(out, &d16, 2);
  int8_t* q = reinterpret_cast<int8_t*>(out + 2);
  // NaN (a finite row whose rotation overflowed) codes as 0 rather than an undefined cast.
  auto code = [](float r) {
    return std::isnan(r) ? int8_t{0} : static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
  };
  if (key == nullptr) {
    for (int i = 0; i < g; ++i) q[i] = code(KvRoundHalfEven(x[i] * id));
  } else {
    for (int i = 0; i < g; ++i) {
      q[i] = code(std::floor(x[i] * id + StochasticUniform(*key, element0 + i)));
    }
  }
}

void EncodeQ4Group(const float* x, int g, const RoundingKey* key, uint32_t element0, uint8_t* out) {
  const float amax = KvAbsMax(x, g), max = GroupSignedMax(x, g, amax);
  // GGML's scale maps the value of largest magnitude to code 0 (d = max / -8). The encoder
  // also tries nearby scales and keeps the one with the least squared error: the block format
  // and its decoding are unchanged, the error drops by ~6% (32-value blocks) to ~13% (8).
  float d = std::clamp(max / -8.0f, -kFp16Max, kFp16Max);
  if (amax > 0.0f && amax < kFp16Max) {
    static const KvScaleErrorsFn q4_errors = BestKvScaleErrors(KvRowFormat::kQ4_0);
    const int s =
        SearchScaleStep(-kQ4ScaleSteps, kQ4ScaleSteps, [&](const int* steps, int n, float* err) {
          float cand[kKvScaleCandidates];  // [n]
          for (int k = 0; k < n; ++k) cand[k] = max / (-8.0f + kQ4ScaleStep * steps[k]);
          q4_errors(x, g, cand, n, err);
        });
    d = max / (-8.0f + kQ4ScaleStep * s);
  }
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const fp16_t d16 = F32ToFp16(d);
  std::memcpy(out, &d16, 2);
  uint8_t* qs = out + 2;
  const int half = g / 2;
  auto code_of = [](float r) {
    return std::isnan(r) ? uint8_t{8} : static_cast<uint8_t>(std::clamp(r, 0.0f, 15.0f));
  };
  if (key == nullptr) {  // branch-free per element, so the loop vectorises
    auto code = [&](int i) { return code_of(std::trunc((x[i] * id + 8.0f) + 0.5f)); };
    for (int i = 0; i < half; ++i) qs[i] = static_cast<uint8_t>(code(i) | (code(i + half) << 4));
  } else {
    auto code = [&](int i) {
      return code_of(std::floor((x[i] * id + 8.0f) + StochasticUniform(*key, element0 + i)));
    };
    for (int i = 0; i < half; ++i) qs[i] = static_cast<uint8_t>(code(i) | (code(i + half) << 4));
  }
}
// q4_nl's levels as floats.
constexpr float Q4NlLevel(int k) { return static_cast<float>(kQ4NlLevels[k]); }
constexpr int kQ4NlScaleSteps = 20;
constexpr float kQ4NlScaleStep = 0.01f;

void EncodeQ4NlGroup(const float* x, int g, const RoundingKey* key, uint32_t element0,
                     uint8_t* out) {
  const float amax = KvAbsMax(x, g), max = GroupSignedMax(x, g, amax);
  const float top = Q4NlLevel(15);
  float d = std::clamp(max / top, -kFp16Max, kFp16Max);
  if (amax > 0.0f && amax < kFp16Max) {
    static const KvScaleErrorsFn q4nl_errors = BestKvScaleErrors(KvRowFormat::kQ4Nl);
    const int s = SearchScaleStep(-kQ4NlScaleSteps, kQ4NlScaleSteps,
                                  [&](const int* steps, int n, float* err) {
                                    float cand[kKvScaleCandidates];  // [n]
                                    for (int k = 0; k < n; ++k)
                                      cand[k] = max / (top * (1.0f + kQ4NlScaleStep * steps[k]));
                                    q4nl_errors(x, g, cand, n, err);
                                  });
    d = max / (top * (1.0f + kQ4NlScaleStep * s));
  }
  const fp16_t d16 = F32ToFp16(d);
  std::memcpy(out, &d16, 2);
  const float dq = Fp16ToF32(d16);
  const float id = dq != 0.0f ? 1.0f / dq : 0.0f;
  uint8_t* qs = out + 2;
  const int half = g / 2;
  if (key == nullptr) {
    auto code = [&](int i) { return static_cast<uint8_t>(KvQ4NlNearest(x[i] * id)); };
    for (int i = 0; i < half; ++i) qs[i] = static_cast<uint8_t>(code(i) | (code(i + half) << 4));
    return;
  }
  auto code = [&](int i) -> uint8_t {
    const float t = x[i] * id;
    // Stochastic: between the two levels around t, the upper one with probability equal to
    // t's fraction of the way there (the expectation is t within the levels' range).
    if (!(t > Q4NlLevel(0))) return 0;  // also NaN
    if (t >= Q4NlLevel(15)) return 15;
    int k = 0;
    while (t >= Q4NlLevel(k + 1)) ++k;
    const float frac = (t - Q4NlLevel(k)) / (Q4NlLevel(k + 1) - Q4NlLevel(k));
    return static_cast<uint8_t>(k + (StochasticUniform(*key, element0 + i) < frac ? 1 : 0));
  };
  for (int i = 0; i < half; ++i) qs[i] = static_cast<uint8_t>(code(i) | (code(i + half) << 4));
}
}  // namespace

float StochasticUniform(const RoundingKey& key, uint32_t element) {
  uint64_t h = Mix64(key.seed ^ 0x9E3779B97F4A7C15ull);
  h = Mix64(h ^ (static_cast<uint64_t>(key.layer) << 32 | key.position));
  h = Mix64(h ^ element);
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // 24 bits: exact in float, < 1
}

void EncodeKvRow(KvRowFormat format, const float* x, int head_dim, const RoundingKey* key,
                 uint8_t* out) {
  switch (format) {
    case KvRowFormat::kF32:
      std::memcpy(out, x, 4u * head_dim);
      return;
    case KvRowFormat::kF16: {
      // F16's row quantizer: F32ToFp16 element by element, by F16C where the CPU has it (the
      // same bits: round to nearest even, NaN payloads kept), off the writer's scalar loop.
      static const QuantizeRowFn to_f16 = GetKernels(GgmlType::kF16).quantize;
      to_f16(x, out, head_dim);
      return;
    }
    case KvRowFormat::kInt8:
    case KvRowFormat::kQ4_0:
    case KvRowFormat::kQ4Nl: {
      const int g = KvGroupSize(head_dim);
      const size_t group_bytes = KvRowBytes(format, head_dim) / (head_dim / g);
      const uint32_t e0 = key ? key->element0 : 0;
      for (int b = 0; b < head_dim / g; ++b) {
        if (format == KvRowFormat::kInt8) {
          EncodeInt8Group(x + b * g, g, key, e0 + b * g, out + b * group_bytes);
        } else if (format == KvRowFormat::kQ4Nl) {
          EncodeQ4NlGroup(x + b * g, g, key, e0 + b * g, out + b * group_bytes);
        } else {
          EncodeQ4Group(x + b * g, g, key, e0 + b * g, out + b * group_bytes);
        }
      }
      return;
    }
  }
}

void DecodeKvRow(KvRowFormat format, const uint8_t* row, int head_dim, float* out) {
  switch (format) {
    case KvRowFormat::kF32:
      std::memcpy(out, row, 4u * head_dim);
      return;
    case KvRowFormat::kF16: {
      const fp16_t* h = reinterpret_cast<const fp16_t*>(row);
      for (int i = 0; i < head_dim; ++i) out[i] = Fp16ToF32(h[i]);
      return;
    }
    case KvRowFormat::kInt8: {
      const int g = KvGroupSize(head_dim);
      for (int b = 0; b < head_dim / g; ++b) {
        const uint8_t* grp = row + b * (2 + g);
        fp16_t d16;
        std::memcpy(&d16, grp, 2);
        const float d = Fp16ToF32(d16);
        const int8_t* q = reinterpret_cast<const int8_t*>(grp + 2);
        for (int i = 0; i < g; ++i) out[b * g + i] = d * q[i];
      }
      return;
    }
    case KvRowFormat::kQ4_0:
    case KvRowFormat::kQ4Nl: {
      // A nibble's level: q - 8 (Q4_0) or the q4_nl table.
      const bool nl = format == KvRowFormat::kQ4Nl;
      auto level = [nl](int q) { return static_cast<float>(nl ? kQ4NlLevels[q] : q - 8); };
      const int g = KvGroupSize(head_dim);
      const int half = g / 2;
      for (int b = 0; b < head_dim / g; ++b) {
        const uint8_t* grp = row + b * (2 + half);
        fp16_t d16;
        std::memcpy(&d16, grp, 2);
        const float d = Fp16ToF32(d16);
        const uint8_t* qs = grp + 2;
        for (int i = 0; i < half; ++i) {
          out[b * g + i] = d * level(qs[i] & 0x0F);
          out[b * g + i + half] = d * level(qs[i] >> 4);
        }
      }
      return;
    }
  }
}

int RotationBlock(int n) { return n & -n; }

namespace {
// The fixed sign of element i within a rotation block.
constexpr float RotationSign(int i) {
  return (Mix64(kRotationSeed + static_cast<uint64_t>(i)) & 1) ? -1.0f : 1.0f;
}

// The signs of the first kRotationSignTable elements, computed at compile time (a rotation runs
// per KV row written and per query and output of every rotated head).
constexpr int kRotationSignTable = 512;
struct RotationSigns {
  float sign[kRotationSignTable];
  constexpr RotationSigns() : sign() {
    for (int i = 0; i < kRotationSignTable; ++i) sign[i] = RotationSign(i);
  }
};
constexpr RotationSigns kRotationSigns;

// signs[i] = RotationSign(i) for i < b: the table, or `spill` filled for larger blocks.
const float* RotationSignsFor(int b, std::vector<float>& spill) {
  if (b <= kRotationSignTable) return kRotationSigns.sign;
  spill.resize(b);
  for (int i = 0; i < b; ++i) spill[i] = RotationSign(i);
  return spill.data();
}

}  // namespace

void Rotate(float* x, int n) {
  static const KvHadamardFn hadamard = BestKvHadamard();
  const int b = RotationBlock(n);
  const float norm = 1.0f / std::sqrt(static_cast<float>(b));
  std::vector<float> spill;
  const float* signs = RotationSignsFor(b, spill);  // [b]
  for (int off = 0; off < n; off += b) {
    float* blk = x + off;
    for (int i = 0; i < b; ++i) blk[i] *= signs[i];
    hadamard(blk, b);
    for (int i = 0; i < b; ++i) blk[i] *= norm;
  }
}

void InverseRotate(float* x, int n) {
  // R = H D / sqrt(b) with H symmetric, so R^-1 = R^T = D H / sqrt(b).
  static const KvHadamardFn hadamard = BestKvHadamard();
  const int b = RotationBlock(n);
  const float norm = 1.0f / std::sqrt(static_cast<float>(b));
  std::vector<float> spill;
  const float* signs = RotationSignsFor(b, spill);  // [b]
  for (int off = 0; off < n; off += b) {
    float* blk = x + off;
    hadamard(blk, b);
    for (int i = 0; i < b; ++i) blk[i] *= norm * signs[i];
  }
}

}  // namespace lamina
