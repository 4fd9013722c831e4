// The planted faults of faults.h as KV write observers.
#include "probe/faults.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace lamina::probe {

namespace {

class SkipDecodeWrites : public KvWriteObserver {
 public:
  bool OnWrite(const KvWriteSpan& span, float*, float*) const override { return span.n != 1; }
};

class SkipVerifyWrites : public KvWriteObserver {
 public:
  bool OnWrite(const KvWriteSpan& span, float*, float*) const override {
    return span.n == 1 || span.pos0 == 0;
  }
};

class CorruptDecodeWrites : public KvWriteObserver {
 public:
  bool OnWrite(const KvWriteSpan& span, float*, float* v) const override {
    if (span.n == 1) {
      for (int e = 0; e < span.head_dim; ++e) v[e] = -v[e];
    }
    return true;
  }
};

class BiasedV : public KvWriteObserver {
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
  }
  return "?";
}

Result<Fault> ParseFault(const std::string& name) {
  for (Fault f : {Fault::kSkipDecodeWrites, Fault::kCorruptDecodeWrites, Fault::kBiasedV,
                  Fault::kSkipVerifyWrites}) {
    if (name == FaultName(f)) return f;
  }
  return Error{"unknown fault \"" + name +
               "\" (expected skip-decode-writes, corrupt-decode-writes, biased-v or "
               "skip-verify-writes)"};
}

std::unique_ptr<KvWriteObserver> MakeFaultObserver(Fault fault) {
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
  }
  return nullptr;
}

}  // namespace lamina::probe
