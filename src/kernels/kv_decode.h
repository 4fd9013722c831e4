// Fast decoders of KV head rows (see kv_format.h for the layouts): a scalar twin and an
// AVX2 + F16C variant with the same signature, chosen once.
#pragma once

#include <cstdint>

#include "kernels/kv_format.h"

namespace lamina {

// Decodes n_rows consecutive head rows (each KvRowBytes(format, head_dim) bytes) into
// out [n_rows, head_dim].
using KvRowDecodeFn = void (*)(const uint8_t* rows, int n_rows, int head_dim, float* out);

KvRowDecodeFn ScalarKvRowDecoder(KvRowFormat format);
KvRowDecodeFn Avx2KvRowDecoder(KvRowFormat format);  // nullptr when none
KvRowDecodeFn BestKvRowDecoder(KvRowFormat format);

}  // namespace lamina
