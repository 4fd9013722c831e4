// SIMD twin of GatedDeltaStep (delta_net.h), written once with Highway and compiled for AVX2
// and for AVX-512: one register of value dims at a time, key dims in the scalar twin's order,
// separate multiplies and adds (no FMA), so the bits equal the scalar twin's at every width.
// A d_v that is not a multiple of the register width runs the scalar twin.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/delta_net_hwy.cpp"
// Only the targets lamina dispatches to (the static baseline target is always compiled too).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | HWY_AVX3_DL)
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstdint>

#include "kernels/delta_net.h"

// The compiler must not fuse a multiply and an add into an FMA (the scalar twin has none).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

HWY_BEFORE_NAMESPACE();
namespace lamina {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr int kLanes = static_cast<int>(HWY_MAX_BYTES / sizeof(float));

void Step(const float* src, float* state, const float* q, const float* k, const float* v,
          float decay, float beta, float scale, int d_k, int d_v, float* out) {
  if (d_v % kLanes != 0) {
    GatedDeltaStep(src, state, q, k, v, decay, beta, scale, d_k, d_v, out);
    return;
  }
  const DF d;
  // M = decay * M_src, and out = M^T k.
  const VF vdecay = hn::Set(d, decay);
  for (int i = 0; i < d_v; i += kLanes) hn::StoreU(hn::Zero(d), d, out + i);
  for (int j = 0; j < d_k; ++j) {
    const float* from = src + static_cast<int64_t>(j) * d_v;
    float* row = state + static_cast<int64_t>(j) * d_v;
    const VF kj = hn::Set(d, k[j]);
    for (int i = 0; i < d_v; i += kLanes) {
      const VF m = hn::Mul(hn::LoadU(d, from + i), vdecay);
      hn::StoreU(m, d, row + i);
      hn::StoreU(hn::Add(hn::LoadU(d, out + i), hn::Mul(m, kj)), d, out + i);
    }
  }
  // out = d = beta * (v - M^T k); M += k d^T.
  const VF vbeta = hn::Set(d, beta);
  for (int i = 0; i < d_v; i += kLanes) {
    hn::StoreU(hn::Mul(vbeta, hn::Sub(hn::LoadU(d, v + i), hn::LoadU(d, out + i))), d, out + i);
  }
  for (int j = 0; j < d_k; ++j) {
    float* row = state + static_cast<int64_t>(j) * d_v;
    const VF kj = hn::Set(d, k[j]);
    for (int i = 0; i < d_v; i += kLanes) {
      hn::StoreU(hn::Add(hn::LoadU(d, row + i), hn::Mul(kj, hn::LoadU(d, out + i))), d, row + i);
    }
  }
  // The update is complete: out becomes scale * M^T q, accumulated in registers for up to
  // 8 registers of value dims per pass.
  constexpr int kPass = 8 * kLanes;
  const VF vscale = hn::Set(d, scale);
  for (int i0 = 0; i0 < d_v; i0 += kPass) {
    const int n_vec = (d_v - i0 < kPass ? d_v - i0 : kPass) / kLanes;
    VF acc[8];
    for (int b = 0; b < n_vec; ++b) acc[b] = hn::Zero(d);
    for (int j = 0; j < d_k; ++j) {
      const float* row = state + static_cast<int64_t>(j) * d_v + i0;
      const VF qj = hn::Set(d, q[j]);
      for (int b = 0; b < n_vec; ++b) {
        acc[b] = hn::Add(acc[b], hn::Mul(hn::LoadU(d, row + kLanes * b), qj));
      }
    }
    for (int b = 0; b < n_vec; ++b) hn::StoreU(hn::Mul(acc[b], vscale), d, out + i0 + kLanes * b);
  }
}

}  // namespace

GatedDeltaStepFn HighwayGatedDeltaStep() { return &Step; }

}  // namespace HWY_NAMESPACE
}  // namespace lamina
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lamina {

// Each target's twin only where Highway finds every instruction it compiled it with.
GatedDeltaStepFn Avx2GatedDeltaStep() {
#if HWY_TARGETS & HWY_AVX2
  if ((hwy::SupportedTargets() & HWY_AVX2) != 0) return N_AVX2::HighwayGatedDeltaStep();
#endif
  return nullptr;
}

GatedDeltaStepFn Avx512GatedDeltaStep() {
#if HWY_TARGETS & HWY_AVX3
  if ((hwy::SupportedTargets() & HWY_AVX3) != 0) return N_AVX3::HighwayGatedDeltaStep();
#endif
  return nullptr;
}

}  // namespace lamina
#endif  // HWY_ONCE
