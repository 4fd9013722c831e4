// AVX-512 (F/BW/VL/DQ/VNNI) kernels for F32, F16, BF16 and the legacy quants. Float types use
// 512-bit FMAs with masked tails; quant blocks use 256-bit VNNI dot products (one 32-byte block
// per register), which accumulate u8 x s8 products straight into int32 lanes.
// GCC 12's AVX-512 headers self-initialise their "undefined" vectors, which -Wall reports at
// every inlined intrinsic (GCC PR105593); the warnings say nothing about this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "quant/kernel_registry.h"

namespace lamina::quant_internal {
namespace {

inline float HsumPs(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline float HalfToF32(fp16_t h) { return _cvtsh_ss(h); }

// ---------------------------------------------------------------------------------------------
// Float types: 16 lanes per step, masked loads for the k % 16 tail.

struct F32Src {
  using T = float;
  static __m512 Load(const float* p) { return _mm512_loadu_ps(p); }
  static __m512 LoadMasked(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};
struct F16Src {
  using T = fp16_t;
  static __m512 Load(const fp16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 LoadMasked(const fp16_t* p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
};
struct BF16Src {
  using T = bf16_t;
  static __m512 Widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 Load(const bf16_t* p) {
    return Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 LoadMasked(const bf16_t* p, __mmask16 m) {
    return Widen(_mm256_maskz_loadu_epi16(m, p));
  }
};

inline __mmask16 TailMask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

template <class S>
void VecDotFloat(int64_t k, float* s, const void* vw, const void* va) {
  using T = typename S::T;
  const T* w = static_cast<const T*>(vw);
  const T* a = static_cast<const T*>(va);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= k; i += 64) {
    acc0 = _mm512_fmadd_ps(S::Load(w + i), S::Load(a + i), acc0);
    acc1 = _mm512_fmadd_ps(S::Load(w + i + 16), S::Load(a + i + 16), acc1);
    acc2 = _mm512_fmadd_ps(S::Load(w + i + 32), S::Load(a + i + 32), acc2);
    acc3 = _mm512_fmadd_ps(S::Load(w + i + 48), S::Load(a + i + 48), acc3);
  }
  for (; i + 16 <= k; i += 16) acc0 = _mm512_fmadd_ps(S::Load(w + i), S::Load(a + i), acc0);
  if (i < k) {
    const __mmask16 m = TailMask(k - i);
    acc1 = _mm512_fmadd_ps(S::LoadMasked(w + i, m), S::LoadMasked(a + i, m), acc1);
  }
  *s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

// Two accumulators per activation row: with N >= 3 rows that is enough independent FMAs.
template <class S, int N>
void VecDotFloatMultiN(int64_t k, const void* vw, const char* act, size_t stride, float* out) {
  using T = typename S::T;
  const T* w = static_cast<const T*>(vw);
  const T* a[N];
  __m512 acc0[N], acc1[N];
  for (int j = 0; j < N; ++j) {
    a[j] = reinterpret_cast<const T*>(act + j * stride);
    acc0[j] = _mm512_setzero_ps();
    acc1[j] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    const __m512 w0 = S::Load(w + i);
    const __m512 w1 = S::Load(w + i + 16);
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) {
      acc0[j] = _mm512_fmadd_ps(w0, S::Load(a[j] + i), acc0[j]);
      acc1[j] = _mm512_fmadd_ps(w1, S::Load(a[j] + i + 16), acc1[j]);
    }
  }
  for (; i + 16 <= k; i += 16) {
    const __m512 w0 = S::Load(w + i);
    for (int j = 0; j < N; ++j) acc0[j] = _mm512_fmadd_ps(w0, S::Load(a[j] + i), acc0[j]);
  }
  if (i < k) {
    const __mmask16 m = TailMask(k - i);
    const __m512 w0 = S::LoadMasked(w + i, m);
    for (int j = 0; j < N; ++j) {
      acc1[j] = _mm512_fmadd_ps(w0, S::LoadMasked(a[j] + i, m), acc1[j]);
    }
  }
  for (int j = 0; j < N; ++j) out[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[j], acc1[j]));
}

template <class S>
void VecDotFloatMulti(int64_t k, const void* w, const void* act, size_t stride, int n,
                      float* out) {
  const char* a = static_cast<const char*>(act);
  switch (n) {
    case 1: return VecDotFloatMultiN<S, 1>(k, w, a, stride, out);
    case 2: return VecDotFloatMultiN<S, 2>(k, w, a, stride, out);
    case 3: return VecDotFloatMultiN<S, 3>(k, w, a, stride, out);
    case 4: return VecDotFloatMultiN<S, 4>(k, w, a, stride, out);
    case 5: return VecDotFloatMultiN<S, 5>(k, w, a, stride, out);
    case 6: return VecDotFloatMultiN<S, 6>(k, w, a, stride, out);
    case 7: return VecDotFloatMultiN<S, 7>(k, w, a, stride, out);
    case 8: return VecDotFloatMultiN<S, 8>(k, w, a, stride, out);
    default:
      for (int j = 0; j < n; ++j) VecDotFloatMultiN<S, 1>(k, w, a + j * stride, 0, &out[j]);
  }
}

// ---------------------------------------------------------------------------------------------
// Legacy quants with VNNI. dpbusd multiplies unsigned by signed bytes. Unsigned weight codes
// (Q4_1, Q5_1: [0, 31]) go in as they are. For signed codes w (Q4_0, Q5_0, Q8_0) the
// activation is made unsigned instead: (y ^ 0x80) = y + 128, so dpbusd gives
// sum(y w) + 128 sum(w), and the accumulator starts at -128 sum(w), computed once per weight
// block. This is exact for every byte value, -128 included.

inline __m256i UnpackNibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

inline __m256i HighBits(const uint8_t* qh) {
  uint32_t x;
  std::memcpy(&x, qh, sizeof(x));
  return _mm256_maskz_mov_epi8(x, _mm256_set1_epi8(0x10));
}

struct Q4_0W {
  using Block = BlockQ4_0;
  using Act = BlockQ8_0;
  static constexpr bool kSigned = true;
  static __m256i Codes(const Block& b) {
    return _mm256_sub_epi8(UnpackNibbles(b.qs), _mm256_set1_epi8(8));
  }
};
struct Q5_0W {
  using Block = BlockQ5_0;
  using Act = BlockQ8_0;
  static constexpr bool kSigned = true;
  static __m256i Codes(const Block& b) {
    return _mm256_sub_epi8(_mm256_or_si256(UnpackNibbles(b.qs), HighBits(b.qh)),
                           _mm256_set1_epi8(16));
  }
};
struct Q8_0W {
  using Block = BlockQ8_0;
  using Act = BlockQ8_0;
  static constexpr bool kSigned = true;
  static __m256i Codes(const Block& b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
  }
};
struct Q4_1W {
  using Block = BlockQ4_1;
  using Act = BlockQ8_1;
  static constexpr bool kSigned = false;
  static __m256i Codes(const Block& b) { return UnpackNibbles(b.qs); }
};
struct Q5_1W {
  using Block = BlockQ5_1;
  using Act = BlockQ8_1;
  static constexpr bool kSigned = false;
  static __m256i Codes(const Block& b) {
    return _mm256_or_si256(UnpackNibbles(b.qs), HighBits(b.qh));
  }
};

template <class W>
struct Prepared {
  __m256i codes;
  __m256i init;  // dpbusd start value: -128 * sum(codes) per lane for signed codes, else 0
  float d;
  float m = 0.0f;

  explicit Prepared(const typename W::Block& b) {
    codes = W::Codes(b);
    if constexpr (W::kSigned) {
      const __m256i bias =
          _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(static_cast<char>(0x80)),
                              codes);
      init = _mm256_sub_epi32(_mm256_setzero_si256(), bias);
    } else {
      init = _mm256_setzero_si256();
      m = HalfToF32(b.m);
    }
    d = HalfToF32(b.d);
  }

  // Eight int32 lanes summing to dot(codes, activation codes).
  __m256i Dot(const int8_t* qs) const {
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
    if constexpr (W::kSigned) {
      const __m256i yu = _mm256_xor_si256(y, _mm256_set1_epi8(static_cast<char>(0x80)));
      return _mm256_dpbusd_epi32(init, yu, codes);
    } else {
      return _mm256_dpbusd_epi32(init, codes, y);
    }
  }
};

template <class W>
void VecDotQuant(int64_t k, float* s, const void* vw, const void* va) {
  const auto* w = static_cast<const typename W::Block*>(vw);
  const auto* a = static_cast<const typename W::Act*>(va);
  const int64_t nb = k / kQK;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float summ = 0.0f;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    const Prepared<W> p0(w[i]), p1(w[i + 1]);
    const __m256 s0 = _mm256_cvtepi32_ps(p0.Dot(a[i].qs));
    const __m256 s1 = _mm256_cvtepi32_ps(p1.Dot(a[i + 1].qs));
    acc0 = _mm256_fmadd_ps(s0, _mm256_set1_ps(p0.d * HalfToF32(a[i].d)), acc0);
    acc1 = _mm256_fmadd_ps(s1, _mm256_set1_ps(p1.d * HalfToF32(a[i + 1].d)), acc1);
    if constexpr (!W::kSigned) {
      summ += p0.m * HalfToF32(a[i].s) + p1.m * HalfToF32(a[i + 1].s);
    }
  }
  for (; i < nb; ++i) {
    const Prepared<W> p(w[i]);
    const __m256 s0 = _mm256_cvtepi32_ps(p.Dot(a[i].qs));
    acc0 = _mm256_fmadd_ps(s0, _mm256_set1_ps(p.d * HalfToF32(a[i].d)), acc0);
    if constexpr (!W::kSigned) summ += p.m * HalfToF32(a[i].s);
  }
  *s = HsumPs(_mm256_add_ps(acc0, acc1)) + summ;
}

template <class W, int N>
void VecDotQuantMultiN(int64_t k, const void* vw, const char* act, size_t stride, float* out) {
  const auto* w = static_cast<const typename W::Block*>(vw);
  const typename W::Act* a[N];
  __m256 acc[N];
  float summ[N];
  for (int j = 0; j < N; ++j) {
    a[j] = reinterpret_cast<const typename W::Act*>(act + j * stride);
    acc[j] = _mm256_setzero_ps();
    summ[j] = 0.0f;
  }
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const Prepared<W> p(w[i]);
    // Fully unrolled so the N accumulators stay in registers instead of on the stack.
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) {
      const typename W::Act& y = a[j][i];
      const __m256 sj = _mm256_cvtepi32_ps(p.Dot(y.qs));
      acc[j] = _mm256_fmadd_ps(sj, _mm256_set1_ps(p.d * HalfToF32(y.d)), acc[j]);
      if constexpr (!W::kSigned) summ[j] += p.m * HalfToF32(y.s);
    }
  }
  for (int j = 0; j < N; ++j) out[j] = HsumPs(acc[j]) + summ[j];
}

template <class W>
void VecDotQuantMulti(int64_t k, const void* w, const void* act, size_t stride, int n,
                      float* out) {
  const char* a = static_cast<const char*>(act);
  switch (n) {
    case 1: return VecDotQuantMultiN<W, 1>(k, w, a, stride, out);
    case 2: return VecDotQuantMultiN<W, 2>(k, w, a, stride, out);
    case 3: return VecDotQuantMultiN<W, 3>(k, w, a, stride, out);
    case 4: return VecDotQuantMultiN<W, 4>(k, w, a, stride, out);
    case 5: return VecDotQuantMultiN<W, 5>(k, w, a, stride, out);
    case 6: return VecDotQuantMultiN<W, 6>(k, w, a, stride, out);
    case 7: return VecDotQuantMultiN<W, 7>(k, w, a, stride, out);
    case 8: return VecDotQuantMultiN<W, 8>(k, w, a, stride, out);
    default:
      for (int j = 0; j < n; ++j) VecDotQuantMultiN<W, 1>(k, w, a + j * stride, 0, &out[j]);
  }
}

// ---------------------------------------------------------------------------------------------
// Activation quantizers, byte-identical to the scalar ones: amax, d = amax / 127,
// id = 127 / amax, x * id rounded to nearest even by cvtps2dq, saturating narrow (a no-op, the
// codes are within [-127, 127]).

inline float QuantizeBlock8(const float* x, int8_t* qs, int* code_sum) {
  const __m512 v0 = _mm512_loadu_ps(x);
  const __m512 v1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const float d = amax / 127.f;
  const float id = amax != 0.0f ? 127.f / amax : 0.0f;
  const __m512 mul = _mm512_set1_ps(id);
  const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, mul));
  const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, mul));
  if (code_sum != nullptr) *code_sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), _mm512_cvtsepi32_epi8(i0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 16), _mm512_cvtsepi32_epi8(i1));
  return d;
}

void QuantizeQ8_0(const float* x, void* vy, int64_t k) {
  BlockQ8_0* y = static_cast<BlockQ8_0*>(vy);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    y[i].d = _cvtss_sh(QuantizeBlock8(x + i * kQK, y[i].qs, nullptr), _MM_FROUND_TO_NEAREST_INT);
  }
}

void QuantizeQ8_1(const float* x, void* vy, int64_t k) {
  BlockQ8_1* y = static_cast<BlockQ8_1*>(vy);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    int sum = 0;
    const float d = QuantizeBlock8(x + i * kQK, y[i].qs, &sum);
    y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    y[i].s = _cvtss_sh(d * static_cast<float>(sum), _MM_FROUND_TO_NEAREST_INT);
  }
}

}  // namespace

// The registered single-row dots are the multi kernels with one row: out[j] of a multi call
// then never depends on how many rows share it, so a token gives bit-identical results in a
// prompt batch and in single-token decode (the KV write-path tests rely on this).
template <class S>
void VecDotFloatOne(int64_t k, float* s, const void* w, const void* a) {
  VecDotFloatMultiN<S, 1>(k, w, static_cast<const char*>(a), 0, s);
}
template <class W>
void VecDotQuantOne(int64_t k, float* s, const void* w, const void* a) {
  VecDotQuantMultiN<W, 1>(k, w, static_cast<const char*>(a), 0, s);
}

void RegisterAvx512Legacy(KernelTable& table) {
  auto set = [&](GgmlType t, VecDotFn dot, VecDotMultiFn multi) {
    table[static_cast<int>(t)].vec_dot = dot;
    table[static_cast<int>(t)].vec_dot_multi = multi;
  };
  set(GgmlType::kF32, VecDotFloatOne<F32Src>, VecDotFloatMulti<F32Src>);
  set(GgmlType::kF16, VecDotFloatOne<F16Src>, VecDotFloatMulti<F16Src>);
  set(GgmlType::kBF16, VecDotFloatOne<BF16Src>, VecDotFloatMulti<BF16Src>);
  set(GgmlType::kQ4_0, VecDotQuantOne<Q4_0W>, VecDotQuantMulti<Q4_0W>);
  set(GgmlType::kQ4_1, VecDotQuantOne<Q4_1W>, VecDotQuantMulti<Q4_1W>);
  set(GgmlType::kQ5_0, VecDotQuantOne<Q5_0W>, VecDotQuantMulti<Q5_0W>);
  set(GgmlType::kQ5_1, VecDotQuantOne<Q5_1W>, VecDotQuantMulti<Q5_1W>);
  set(GgmlType::kQ8_0, VecDotQuantOne<Q8_0W>, VecDotQuantMulti<Q8_0W>);
  table[static_cast<int>(GgmlType::kQ8_0)].quantize = QuantizeQ8_0;
  table[static_cast<int>(GgmlType::kQ8_1)].quantize = QuantizeQ8_1;
  // F16 activations keep the AVX2 F16C quantizer inherited from the AVX2 table.
}

}  // namespace lamina::quant_internal
