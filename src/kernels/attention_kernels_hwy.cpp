// Attention row kernels written once with Highway and compiled for AVX2 + FMA and for AVX-512
// (twins of the scalar ones in attention_kernels.cpp; the selection is there). score_rows
// reduces eight cells' dot products together with one pairwise-add tree (lane j of the result
// is cell j's sum) instead of one horizontal sum per cell; exp uses a degree-5 polynomial after
// range reduction (relative error ~2e-7); accumulate_rows keeps the accumulator in registers.
// On AVX2 each kernel performs the operations of the hand-written AVX2 kernels it replaced, in
// the same order, and gave their bits on every input compared before they were removed.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_kernels_hwy.cpp"
// Only the targets lamina dispatches to (the static baseline target is always compiled too).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | HWY_AVX3_DL)
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention_kernels.h"
#include "util/fp16.h"

HWY_BEFORE_NAMESPACE();
namespace lamina {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr int kLanes = static_cast<int>(HWY_MAX_BYTES / sizeof(float));

#if HWY_TARGET != HWY_SCALAR && (HWY_MAX_BYTES == 32 || HWY_MAX_BYTES == 64)
#define LAMINA_EIGHT_SUM_TREE 1
// Lanes [0, N/2) hold the sums of adjacent lane pairs of a, lanes [N/2, N) those of b.
HWY_INLINE VF PairSums(DF d, VF a, VF b) {
  return hn::Add(hn::ConcatEven(d, b, a), hn::ConcatOdd(d, b, a));
}

// Stores the eight sums of v[0..7]'s lanes, times scale, at out[0..7] (8 or 16 lanes).
HWY_INLINE void StoreEightSums(DF d, const VF v[8], float scale, float* out) {
  const VF w0 = PairSums(d, v[0], v[1]);
  const VF w1 = PairSums(d, v[2], v[3]);
  const VF w2 = PairSums(d, v[4], v[5]);
  const VF w3 = PairSums(d, v[6], v[7]);
  const VF x = PairSums(d, PairSums(d, w0, w1), PairSums(d, w2, w3));
  if constexpr (kLanes == 8) {
    hn::StoreU(hn::Mul(x, hn::Set(d, scale)), d, out);
  } else {
    const hn::Half<DF> dh;
    const auto y = hn::LowerHalf(dh, PairSums(d, x, x));
    hn::StoreU(hn::Mul(y, hn::Set(dh, scale)), dh, out);
  }
}
#else
#define LAMINA_EIGHT_SUM_TREE 0
#endif

void ScoreRows(const float* q, const float* rows, int n_rows, int hd, float scale, float* out) {
  const DF d;
  int j = 0;
#if LAMINA_EIGHT_SUM_TREE
  {
    if (hd % kLanes == 0) {
      for (; j + 8 <= n_rows; j += 8) {
        VF acc[8];
        for (int r = 0; r < 8; ++r) acc[r] = hn::Zero(d);
        for (int i = 0; i < hd; i += kLanes) {
          const VF qv = hn::LoadU(d, q + i);
          for (int r = 0; r < 8; ++r) {
            acc[r] =
                hn::MulAdd(qv, hn::LoadU(d, rows + static_cast<int64_t>(j + r) * hd + i), acc[r]);
          }
        }
        StoreEightSums(d, acc, scale, out + j);
      }
    }
  }
#endif
  for (; j < n_rows; ++j) {
    const float* r = rows + static_cast<int64_t>(j) * hd;
    VF acc = hn::Zero(d);
    int i = 0;
    for (; i + kLanes <= hd; i += kLanes) {
      acc = hn::MulAdd(hn::LoadU(d, q + i), hn::LoadU(d, r + i), acc);
    }
    float s = hn::GetLane(hn::SumOfLanes(d, acc));
    for (; i < hd; ++i) s += q[i] * r[i];
    out[j] = s * scale;
  }
}

#if LAMINA_EIGHT_SUM_TREE
// a0[r] and a1[r] (r < kCells): the lane sums q0 * row r and q1 * row r, each the FMA chain over
// i that ScoreRows builds for that row, every row vector loaded once for both queries.
template <int kCells>
HWY_INLINE void DotTwo(DF d, const float* q0, const float* q1, const float* rows, int hd, VF* a0,
                       VF* a1) {
  for (int r = 0; r < kCells; ++r) a0[r] = a1[r] = hn::Zero(d);
  for (int i = 0; i < hd; i += kLanes) {
    const VF q0v = hn::LoadU(d, q0 + i);
    const VF q1v = hn::LoadU(d, q1 + i);
    for (int r = 0; r < kCells; ++r) {
      const VF kv = hn::LoadU(d, rows + static_cast<int64_t>(r) * hd + i);
      a0[r] = hn::MulAdd(q0v, kv, a0[r]);
      a1[r] = hn::MulAdd(q1v, kv, a1[r]);
    }
  }
}
#endif

void ScoreRows2(const float* q0, const float* q1, const float* rows, int n_rows, int hd,
                float scale, float* out0, float* out1) {
#if LAMINA_EIGHT_SUM_TREE
  if (hd % kLanes == 0) {
    const DF d;
    for (int j = 0; j + 8 <= n_rows; j += 8) {
      const float* r = rows + static_cast<int64_t>(j) * hd;
      VF a0[8], a1[8];
      if constexpr (kLanes == 16) {
        DotTwo<8>(d, q0, q1, r, hd, a0, a1);  // 16 accumulators of 32 registers
      } else {
        // 16 registers: two passes of four cells keep the accumulators in registers.
        DotTwo<4>(d, q0, q1, r, hd, a0, a1);
        DotTwo<4>(d, q0, q1, r + 4 * static_cast<int64_t>(hd), hd, a0 + 4, a1 + 4);
      }
      StoreEightSums(d, a0, scale, out0 + j);
      StoreEightSums(d, a1, scale, out1 + j);
    }
    return;
  }
#endif
  ScoreRows(q0, rows, n_rows, hd, scale, out0);
  ScoreRows(q1, rows, n_rows, hd, scale, out1);
}

// exp(x) for x <= 0 (inputs are x - max); underflows to 0 below about -87.
HWY_INLINE VF Exp(DF d, VF x) {
  const hn::RebindToSigned<DF> di;
  x = hn::Max(x, hn::Set(d, -87.3365f));
  // n = round-to-nearest-even(x * log2(e)) by adding 1.5 * 2^23, whose float spacing is 1 (the
  // same n as a rounding instruction in the default rounding mode, for |n| < 2^22); the bits of
  // the sum are those of 1.5 * 2^23 plus n, so shifting them left by 23 drops the constant.
  const VF shift = hn::Set(d, 12582912.0f);
  const VF biased = hn::Add(hn::Mul(x, hn::Set(d, 1.44269504088896341f)), shift);
  const VF n = hn::Sub(biased, shift);
  VF r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), x);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  VF p = hn::Set(d, 1.9875691500e-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201e-1f));
  p = hn::MulAdd(p, hn::Mul(r, r), hn::Add(r, hn::Set(d, 1.0f)));
  // 2^n: (n + 127) << 23 in the exponent field.
  const auto e = hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, biased), hn::Set(di, 127)));
  return hn::Mul(p, hn::BitCast(d, e));
}

double ExpSum(float* x, int n, float max) {
  const DF d;
  const VF vmax = hn::Set(d, max);
  const VF ninf = hn::Set(d, -INFINITY);
  VF sum = hn::Zero(d);
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const VF v = hn::LoadU(d, x + j);
    const VF e = hn::IfThenZeroElse(hn::Eq(v, ninf), Exp(d, hn::Sub(v, vmax)));
    hn::StoreU(e, d, x + j);
    sum = hn::Add(sum, e);
  }
  double total = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; j < n; ++j) {
    const float e = x[j] == -INFINITY ? 0.0f : std::exp(x[j] - max);
    x[j] = e;
    total += e;
  }
  return total;
}

// acc[0, kVecs * lanes) += sum_j p[j] * rows[j][same columns], the accumulator in registers.
template <int kVecs>
HWY_INLINE void AccumulateFixed(const float* p, const float* rows, int n_rows, int hd, float* acc) {
  const DF d;
  VF a[kVecs];
  for (int v = 0; v < kVecs; ++v) a[v] = hn::LoadU(d, acc + kLanes * v);
  for (int j = 0; j < n_rows; ++j) {
    const VF pj = hn::Set(d, p[j]);
    const float* r = rows + static_cast<int64_t>(j) * hd;
    for (int v = 0; v < kVecs; ++v) a[v] = hn::MulAdd(pj, hn::LoadU(d, r + kLanes * v), a[v]);
  }
  for (int v = 0; v < kVecs; ++v) hn::StoreU(a[v], d, acc + kLanes * v);
}

void AccumulateRows(const float* p, const float* rows, int n_rows, int hd, float* acc) {
  // Column chunks of 8, 4 and 1 vectors keep the accumulators in registers; each column is
  // one chain of fused multiply-adds over j, so the chunking does not change any bit.
  int i0 = 0;
  for (; i0 + 8 * kLanes <= hd; i0 += 8 * kLanes) {
    AccumulateFixed<8>(p, rows + i0, n_rows, hd, acc + i0);
  }
  for (; i0 + 4 * kLanes <= hd; i0 += 4 * kLanes) {
    AccumulateFixed<4>(p, rows + i0, n_rows, hd, acc + i0);
  }
  for (; i0 + kLanes <= hd; i0 += kLanes) AccumulateFixed<1>(p, rows + i0, n_rows, hd, acc + i0);
  for (; i0 < hd; ++i0) {
    for (int j = 0; j < n_rows; ++j) acc[i0] += p[j] * rows[static_cast<int64_t>(j) * hd + i0];
  }
}

float Max(const float* x, int n) {
  const DF d;
  int j = 0;
  float m = x[0];
  if (n >= kLanes) {
    VF vm = hn::LoadU(d, x);
    for (j = kLanes; j + kLanes <= n; j += kLanes) vm = hn::Max(vm, hn::LoadU(d, x + j));
    m = hn::GetLane(hn::MaxOfLanes(d, vm));
  }
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

void Scale(float* x, int n, float s) {
  const DF d;
  const VF vs = hn::Set(d, s);
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) hn::StoreU(hn::Mul(hn::LoadU(d, x + j), vs), d, x + j);
  for (; j < n; ++j) x[j] *= s;
}

void RoundF16(float* x, int n) {
  const DF d;
  const hn::Rebind<hwy::float16_t, DF> dh;
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    hn::StoreU(hn::PromoteTo(d, hn::DemoteTo(dh, hn::LoadU(d, x + j))), d, x + j);
  }
  for (; j < n; ++j) x[j] = Fp16ToF32(F32ToFp16(x[j]));
}

}  // namespace

const AttentionRowKernels* HighwayAttentionRowKernels() {
  static const AttentionRowKernels k{ScoreRows, ScoreRows2, ExpSum,  AccumulateRows,
                                     Max,       Scale,      RoundF16};
  return &k;
}
#undef LAMINA_EIGHT_SUM_TREE

}  // namespace HWY_NAMESPACE
}  // namespace lamina
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lamina {

// Each target's kernels only where Highway finds every instruction it compiled them with.
const AttentionRowKernels* Avx2AttentionRowKernels() {
#if HWY_TARGETS & HWY_AVX2
  if ((hwy::SupportedTargets() & HWY_AVX2) == 0) return nullptr;
  return N_AVX2::HighwayAttentionRowKernels();
#else
  return nullptr;
#endif
}

const AttentionRowKernels* Avx512AttentionRowKernels() {
#if HWY_TARGETS & HWY_AVX3
  if ((hwy::SupportedTargets() & HWY_AVX3) == 0) return nullptr;
  return N_AVX3::HighwayAttentionRowKernels();
#else
  return nullptr;
#endif
}

}  // namespace lamina
#endif  // HWY_ONCE
