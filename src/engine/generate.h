// Generation over one sequence of a caller's Session, for the command line, the probe and the
// tests: each call runs the request in a one-slot Engine (engine.h), so it takes exactly the
// path a server slot takes — admission, prompt evaluation, the verify window and its rollback,
// the stop rules — with the command line's context edge (every cell is used).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "runtime/generate.h"
#include "runtime/session.h"
#include "spec/drafter.h"
#include "spec/speculative.h"

namespace lamina::engine {

// Evaluates `prompt` on sequence `seq` (after prefix reuse) and generates until a stop rule.
// on_text receives each piece of final text as it is released; returning false cancels.
// on_prompt_progress (optional) is called after every prompt chunk with (done, total).
Result<GenerateResult> Generate(Session& session, int seq, const std::vector<int32_t>& prompt,
                                const GenerateOptions& options,
                                const std::function<bool(const std::string&)>& on_text = {},
                                const std::function<void(int, int)>& on_prompt_progress = {});

// Generate with speculation: `drafter` proposes, verify windows check (spec/speculative.h); at
// temperature 0 the emitted ids are those of plain greedy decoding. stats (optional) receives
// the drafting figures.
Result<GenerateResult> GenerateSpeculative(
    Session& session, int seq, const std::vector<int32_t>& prompt, const GenerateOptions& options,
    spec::Drafter& drafter, const spec::SpecOptions& spec, spec::SpecStats* stats = nullptr,
    const std::function<bool(const std::string&)>& on_text = {},
    const std::function<void(int, int)>& on_prompt_progress = {});

}  // namespace lamina::engine
