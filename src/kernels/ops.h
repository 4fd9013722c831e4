// Elementwise and row operations of transformer layers, written to follow GGML's CPU numerics
// (double accumulation in RMSNorm and softmax sums, RoPE angles by repeated multiplication).
#pragma once

#include <cstdint>

namespace lamina {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; w may be nullptr (no scale). out may alias x.
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out);

// RmsNorm of `rows` rows of n values: row r at x + r * x_stride into out + r * out_stride, each
// row's bits RmsNorm's. The squares' double sum is a chain of n dependent adds per row (index
// order, as GGML), so rows are summed kRmsNormRowsAtOnce at a time as independent chains: a batch
// of rows takes about one row's add latency per that many rows. Out row r may alias x row r, no
// other x row.
// Where the CPU has AVX-512, 8 rows at a time take the 8 lanes of one register instead, and
// their scaling runs 16 floats at a time (Avx512SumSquares8, Avx512ScaleRow: the same order and
// bits; 8 rows of 1,024 in ~1.5 us where the scalar loops take 3.8-4.1 on one Zen 5 core).
constexpr int kRmsNormRowsAtOnce = 4;
void RmsNormRows(const float* x, int64_t x_stride, const float* w, int64_t n, float eps,
                 int64_t rows, float* out, int64_t out_stride);

// sums[r] = the double sum of x[r * stride + i]^2 over i in index order, r = 0..7 (ops_avx512.cpp;
// call only where the CPU has AVX-512).
void Avx512SumSquares8(const float* x, int64_t stride, int64_t n, double* sums);
// out[i] = (x[i] * scale) * w[i] (x[i] * scale without w), 16 lanes at a time; out may alias x.
void Avx512ScaleRow(const float* x, const float* w, int64_t n, float scale, float* out);

enum class RopeStyle { kNormal, kNeox };  // adjacent pairs (llama) / halves (NeoX, qwen)

// Per-position rotation table for one head row: cos/sin of each rotated pair.
// cos_sin: [n_rot/2][2]. freq_scale multiplies positions (linear scaling); ext/attn factors
// are YaRN's (0 / 1 when unused).
struct RopeParams {
  int n_rot = 0;  // rotated dimensions (<= head_dim, even)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;  // 1 / linear factor
  float ext_factor = 0.0f;  // YaRN ramp mix (0 = off)
  float attn_factor = 1.0f;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int n_ctx_orig = 0;
  RopeStyle style = RopeStyle::kNormal;
  // Interleaved multi-section RoPE (qwen35, ggml's IMROPE) with text positions (the t, h and w
  // positions all the token's, e 0), over NeoX pairs; all zero: off. Pair i's sector is
  // i % (sum of sections); sector s takes the token's position when s % 3 == 0 and
  // s < 3 * sections[0], s % 3 == 1 and s < 3 * sections[1], or s % 3 == 2 and
  // s < 3 * sections[2], else position 0 (an identity turn). Sections covering every pair (the
  // published [11, 11, 10, 0] over 32 pairs) make it plain NeoX RoPE.
  int sections[4] = {0, 0, 0, 0};
  // Per-pair frequency factors ([n_rot / 2], ggml's rope freq_factors: pair i turns by
  // theta_i / freq_factors[i]; phi3's rope_factors_short / _long, llama-3-style rope_freqs);
  // nullptr: all 1. The owner (the model) outlives every copy.
  const float* freq_factors = nullptr;
};
// Whether rotated pair i (0 <= i < n_rot / 2) turns by the token's position (false: by 0).
bool RopeTextPair(const RopeParams& p, int i);
void RopeCache(const RopeParams& p, int64_t pos, float* cos_sin);
// Rotates n_heads rows of head_dim in x (in place) with a table from RopeCache.
void ApplyRope(const RopeParams& p, const float* cos_sin, float* x, int n_heads, int head_dim);

// In-place softmax over n values; returns nothing. Sum accumulated in double.
void Softmax(float* x, int64_t n);

// out[i] = silu(x[i]) = x[i] / (1 + exp(-x[i])) (an ungated expert: llama.cpp's ggml_silu)
void Silu(const float* x, int64_t n, float* out);

// out[i] = silu(gate[i]) * up[i]
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

// out[i] = gelu(gate[i]) * up[i], GELU's tanh approximation as ggml's CPU GEGLU computes it:
// the gate rounded to f16, GELU of that in f32 rounded to f16 (ggml's lookup table), 0 for a
// gate <= -10 and the gate itself from 10 up.
void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out);

// out[i] = g * sigmoid(alpha * g) * (u + 1) with g = min(gate[i], limit) and
// u = clamp(up[i], -limit, limit): gpt-oss's clamped gated activation, as ggml's CPU
// swiglu_oai computes it (the sigmoid as 1 / (1 + exp(-alpha g)) in f32).
void SwigluOaiMul(const float* gate, const float* up, int64_t n, float alpha, float limit,
                  float* out);

// y[i] += x[i]
void AddInPlace(float* y, const float* x, int64_t n);

}  // namespace lamina
