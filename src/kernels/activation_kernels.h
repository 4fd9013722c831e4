// Gated activations (SiLU, SiLU * up, gpt-oss's clamped SwiGLU, GELU-tanh * up) over float rows,
// with the one exp polynomial every path computes (GELU: one table of f16 results): a scalar twin
// (activation_kernels.cpp) and one Highway source compiled for AVX2 + FMA and for AVX-512
// (activation_kernels_hwy.cpp) perform the same operations in the same order, so each element gets
// the same bits on every ISA and however a row is split into calls.
#pragma once

#include <cstdint>

namespace lamina {

// exp(x) as the kernels compute it: Cody-Waite range reduction to r in [-ln2/2, ln2/2], a
// degree-7 polynomial (Horner, fused multiply-adds) and 2^n applied as two power-of-two
// factors, so results down to the subnormals and up to FLT_MAX (then +inf) come out right.
// Within 2 ulp of exp over the normal range (tests/ops_test.cpp measures it); x is clamped to
// [-104, 89] first (exp is 0 below, +inf above). NaN gives an unspecified value.
float PolyExp(float x);

// GELU's tanh approximation of every f16 value x, as ggml's CPU GEGLU tabulates it:
// f32(f16(0.5 x (1 + tanh(sqrt(2 / pi) x (1 + 0.044715 x^2))))) in f32 with std::tanh, indexed by
// x's f16 bits ([65536], 256 KiB; built once on first use).
const float* GeluTanhF16Table();

struct ActivationKernels {
  // out[i] = x[i] / (1 + exp(-x[i])).
  void (*silu)(const float* x, int64_t n, float* out);
  // out[i] = (g / (1 + exp(-g))) * up[i], g = gate[i]. out may alias gate or up.
  void (*silu_mul)(const float* gate, const float* up, int64_t n, float* out);
  // out[i] = g / (1 + exp(alpha * -g)) * (u + 1), g = min(gate[i], limit),
  // u = clamp(up[i], -limit, limit). out may alias gate or up.
  void (*swiglu_oai_mul)(const float* gate, const float* up, int64_t n, float alpha, float limit,
                         float* out);
  // out[i] = act(g) * up[i] with act(g) = 0 for g <= -10, g from 10 up, else
  // GeluTanhF16Table()[f16 bits of g] (round to nearest even), g = gate[i]. out may alias gate
  // or up.
  void (*gelu_tanh_mul)(const float* gate, const float* up, int64_t n, float* out);
};

const ActivationKernels& ScalarActivationKernels();
// nullptr if not built or the CPU lacks the instructions they were compiled for.
const ActivationKernels* Avx2ActivationKernels();
const ActivationKernels* Avx512ActivationKernels();
// Chosen once (LAMINA_ISA caps it).
const ActivationKernels& BestActivationKernels();

}  // namespace lamina
