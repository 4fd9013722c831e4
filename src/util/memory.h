// The memory guard's arithmetic: the machine's available memory (/proc/meminfo MemAvailable),
// byte sizes as users write them ("8G", "512M"), overflow-safe products and a readable
// rendering, so that buffers sized by input are refused with numbers before they are allocated.
#pragma once

#include <cstdint>
#include <string>

#include "util/status.h"

namespace lamina {

// MemAvailable from /proc/meminfo in bytes; 0 when it cannot be read.
uint64_t AvailableMemoryBytes();

// "123", "64K", "512M", "8G", "1T" (binary multiples, optional "iB"/"B"); an error otherwise.
Result<uint64_t> ParseByteSize(const std::string& text);

// "1.50 GiB", "12.0 MiB", "512 B".
std::string FormatBytes(uint64_t bytes);

// a * b, saturating at UINT64_MAX (sizes computed from untrusted counts).
inline uint64_t SatMul(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
inline uint64_t SatAdd(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

// How much a process may plan to allocate, and where that number came from (for messages).
struct MemoryLimit {
  uint64_t bytes = UINT64_MAX;  // UINT64_MAX: unlimited
  std::string source;           // e.g. "90% of MemAvailable", "LAMINA_MEM_LIMIT", "--mem-limit"
};

// The default limit: 90% of MemAvailable (unlimited when /proc/meminfo is unreadable).
MemoryLimit DefaultMemoryLimit();

// Resolves the limit: `option` (the CLI's --mem-limit) when non-empty, else `env` (the value of
// LAMINA_MEM_LIMIT, passed by the caller) when non-empty, else DefaultMemoryLimit(). "none"
// means unlimited. An error names the bad value.
Result<MemoryLimit> ResolveMemoryLimit(const std::string& option, const char* env);

}  // namespace lamina
