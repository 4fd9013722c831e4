// Activation kernels written once with Highway and compiled for AVX2 + FMA and for AVX-512: the
// twins of activation_kernels.cpp (the selection is there), with its PolyExp as vector code and
// GELU as gathers from the same table. A row's last partial vector goes through the same vector
// code in a padded copy, so every element gets the scalar twin's bits. Compiled without
// multiply-add contraction (CMakeLists.txt): the fused steps are the explicit MulAdd /
// NegMulAdd.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/activation_kernels_hwy.cpp"
// Only the targets lamina dispatches to (the static baseline target is always compiled too).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | HWY_AVX3_DL)
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

#include "kernels/activation_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace lamina {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr int kMaxLanes = static_cast<int>(HWY_MAX_BYTES / sizeof(float));

// PolyExp (activation_kernels.cpp), lane by lane.
HWY_INLINE VF Exp(DF d, VF x) {
  const hn::RebindToSigned<DF> di;
  x = hn::Min(hn::Max(x, hn::Set(d, -104.0f)), hn::Set(d, 89.0f));
  const VF shift = hn::Set(d, 12582912.0f);
  const VF biased = hn::Add(hn::Mul(x, hn::Set(d, 1.44269504088896341f)), shift);
  const VF n = hn::Sub(biased, shift);
  const auto ni = hn::Sub(hn::BitCast(di, biased), hn::Set(di, 0x4B400000));
  VF r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), x);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  VF p = hn::Set(d, 1.9875691500e-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201e-1f));
  p = hn::MulAdd(p, hn::Mul(r, r), hn::Add(r, hn::Set(d, 1.0f)));
  const auto e1 = hn::ShiftRight<1>(ni);  // arithmetic: floor(n / 2)
  const auto e2 = hn::Sub(ni, e1);
  const auto bias = hn::Set(di, 127);
  const VF s1 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(e1, bias)));
  const VF s2 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(e2, bias)));
  return hn::Mul(hn::Mul(p, s1), s2);
}

HWY_INLINE VF SiluV(DF d, VF g) {
  return hn::Div(g, hn::Add(hn::Set(d, 1.0f), Exp(d, hn::Neg(g))));
}

// Runs body(a, b, out) over whole vectors, then over the tail in padded copies.
template <typename Body>
HWY_INLINE void ForVectors(const float* a, const float* b, int64_t n, float* out, Body&& body) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(body(d, hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, out + i);
  }
  if (i < n) {
    const int64_t rest = n - i;
    HWY_ALIGN float ta[kMaxLanes] = {}, tb[kMaxLanes] = {}, to[kMaxLanes];
    std::copy_n(a + i, rest, ta);
    std::copy_n(b + i, rest, tb);
    hn::Store(body(d, hn::Load(d, ta), hn::Load(d, tb)), d, to);
    std::copy_n(to, rest, out + i);
  }
}

void Silu(const float* x, int64_t n, float* out) {
  ForVectors(x, x, n, out, [](DF d, VF g, VF) { return SiluV(d, g); });
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  ForVectors(gate, up, n, out, [](DF d, VF g, VF u) { return hn::Mul(SiluV(d, g), u); });
}

void SwigluOaiMul(const float* gate, const float* up, int64_t n, float alpha, float limit,
                  float* out) {
  ForVectors(gate, up, n, out, [alpha, limit](DF d, VF g, VF u) {
    const VF lim = hn::Set(d, limit);
    g = hn::Min(g, lim);
    u = hn::Min(hn::Max(u, hn::Neg(lim)), lim);
    const VF e = Exp(d, hn::Mul(hn::Set(d, alpha), hn::Neg(g)));
    return hn::Mul(hn::Div(g, hn::Add(hn::Set(d, 1.0f), e)), hn::Add(u, hn::Set(d, 1.0f)));
  });
}

void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out) {
  const float* table = GeluTanhF16Table();
  ForVectors(gate, up, n, out, [table](DF d, VF g, VF u) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    const hn::Rebind<uint16_t, DF> du16;
    const hn::RebindToSigned<DF> di;
    // The gate's f16 bits (round to nearest even, as F32ToFp16), zero-extended: table indices.
    const auto bits = hn::BitCast(du16, hn::DemoteTo(dh, g));
    const auto idx = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DF>(), bits));
    VF act = hn::GatherIndex(d, table, idx);
    act = hn::IfThenElse(hn::Ge(g, hn::Set(d, 10.0f)), g, act);
    act = hn::IfThenZeroElse(hn::Le(g, hn::Set(d, -10.0f)), act);
    return hn::Mul(act, u);
  });
}

}  // namespace

const ActivationKernels* HighwayActivationKernels() {
  static const ActivationKernels k{Silu, SiluMul, SwigluOaiMul, GeluTanhMul};
  return &k;
}

}  // namespace HWY_NAMESPACE
}  // namespace lamina
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lamina {

// Each target's kernels only where Highway finds every instruction it compiled them with.
const ActivationKernels* Avx2ActivationKernels() {
#if HWY_TARGETS & HWY_AVX2
  if ((hwy::SupportedTargets() & HWY_AVX2) == 0) return nullptr;
  return N_AVX2::HighwayActivationKernels();
#else
  return nullptr;
#endif
}

const ActivationKernels* Avx512ActivationKernels() {
#if HWY_TARGETS & HWY_AVX3
  if ((hwy::SupportedTargets() & HWY_AVX3) == 0) return nullptr;
  return N_AVX3::HighwayActivationKernels();
#else
  return nullptr;
#endif
}

}  // namespace lamina
#endif  // HWY_ONCE
