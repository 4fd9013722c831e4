// Fast decoders of KV head rows (see kv_format.h for the layouts): a scalar twin and AVX2 + F16C
// and AVX-512 variants with the same signature, chosen once.
//
// Integer scores: int8 and q4_0 K rows can be scored against a query without decoding them to
// floats. The query is quantized once to int16 per 32-value group (QuantizeQueryInt16) and each
// group's dot product with the stored codes is an exact int32; a cell's score is then
//   s = 0; for each group g: s = fma(float(dot_g), d_k[g] * d_q[g], s); out = s * scale
// in that order, so the scalar twin and the SIMD variant agree bit for bit and a score depends
// only on the query and the cell. The int16 query keeps ~15 bits per group (a relative error of
// 1.5e-5 of the group's largest value), below the f16 rounding GGML applies to queries.
#pragma once

#include <cstdint>

#include "kernels/kv_format.h"

namespace lamina {

// Decodes n_rows consecutive head rows (each KvRowBytes(format, head_dim) bytes) into
// out [n_rows, head_dim].
using KvRowDecodeFn = void (*)(const uint8_t* rows, int n_rows, int head_dim, float* out);

KvRowDecodeFn ScalarKvRowDecoder(KvRowFormat format);
KvRowDecodeFn Avx2KvRowDecoder(KvRowFormat format);    // nullptr when none
KvRowDecodeFn Avx512KvRowDecoder(KvRowFormat format);  // nullptr when none
KvRowDecodeFn BestKvRowDecoder(KvRowFormat format);

// Integer scoring needs int8 or q4_0 rows of whole 32-value groups (head_dim % 32 == 0).
bool KvIntScoreSupported(KvRowFormat format, int head_dim);

// q [head_dim] -> qq [head_dim] int16 codes and qd [head_dim / 32] scales, q ≈ qd[g] * code.
// Within each run of 16 values the codes are stored evens first, then odds
// (qq[16k + m] = code(16k + 2m), qq[16k + 8 + m] = code(16k + 2m + 1), m < 8): the order in
// which the SIMD scorer pairs them with the row codes.
void QuantizeQueryInt16(const float* q, int head_dim, int16_t* qq, float* qd);

// out[qi * out_stride + j] = score of query qi (qq + qi * head_dim, qd + qi * head_dim / 32)
// against row j, for qi < nq and j < n_rows (formula above).
using KvScoreFn = void (*)(const uint8_t* rows, int n_rows, int head_dim, int nq,
                           const int16_t* qq, const float* qd, float scale, float* out,
                           int64_t out_stride);

KvScoreFn ScalarKvScorer(KvRowFormat format);  // nullptr unless int8 / q4_0
KvScoreFn Avx512KvScorer(KvRowFormat format);  // nullptr when none
// The AVX-512 scorer when the CPU has AVX-512 VNNI, else nullptr: without it the decode-to-f32
// path is faster than scalar integer scoring.
KvScoreFn BestKvScorer(KvRowFormat format);

}  // namespace lamina
