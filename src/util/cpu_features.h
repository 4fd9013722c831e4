// x86 CPU feature detection by CPUID and XGETBV (the instructions and the OS saving their
// registers), detected once. Replaces __builtin_cpu_supports, whose feature names differ
// between compilers (clang 14 has no "f16c").
#pragma once

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace lamina {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;

  // AVX2 + FMA + F16C: what the *_avx2.cpp kernels are compiled for.
  bool HasAvx2Set() const { return avx2 && fma && f16c; }
  // The AVX2 set + AVX-512 F/BW/VL/DQ/VNNI: what the *_avx512.cpp kernels are compiled for.
  bool HasAvx512Set() const {
    return HasAvx2Set() && avx512f && avx512bw && avx512vl && avx512dq && avx512vnni;
  }
};

namespace cpu_internal {
inline uint64_t ReadXcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

inline CpuFeatures DetectCpuFeatures() {
  CpuFeatures f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return f;
  const unsigned max_leaf = eax;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return f;
  const bool osxsave = (ecx >> 27) & 1;
  const bool avx = (ecx >> 28) & 1;
  const bool fma = (ecx >> 12) & 1;
  const bool f16c = (ecx >> 29) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;    // XMM and YMM state
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!os_ymm || max_leaf < 7) return f;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  f.avx2 = (ebx >> 5) & 1;
  f.fma = fma;
  f.f16c = f16c;
  if (os_zmm) {
    f.avx512f = (ebx >> 16) & 1;
    f.avx512dq = (ebx >> 17) & 1;
    f.avx512bw = (ebx >> 30) & 1;
    f.avx512vl = (ebx >> 31) & 1;
    f.avx512vnni = (ecx >> 11) & 1;
  }
  return f;
}
}  // namespace cpu_internal

// The features of this CPU (detected on first use).
inline const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = cpu_internal::DetectCpuFeatures();
  return features;
}

// SIMD levels of the kernel families (quant dot products, KV row decoders, attention rows).
enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// The one ISA switch: LAMINA_ISA=scalar|avx2 caps every kernel family's choice (to run the
// scalar twins end to end, or to measure one ISA); it can only lower a choice, never enable
// what the CPU lacks. Read once.
inline Isa IsaCap() {
  static const Isa cap = [] {
    const char* env = std::getenv("LAMINA_ISA");
    if (env == nullptr) return Isa::kAvx512;
    if (std::strcmp(env, "scalar") == 0) return Isa::kScalar;
    if (std::strcmp(env, "avx2") == 0) return Isa::kAvx2;
    return Isa::kAvx512;
  }();
  return cap;
}

// Whether kernels of `level` may run: the cap allows it (the caller checks the CPU features
// its kernels need).
inline bool IsaAllowed(Isa level) { return static_cast<int>(level) <= static_cast<int>(IsaCap()); }

// The CPU has a kernel family's instructions and LAMINA_ISA allows them.
inline bool HasAvx2() { return GetCpuFeatures().HasAvx2Set() && IsaAllowed(Isa::kAvx2); }
inline bool HasAvx512() { return GetCpuFeatures().HasAvx512Set() && IsaAllowed(Isa::kAvx512); }

}  // namespace lamina
