// Invariant checks: LAMINA_CHECK aborts with file:line on a broken invariant (always on);
// LAMINA_DCHECK is for hot loops and compiles away unless LAMINA_DEBUG_CHECKS is set.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace lamina::internal {
[[noreturn]] inline void CheckFailed(const char* file, int line, const char* expr) {
  std::fprintf(stderr, "lamina: invariant failed at %s:%d: %s\n", file, line, expr);
  std::abort();
}
}  // namespace lamina::internal

#define LAMINA_CHECK(cond)                                              \
  do {                                                                  \
    if (!(cond)) ::lamina::internal::CheckFailed(__FILE__, __LINE__, #cond); \
  } while (0)

#if defined(LAMINA_DEBUG_CHECKS) && LAMINA_DEBUG_CHECKS
#define LAMINA_DCHECK(cond) LAMINA_CHECK(cond)
#else
#define LAMINA_DCHECK(cond) \
  do {                      \
  } while (0)
#endif
