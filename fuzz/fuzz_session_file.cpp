// Fuzz target: session-file loading (ParseSessionFile, then Session::RestoreSequence and one
// decode step over the restored cells) on the shipped model, one session per KV mode and KV
// window (the mode's default, or none); the header's KV-mode and window fields pick the session.
// Each input is parsed twice: as it is, and with its header and section checksums recomputed, so
// that mutations reach the checks behind them. A file that parses is restored, saved again, and the
// saved bytes must parse to the same state.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/session.h"
#include "runtime/session_file.h"
#include "util/hash.h"
#include "util/thread_pool.h"

namespace {

using lamina::KvType;

constexpr int kCtx = 64;  // cells per sequence; the seeds hold fewer tokens
constexpr KvType kModes[] = {KvType::kF32,  KvType::kF16,  KvType::kInt8,
                             KvType::kQ4_0, KvType::kK8V4, KvType::kK8V4Nl};

struct State {
  std::unique_ptr<lamina::Model> model;
  uint64_t model_hash = 0;
  lamina::ThreadPool pool{1};
  // [2][kModes], indexed by KvType: the modes' default KV windows, then no window
  std::vector<std::unique_ptr<lamina::Session>> sessions;
};

State* LoadState() {
  auto* s = new State();
  const std::string path = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
  auto model = lamina::LoadModel(path);
  if (!model.ok()) {
    std::fprintf(stderr, "fuzz_session_file: %s: %s\n", path.c_str(),
                 model.error().message.c_str());
    std::abort();
  }
  s->model = std::move(model).value();
  s->model_hash = lamina::ModelIdentityHash(*s->model);
  for (const bool no_window : {false, true}) {
    for (KvType mode : kModes) {
      lamina::SessionConfig config;
      config.n_ctx = kCtx;
      config.kv_type = mode;
      if (no_window) config.kv_window = 0;
      s->sessions.push_back(std::make_unique<lamina::Session>(*s->model, config, s->pool));
    }
  }
  return s;
}

State& GetState() {
  static State* state = LoadState();  // loaded once per process
  return *state;
}

template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// Rewrites the header checksum and every section checksum that lies inside the bytes.
// Offsets of the version-2 and version-3 header (session_file.h).
void FixChecksums(std::vector<uint8_t>& b) {
  static_assert(lamina::kSessionFileVersion == 3, "update the header offsets below");
  constexpr size_t kHeaderBytes = 88;
  constexpr size_t kHeaderChecksumAt = 80;  // XXH64 of the 80 bytes before it
  if (b.size() < kHeaderBytes) return;
  Put<uint64_t>(b.data() + kHeaderChecksumAt, lamina::Xxh64::Of(b.data(), kHeaderChecksumAt));
  const uint32_t n_sections = Get<uint32_t>(b.data() + 60);
  size_t at = kHeaderBytes;
  for (uint32_t s = 0; s < n_sections && s < 32 && b.size() - at >= 24; ++s) {
    const uint64_t bytes = Get<uint64_t>(b.data() + at + 8);
    if (bytes > b.size() - at - 24) break;
    Put<uint64_t>(b.data() + at + 16, lamina::Xxh64::Of(b.data() + at + 24, bytes));
    at += 24 + bytes;
  }
}

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_session_file: %s\n", what);
  std::abort();
}

void LoadOne(State& st, const std::vector<uint8_t>& bytes) {
  // The session of the header's KV mode, with the mode's default KV window or (header window 0)
  // none, so that files of either kind get past the configuration checks.
  constexpr size_t kNumModes = std::size(kModes);
  const uint32_t mode = bytes.size() >= 28 ? Get<uint32_t>(bytes.data() + 24) : 0;
  const bool no_window = bytes.size() >= 76 && Get<uint32_t>(bytes.data() + 72) == 0;
  lamina::Session& session = *st.sessions[mode % kNumModes + (no_window ? kNumModes : 0)];
  auto view = lamina::ParseSessionFile(bytes.data(), bytes.size(), session, st.model_hash);
  if (!view.ok()) {
    Check(!view.error().message.empty(), "a refusal without a reason");
    return;
  }
  session.RestoreSequence(0, view->tokens, view->kv);
  Check(session.tokens(0) == view->tokens, "the restored tokens differ from the file's");
  // Saved again, the state must parse to the same tokens and payload.
  const std::vector<uint8_t> again =
      lamina::SerializeSessionFile(session, 0, st.model_hash, view->app);
  auto reparsed = lamina::ParseSessionFile(again.data(), again.size(), session, st.model_hash);
  Check(reparsed.ok(), "a restored state saved again does not parse");
  Check(reparsed->tokens == view->tokens, "a restored state saved again has other tokens");
  Check(reparsed->app == view->app, "a restored state saved again has another payload");
  Check(reparsed->kv_bytes == view->kv_bytes, "a restored state saved again has another KV size");
  if (std::memcmp(reparsed->kv, view->kv, view->kv_bytes) != 0) {
    size_t at = 0;
    while (reparsed->kv[at] == view->kv[at]) ++at;
    std::fprintf(stderr, "fuzz_session_file: KV state byte %zu of %zu: %u saved again, %u read\n",
                 at, view->kv_bytes, reparsed->kv[at], view->kv[at]);
    Check(false, "a restored state saved again has other KV bytes");
  }
  // One decode step attends over every restored cell (any bit pattern must be survivable).
  if (session.n_past(0) < session.n_ctx()) {
    const int32_t token = view->tokens.empty() ? 1 : view->tokens.back();
    (void)session.Eval(&token, 1, /*all_logits=*/false);
  }
  session.Truncate(0, 0);
}

}  // namespace

// Loads the model and the sessions before fuzzing starts, so that loading does not count against an
// input's time limit (the regression runner loads on first use instead).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)GetState();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  State& st = GetState();
  std::vector<uint8_t> bytes(data, data + size);  // [size]
  LoadOne(st, bytes);
  FixChecksums(bytes);
  LoadOne(st, bytes);
  return 0;
}
