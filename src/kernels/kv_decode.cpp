// Scalar KV row decoders and runtime selection.
#include "kernels/kv_decode.h"

namespace lamina {

namespace {
template <KvRowFormat F>
void DecodeScalar(const uint8_t* rows, int n_rows, int head_dim, float* out) {
  const size_t row_bytes = KvRowBytes(F, head_dim);
  for (int r = 0; r < n_rows; ++r) {
    DecodeKvRow(F, rows + r * row_bytes, head_dim, out + static_cast<int64_t>(r) * head_dim);
  }
}
bool HasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  }();
  return has;
}
}  // namespace

KvRowDecodeFn ScalarKvRowDecoder(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kF32: return DecodeScalar<KvRowFormat::kF32>;
    case KvRowFormat::kF16: return DecodeScalar<KvRowFormat::kF16>;
    case KvRowFormat::kInt8: return DecodeScalar<KvRowFormat::kInt8>;
    case KvRowFormat::kQ4_0: return DecodeScalar<KvRowFormat::kQ4_0>;
  }
  return nullptr;
}

KvRowDecodeFn BestKvRowDecoder(KvRowFormat format) {
  if (HasAvx2()) {
    if (KvRowDecodeFn f = Avx2KvRowDecoder(format)) return f;
  }
  return ScalarKvRowDecoder(format);
}

}  // namespace lamina
