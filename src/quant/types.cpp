// Type traits table for the GGML types lamina knows.
#include "quant/types.h"

#include "util/check.h"

namespace lamina {

namespace {
struct Entry {
  GgmlType type;
  TypeTraits traits;
};
constexpr Entry kEntries[] = {
    {GgmlType::kF32, {"F32", 1, 4, false}},
    {GgmlType::kF16, {"F16", 1, 2, false}},
    {GgmlType::kBF16, {"BF16", 1, 2, false}},
    {GgmlType::kQ4_0, {"Q4_0", kQK, sizeof(BlockQ4_0), true}},
    {GgmlType::kQ4_1, {"Q4_1", kQK, sizeof(BlockQ4_1), true}},
    {GgmlType::kQ5_0, {"Q5_0", kQK, sizeof(BlockQ5_0), true}},
    {GgmlType::kQ5_1, {"Q5_1", kQK, sizeof(BlockQ5_1), true}},
    {GgmlType::kQ8_0, {"Q8_0", kQK, sizeof(BlockQ8_0), true}},
    {GgmlType::kQ8_1, {"Q8_1", kQK, sizeof(BlockQ8_1), true}},
    {GgmlType::kQ2_K, {"Q2_K", kQK_K, sizeof(BlockQ2_K), true}},
    {GgmlType::kQ3_K, {"Q3_K", kQK_K, sizeof(BlockQ3_K), true}},
    {GgmlType::kQ4_K, {"Q4_K", kQK_K, sizeof(BlockQ4_K), true}},
    {GgmlType::kQ5_K, {"Q5_K", kQK_K, sizeof(BlockQ5_K), true}},
    {GgmlType::kQ6_K, {"Q6_K", kQK_K, sizeof(BlockQ6_K), true}},
    {GgmlType::kQ8_K, {"Q8_K", kQK_K, sizeof(BlockQ8_K), true}},
    {GgmlType::kIQ2_XXS, {"IQ2_XXS", kQK_K, sizeof(BlockIQ2_XXS), true}},
    {GgmlType::kIQ2_XS, {"IQ2_XS", kQK_K, sizeof(BlockIQ2_XS), true}},
    {GgmlType::kIQ2_S, {"IQ2_S", kQK_K, sizeof(BlockIQ2_S), true}},
    {GgmlType::kIQ3_XXS, {"IQ3_XXS", kQK_K, sizeof(BlockIQ3_XXS), true}},
    {GgmlType::kIQ3_S, {"IQ3_S", kQK_K, sizeof(BlockIQ3_S), true}},
    {GgmlType::kIQ1_S, {"IQ1_S", kQK_K, sizeof(BlockIQ1_S), true}},
    {GgmlType::kIQ1_M, {"IQ1_M", kQK_K, sizeof(BlockIQ1_M), true}},
    {GgmlType::kIQ4_NL, {"IQ4_NL", kQK, sizeof(BlockIQ4_NL), true}},
    {GgmlType::kIQ4_XS, {"IQ4_XS", kQK_K, sizeof(BlockIQ4_XS), true}},
    {GgmlType::kTQ1_0, {"TQ1_0", kQK_K, sizeof(BlockTQ1_0), true}},
    {GgmlType::kTQ2_0, {"TQ2_0", kQK_K, sizeof(BlockTQ2_0), true}},
    {GgmlType::kMXFP4, {"MXFP4", kQK, sizeof(BlockMXFP4), true}},
    {GgmlType::kNVFP4, {"NVFP4", kQKNvfp4, sizeof(BlockNVFP4), true}},
    {GgmlType::kQ1_0, {"Q1_0", kQK1_0, sizeof(BlockQ1_0), true}},
    {GgmlType::kQ2_0, {"Q2_0", kQK2_0, sizeof(BlockQ2_0), true}},
};
}  // namespace

bool IsKnownGgmlType(uint32_t raw) {
  for (const Entry& e : kEntries) {
    if (static_cast<uint32_t>(e.type) == raw) return true;
  }
  return false;
}

const TypeTraits& GetTypeTraits(GgmlType type) {
  for (const Entry& e : kEntries) {
    if (e.type == type) return e.traits;
  }
  LAMINA_CHECK(false && "unknown GgmlType");
  return kEntries[0].traits;
}

const char* GgmlTypeName(GgmlType type) { return GetTypeTraits(type).name; }

size_t RowSize(GgmlType type, int64_t n) {
  const TypeTraits& t = GetTypeTraits(type);
  LAMINA_CHECK(n >= 0 && n % t.block_size == 0);
  return static_cast<size_t>(n / t.block_size) * t.type_size;
}

}  // namespace lamina
