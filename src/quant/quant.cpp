// Runtime ISA detection and the per-ISA kernel tables. Each table is built once, on first use,
// and only for an ISA the CPU has: the SIMD Register* functions live in files compiled with
// that ISA's flags, so even running them on a lesser CPU could fault.
#include "quant/quant.h"

#include <cstdlib>
#include <string>

#include "quant/kernel_registry.h"
#include "util/check.h"
#include "util/cpu_features.h"

namespace lamina {

namespace {

using quant_internal::KernelTable;
using quant_internal::kTypeTableSize;

struct Tables {
  KernelTable table{};
};

// Every known type gets an entry naming itself, so types no kernel file fills (yet) come back
// with null kernels rather than as a mislabelled F32 entry.
void InitEntries(KernelTable& table) {
  for (int i = 0; i < kTypeTableSize; ++i) {
    const GgmlType t = static_cast<GgmlType>(i);
    table[i] = TypeKernels{t, t, nullptr, nullptr, nullptr, nullptr};
  }
}

const Tables& ScalarTables() {
  static const Tables* tables = [] {
    auto* t = new Tables;
    InitEntries(t->table);
    quant_internal::RegisterScalarLegacy(t->table);
    quant_internal::RegisterScalarKQuants(t->table);
    quant_internal::RegisterScalarIQuants(t->table);
    quant_internal::RegisterScalarLowBit(t->table);
    quant_internal::RegisterScalarInterleaved(t->table);
    quant_internal::RegisterScalarInterleavedK(t->table);
    quant_internal::RegisterScalarInterleavedNvfp4(t->table);
    quant_internal::RegisterScalarInterleavedLowBit(t->table);
    quant_internal::RegisterScalarInterleavedIq(t->table);
    return t;
  }();
  return *tables;
}

const Tables& Avx2Tables() {
  static const Tables* tables = [] {
    auto* t = new Tables(ScalarTables());
    quant_internal::RegisterAvx2Legacy(t->table);
    quant_internal::RegisterAvx2KQuants(t->table);
    quant_internal::RegisterAvx2IQuants(t->table);
    quant_internal::RegisterAvx2LowBit(t->table);
    quant_internal::RegisterAvx2Interleaved(t->table);
    quant_internal::RegisterAvx2InterleavedK(t->table);
    quant_internal::RegisterAvx2InterleavedNvfp4(t->table);
    quant_internal::RegisterAvx2InterleavedLowBit(t->table);
    quant_internal::RegisterAvx2InterleavedIq(t->table);
    return t;
  }();
  return *tables;
}

const Tables& Avx512Tables() {
  static const Tables* tables = [] {
    auto* t = new Tables(Avx2Tables());
    quant_internal::RegisterAvx512Legacy(t->table);
    quant_internal::RegisterAvx512KQuants(t->table);
    quant_internal::RegisterAvx512IQuants(t->table);
    quant_internal::RegisterAvx512LowBit(t->table);
    quant_internal::RegisterAvx512Interleaved(t->table);
    quant_internal::RegisterAvx512InterleavedK(t->table);
    quant_internal::RegisterAvx512InterleavedNvfp4(t->table);
    quant_internal::RegisterAvx512InterleavedLowBit(t->table);
    quant_internal::RegisterAvx512InterleavedIq(t->table);
    return t;
  }();
  return *tables;
}

Isa DetectIsaUncached() {
  const CpuFeatures& cpu = GetCpuFeatures();
  if (cpu.HasAvx512Set()) return Isa::kAvx512;
  if (cpu.HasAvx2Set()) return Isa::kAvx2;
  return Isa::kScalar;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

Isa DetectIsa() {
  static const Isa isa = [] {
    const Isa detected = DetectIsaUncached();
    return IsaAllowed(detected) ? detected : IsaCap();  // LAMINA_ISA caps it
  }();
  return isa;
}

const TypeKernels& GetKernels(GgmlType type, Isa isa) {
  const uint32_t raw = static_cast<uint32_t>(type);
  LAMINA_CHECK(IsKnownGgmlType(raw) && raw < static_cast<uint32_t>(kTypeTableSize));
  LAMINA_CHECK(static_cast<int>(isa) <= static_cast<int>(DetectIsa()));
  switch (isa) {
    case Isa::kScalar:
      return ScalarTables().table[raw];
    case Isa::kAvx2:
      return Avx2Tables().table[raw];
    case Isa::kAvx512:
      return Avx512Tables().table[raw];
  }
  LAMINA_CHECK(false && "unknown Isa");
  return ScalarTables().table[raw];
}

const TypeKernels& GetKernels(GgmlType type) { return GetKernels(type, DetectIsa()); }

bool IsSupportedWeightType(GgmlType type) {
  const uint32_t raw = static_cast<uint32_t>(type);
  if (!IsKnownGgmlType(raw) || raw >= static_cast<uint32_t>(kTypeTableSize)) return false;
  const TypeKernels& k = GetKernels(type);
  if (k.vec_dot == nullptr || k.vec_dot_multi == nullptr) return false;
  // The matmul quantizes activations into vec_dot_type, so that needs a quantizer too.
  return k.vec_dot_type == GgmlType::kF32 || GetKernels(k.vec_dot_type).quantize != nullptr;
}

}  // namespace lamina
