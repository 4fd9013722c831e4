// The planted faults of faults.h as write observers.
#include "probe/faults.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace lamina::probe {

namespace {

class SkipDecodeWrites : public WriteObserver {
 public:
  bool OnWrite(const KvWriteSpan& span, float*, float*) const override { return span.n != 1; }
};

class SkipVerifyWrites : public WriteObserver {
 public:
  bool OnWrite(const KvWriteSpan& span, float*, float*) const override {
    return span.n == 1 || span.pos0 == 0;
  }
};

class CorruptDecodeWrites : public WriteObserver {
 public:
  bool OnWrite(const KvWriteSpan& span, float*, float* v) const override {
    if (span.n == 1) {
      for (int e = 0; e < span.head_dim; ++e) v[e] = -v[e];
    }
    return true;
  }
};

class SkipWindowEncode : public WriteObserver {
 public:
  bool SkipWindowedEncode(const KvWriteSpan&) const override { return true; }
};

// Rollbacks to a prefix keep their cells; a reset to 0 still clears the sequence.
class SkipTruncate : public WriteObserver {
 public:
  bool KeepOnTruncate(int, int, int n_keep) const override { return n_keep > 0; }
};

class BiasedV : public WriteObserver {
 public:
  bool OnWrite(const KvWriteSpan& span, float*, float* v) const override {
    const int hd = span.head_dim;
    for (int64_t r = 0; r < static_cast<int64_t>(span.n) * span.n_kv_heads; ++r) {
      float* x = v + r * hd;  // one head row
      float amax = 0.0f;
      for (int e = 0; e < hd; ++e) amax = std::max(amax, std::fabs(x[e]));
      for (int e = 0; e < hd; ++e) x[e] += amax / 8.0f;
    }
    return true;
  }
};

}  // namespace

const char* FaultName(Fault fault) {
  switch (fault) {
    case Fault::kNone:
      return "none";
    case Fault::kSkipDecodeWrites:
      return "skip-decode-writes";
    case Fault::kCorruptDecodeWrites:
      return "corrupt-decode-writes";
    case Fault::kBiasedV:
      return "biased-v";
    case Fault::kSkipVerifyWrites:
      return "skip-verify-writes";
    case Fault::kSkipWindowEncode:
      return "skip-window-encode";
    case Fault::kSkipTruncate:
      return "skip-truncate";
  }
  return "?";
}

namespace {
constexpr Fault kPlantable[] = {Fault::kSkipDecodeWrites, Fault::kCorruptDecodeWrites,
                                Fault::kBiasedV,          Fault::kSkipVerifyWrites,
                                Fault::kSkipWindowEncode, Fault::kSkipTruncate};
}  // namespace

std::string FaultNames() {
  std::string names;
  for (Fault f : kPlantable) names += (names.empty() ? "" : ", ") + std::string(FaultName(f));
  return names;
}

Result<Fault> ParseFault(const std::string& name) {
  for (Fault f : kPlantable) {
    if (name == FaultName(f)) return f;
  }
  return Error{"unknown fault \"" + name + "\" (expected one of " + FaultNames() + ")"};
}

std::unique_ptr<WriteObserver> MakeFaultObserver(Fault fault) {
  switch (fault) {
    case Fault::kNone:
      return nullptr;
    case Fault::kSkipDecodeWrites:
      return std::make_unique<SkipDecodeWrites>();
    case Fault::kCorruptDecodeWrites:
      return std::make_unique<CorruptDecodeWrites>();
    case Fault::kBiasedV:
      return std::make_unique<BiasedV>();
    case Fault::kSkipVerifyWrites:
      return std::make_unique<SkipVerifyWrites>();
    case Fault::kSkipWindowEncode:
      return std::make_unique<SkipWindowEncode>();
    case Fault::kSkipTruncate:
      return std::make_unique<SkipTruncate>();
  }
  return nullptr;
}

}  // namespace lamina::probe
