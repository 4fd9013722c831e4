// Row operations (norm, rope, softmax, activations).
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>

#include "kernels/activation_kernels.h"
#include "util/cpu_features.h"

namespace lamina {

namespace {
// sums[r] = sum of double(x[r * stride + i])^2 over i in index order, for R rows side by side
// (R independent add chains; each row's order and bits are the one-row loop's).
template <int R>
void SumSquares(const float* x, int64_t stride, int64_t n, double* sums) {
  double s[R] = {};
  for (int64_t i = 0; i < n; ++i) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const double v = x[r * stride + i];
      s[r] += v * v;
    }
  }
  for (int r = 0; r < R; ++r) sums[r] = s[r];
}

float RmsScale(double sum, int64_t n, float eps) {
  const float mean = static_cast<float>(sum / n);
  return 1.0f / std::sqrt(mean + eps);
}

void ScaleRow(const float* x, const float* w, int64_t n, float eps, double sum, float* out) {
  const float scale = RmsScale(sum, n, eps);
  if (w != nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}
}  // namespace

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  double sum;
  SumSquares<1>(x, 0, n, &sum);
  ScaleRow(x, w, n, eps, sum, out);
}

void RmsNormRows(const float* x, int64_t x_stride, const float* w, int64_t n, float eps,
                 int64_t rows, float* out, int64_t out_stride) {
  static_assert(kRmsNormRowsAtOnce == 4);
  static const bool kAvx512 = HasAvx512();  // chosen once
  int64_t r0 = 0;
  if (kAvx512) {
    for (; r0 + 8 <= rows; r0 += 8) {
      double sums[8];
      Avx512SumSquares8(x + r0 * x_stride, x_stride, n, sums);
      for (int64_t r = 0; r < 8; ++r) {
        Avx512ScaleRow(x + (r0 + r) * x_stride, w, n, RmsScale(sums[r], n, eps),
                       out + (r0 + r) * out_stride);
      }
    }
  }
  for (; r0 < rows; r0 += kRmsNormRowsAtOnce) {
    const int64_t m = std::min<int64_t>(kRmsNormRowsAtOnce, rows - r0);
    const float* xr = x + r0 * x_stride;
    double sums[kRmsNormRowsAtOnce];
    switch (m) {
      case 1:
        SumSquares<1>(xr, x_stride, n, sums);
        break;
      case 2:
        SumSquares<2>(xr, x_stride, n, sums);
        break;
      case 3:
        SumSquares<3>(xr, x_stride, n, sums);
        break;
      default:
        SumSquares<4>(xr, x_stride, n, sums);
        break;
    }
    for (int64_t r = 0; r < m; ++r) {
      ScaleRow(xr + r * x_stride, w, n, eps, sums[r], out + (r0 + r) * out_stride);
    }
  }
}

namespace {
// YaRN helpers, as GGUF/GGML define them: the correction range of dimensions between the
// beta_fast and beta_slow rotation counts, and a linear ramp across it.
float YarnCorrDim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2 * static_cast<float>(M_PI))) /
         (2 * std::log(base));
}
float YarnRamp(float low, float high, int i0) {
  const float y = (i0 / 2 - low) / std::max(0.001f, high - low);
  return 1.0f - std::min(1.0f, std::max(0.0f, y));
}
}  // namespace

bool RopeTextPair(const RopeParams& p, int i) {
  const int* sec = p.sections;
  const int total = sec[0] + sec[1] + sec[2] + sec[3];
  if (total <= 0) return true;
  const int s = i % total;
  return s < 3 * sec[s % 3];
}

void RopeCache(const RopeParams& p, int64_t pos, float* cos_sin) {
  const float theta_scale = std::pow(p.freq_base, -2.0f / p.n_rot);
  float corr_low = 0, corr_high = 0;
  if (p.ext_factor != 0.0f) {
    corr_low =
        std::max(0.0f, std::floor(YarnCorrDim(p.n_rot, p.n_ctx_orig, p.beta_fast, p.freq_base)));
    corr_high = std::min(static_cast<float>(p.n_rot - 1),
                         std::ceil(YarnCorrDim(p.n_rot, p.n_ctx_orig, p.beta_slow, p.freq_base)));
  }
  float theta = static_cast<float>(pos);
  for (int i0 = 0; i0 < p.n_rot; i0 += 2) {
    const float ff = p.freq_factors != nullptr ? p.freq_factors[i0 / 2] : 1.0f;
    const float theta_extrap = RopeTextPair(p, i0 / 2) ? theta / ff : 0.0f;
    const float theta_interp = p.freq_scale * theta_extrap;
    float t = theta_interp;
    float mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) {
      const float ramp_mix = YarnRamp(corr_low, corr_high, i0) * p.ext_factor;
      t = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
      mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
    }
    cos_sin[i0] = std::cos(t) * mscale;
    cos_sin[i0 + 1] = std::sin(t) * mscale;
    theta *= theta_scale;
  }
}

void ApplyRope(const RopeParams& p, const float* cos_sin, float* x, int n_heads, int head_dim) {
  const int half = p.n_rot / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* row = x + static_cast<int64_t>(h) * head_dim;
    if (p.style == RopeStyle::kNormal) {
      for (int i0 = 0; i0 < p.n_rot; i0 += 2) {
        const float c = cos_sin[i0], s = cos_sin[i0 + 1];
        const float x0 = row[i0], x1 = row[i0 + 1];
        row[i0] = x0 * c - x1 * s;
        row[i0 + 1] = x0 * s + x1 * c;
      }
    } else {
      for (int i0 = 0; i0 < p.n_rot; i0 += 2) {
        const int i = i0 / 2;
        const float c = cos_sin[i0], s = cos_sin[i0 + 1];
        const float x0 = row[i], x1 = row[i + half];
        row[i] = x0 * c - x1 * s;
        row[i + half] = x0 * s + x1 * c;
      }
    }
  }
}

void Softmax(float* x, int64_t n) {
  float max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max = std::max(max, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float e = (x[i] == -INFINITY) ? 0.0f : std::exp(x[i] - max);
    x[i] = e;
    sum += e;
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

// The exp-based activations run on the selected kernels (activation_kernels.h): one polynomial
// exp, the same bits on every ISA.
void Silu(const float* x, int64_t n, float* out) { BestActivationKernels().silu(x, n, out); }

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  BestActivationKernels().silu_mul(gate, up, n, out);
}

void SwigluOaiMul(const float* gate, const float* up, int64_t n, float alpha, float limit,
                  float* out) {
  BestActivationKernels().swiglu_oai_mul(gate, up, n, alpha, limit, out);
}

void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out) {
  BestActivationKernels().gelu_tanh_mul(gate, up, n, out);
}

void AddInPlace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace lamina
