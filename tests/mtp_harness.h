// Test helper: greedy `--spec mtp` against plain greedy decoding. For every KV mode (the MTP
// block's cache in the same mode), every case and draft lengths 1 and 4 (drafting on every
// step), the speculative run's ids, cell count, KV bytes and recurrent state must equal the plain
// run's. Used by the qwen35 fixtures' MTP blocks and the shipped model's trained head.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/generate.h"
#include "kv_storage.h"
#include "runtime/session.h"
#include "spec/drafter.h"
#include "spec/speculative.h"

namespace lamina {

struct MtpCase {
  std::vector<int32_t> prompt;
  GenerateOptions options;  // greedy
};

// Returns the drafting figures over every run (check them after: a non-fatal failure inside
// still returns what was gathered).
inline spec::SpecStats CheckMtpGreedyEqualsPlain(const Model& model,
                                                 const std::vector<MtpCase>& cases, int n_ctx) {
  ThreadPool pool(2);
  spec::SpecOptions so;
  so.adaptive = false;
  spec::SpecStats total;
  for (const KvMode& mode : kKvModes) {
    SessionConfig sc;
    sc.n_ctx = n_ctx;
    sc.kv_type = mode.type;
    sc.kv_seed = 5;
    if (!MakeKvCacheConfig(model.hparams(), sc).ok()) continue;
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const MtpCase& c = cases[ci];
      Session plain(model, sc, pool);
      Result<GenerateResult> want = engine::Generate(plain, 0, c.prompt, c.options);
      EXPECT_TRUE(want.ok());
      if (!want.ok()) return total;
      for (int draft_max : {1, 4}) {
        so.draft_max = draft_max;
        Session s(model, sc, pool);
        spec::MtpDrafter drafter(s, 0, sc, pool);
        spec::SpecStats stats;
        Result<GenerateResult> got =
            engine::GenerateSpeculative(s, 0, c.prompt, c.options, drafter, so, &stats);
        const std::string where = std::string(KvTypeName(mode.type)) + " draft_max " +
                                  std::to_string(draft_max) + " case " + std::to_string(ci);
        EXPECT_TRUE(got.ok()) << where;
        if (!got.ok()) return total;
        EXPECT_EQ(got->tokens, want->tokens) << where;
        EXPECT_EQ(s.n_past(0), plain.n_past(0)) << where;
        EXPECT_TRUE(KvStorageBytes(s.cache(), 0, s.n_past(0)) ==
                    KvStorageBytes(plain.cache(), 0, plain.n_past(0)))
            << where << ": KV bytes differ";
        EXPECT_EQ(RecurrentStateFloats(s, 0), RecurrentStateFloats(plain, 0)) << where;
        total.Add(stats);
      }
    }
  }
  return total;
}

}  // namespace lamina
