// Planted KV cache faults, as write observers (runtime/write_observer.h): they prove that the
// write-path tests and `lamina probe` catch what they are meant to catch. Each kind is the
// signature of a real bug class: a decode path whose writes never reach storage, a decode path
// that stores garbage, a biased value quantizer, a verify window whose batched append skips
// storage, a recent window that hides cells never encoded, and rejected drafts left in place.
#pragma once

#include <memory>
#include <string>

#include "runtime/write_observer.h"
#include "util/status.h"

namespace lamina::probe {

enum class Fault {
  kNone,
  kSkipDecodeWrites,     // single-token writes (n == 1) never reach storage
  kCorruptDecodeWrites,  // single-token writes store head 0's V row negated
  kBiasedV,  // every V value shifted up by one 4-bit grid step of its head row (amax / 8)
  // Batched writes that append to a sequence already holding cells (a speculative verify
  // window; a later prompt chunk) never reach storage: the seed engine's bug.
  kSkipVerifyWrites,
  // Single-token writes of a cache with a recent window (lossy modes) store only the cell's
  // exact copy: it reads as zeros once it leaves the window.
  kSkipWindowEncode,
  // Every Truncate to a prefix (n_keep > 0) keeps the cells it would drop: a speculative leg's
  // rejected drafts stay in the sequence.
  kSkipTruncate,
};

// "none", "skip-decode-writes", "corrupt-decode-writes", "biased-v", "skip-verify-writes",
// "skip-window-encode", "skip-truncate".
const char* FaultName(Fault fault);
// The plantable faults' names (all but "none"), comma-separated, for help texts and errors.
std::string FaultNames();
// The inverse of FaultName (except "none"); the error lists the names.
Result<Fault> ParseFault(const std::string& name);

// The observer that plants `fault` (nullptr for kNone). Stateless: one may serve many caches.
std::unique_ptr<WriteObserver> MakeFaultObserver(Fault fault);

}  // namespace lamina::probe
