// Kernels of the Gated DeltaNet linear-attention layer over raw pointers: the short causal
// depthwise convolution with SiLU, per-head L2 normalisation, and one step of the gated delta
// rule on one head's state. Scalar reference twins, and a SIMD twin of the delta step (the hot
// loop; one Highway source compiled for AVX2 and AVX-512) chosen once at runtime; callers loop
// tokens (the recurrence is sequential in time) and may run heads in parallel (heads are
// independent).
#pragma once

#include <cstdint>

namespace lamina {

// out[t, c] = silu(sum_j w[c, j] * xe[t + j, c]) for t in [0, n), j in [0, k), where xe is the
// k - 1 rows of `tail` followed by the n rows of x (the last tap multiplies the current token).
// tail: [k - 1, channels] the previous inputs, oldest first; w: [channels, k];
// x, out: [n, channels] (x and out must not alias).
void CausalConvSilu(const float* tail, const float* x, int n, int channels, int k, const float* w,
                    float* out);

// The last k - 1 rows of [tail; x] (x: [n, channels]) into new_tail [k - 1, channels]; new_tail
// may alias tail.
void ConvTailAdvance(const float* tail, const float* x, int n, int channels, int k,
                     float* new_tail);

// x[0..n) /= max(||x||, eps) in place.
void L2Normalize(float* x, int n, float eps);

// One token of the gated delta rule on one head, M: [d_k, d_v] (row j holds value dims of key
// dim j, so consecutive value dims are contiguous), read from `src` and written to `dst` (which
// may be src: in place; else they must not overlap):
//   M = decay * M_src;  d = beta * (v - M^T k);  M += k d^T;  out = scale * (M^T q)
// k and q are L2-normalised by the caller. out: [d_v] (also the scratch for M^T k and d). Every
// out[i] sums over key dims j in ascending order with separate multiplies and adds, so a twin
// that vectorises across value dims gives the same bits.
void GatedDeltaStep(const float* src, float* dst, const float* q, const float* k, const float* v,
                    float decay, float beta, float scale, int d_k, int d_v, float* out);

using GatedDeltaStepFn = void (*)(const float* src, float* dst, const float* q, const float* k,
                                  const float* v, float decay, float beta, float scale, int d_k,
                                  int d_v, float* out);
// The SIMD twins (same contract, same bits); nullptr where the CPU lacks their instructions.
GatedDeltaStepFn Avx2GatedDeltaStep();
GatedDeltaStepFn Avx512GatedDeltaStep();
// The twin the CPU and LAMINA_ISA allow (the widest available, else the scalar one).
GatedDeltaStepFn BestGatedDeltaStep();

}  // namespace lamina
