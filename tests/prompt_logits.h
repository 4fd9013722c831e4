// The logits of every position of a fixed prompt in a fresh session, for tests that compare two
// loads of a model (nvfp4_scale_test, qwen35_test).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "model/model.h"
#include "runtime/session.h"
#include "util/thread_pool.h"

namespace lamina::testing_util {

// [n_tokens, n_vocab] logits of tokens 1 + (37 i) mod (n_vocab - 1), i < n_tokens, in a 64-token
// session on 2 threads; empty (and a test failure) when the evaluation fails.
inline std::vector<float> PromptLogits(const Model& model, int n_tokens) {
  ThreadPool pool(2);
  SessionConfig sc;
  sc.n_ctx = 64;
  Session s(model, sc, pool);
  std::vector<int32_t> tokens;  // [n_tokens]
  for (int i = 0; i < n_tokens; ++i) {
    tokens.push_back(1 + (i * 37) % (model.hparams().n_vocab - 1));
  }
  Result<const float*> logits = s.Eval(tokens, /*all_logits=*/true);
  EXPECT_TRUE(logits.ok()) << logits.error().message;
  if (!logits.ok()) return {};
  return std::vector<float>(*logits, *logits + tokens.size() * model.hparams().n_vocab);
}

}  // namespace lamina::testing_util
