// Fast decoders of KV head rows (see kv_format.h for the layouts): a scalar twin and an
// AVX2 + F16C variant with the same signature, chosen once.
#pragma once

#include <cstdint>

#include "kernels/kv_format.h"

namespace lamina {

using KvRowDecodeFn = void (*)(const uint8_t* row, int head_dim, float* out);

KvRowDecodeFn ScalarKvRowDecoder(KvRowFormat format);
KvRowDecodeFn Avx2KvRowDecoder(KvRowFormat format);  // nullptr when none
KvRowDecodeFn BestKvRowDecoder(KvRowFormat format);

}  // namespace lamina
