// The thinking probe: tasks the model does well asked with its thinking on (a count up, a count
// down, a list to copy). Each answer must close its thought with </think> and then give the exact
// answer, as the plain counting and copy probes grade it; each leg's whole texts are compared
// byte for byte with the reference leg's. A model that never closes a thought (it does not
// think) gets n/a.
#include <algorithm>
#include <cstdio>

#include "chat/reasoning.h"
#include "probe/probes.h"

namespace lamina::probe {

namespace {

struct ThinkingTask {
  std::string name;      // "count 1..20"
  std::string user;      // the user turn
  std::string expected;  // the answer, lines joined by '\n'
  bool prefix = false;   // the answer only has to start with `expected` (the copy probe's rule)
};

// The numbers from..to (either direction), one per line.
std::string NumberLines(int from, int to) {
  std::string out;
  const int step = from <= to ? 1 : -1;
  for (int v = from;; v += step) {
    out += std::to_string(v);
    if (v == to) break;
    out += "\n";
  }
  return out;
}

// The shipped model's phrasings (train/data.py); counts sized by --count-to, kept short.
std::vector<ThinkingTask> ThinkingTasks(const RunContext& ctx) {
  const int up = std::max(1, std::min(ctx.config.count_to, 30));
  const int down = std::max(2, std::min(ctx.config.count_to, 15));
  std::vector<ThinkingTask> tasks;
  tasks.push_back({"count 1.." + std::to_string(up),
                   "Count from 1 to " + std::to_string(up) + ", one number per line.",
                   NumberLines(1, up)});
  tasks.push_back({"count down " + std::to_string(down) + "..1",
                   "Count down from " + std::to_string(down) + " to 1, one number per line.",
                   NumberLines(down, 1)});
  const std::string list = SeededList(ctx.config.seed * 65537 + 11, 10);
  tasks.push_back({"copy 10 items", "Repeat this list exactly, one item per line:\n" + list, list,
                   /*prefix=*/true});
  return tasks;
}

// Splits a generated text at its first </think>: the thought (a leading <think> dropped, as a
// model whose prompt does not open the block writes it) and the answer, both trimmed.
void SplitThought(const std::string& text, ThinkingItem& item) {
  const size_t close = text.find(chat::kThinkClose);
  item.closed = close != std::string::npos;
  std::string thought = Trim(text.substr(0, close));
  if (thought.rfind(chat::kThinkOpen, 0) == 0) {
    thought = Trim(thought.substr(chat::kThinkOpen.size()));
  }
  item.thought = thought;
  item.answer = item.closed ? Trim(text.substr(close + chat::kThinkClose.size())) : "";
}

// One task on one leg: generated with thinking on, split and graded.
ThinkingItem RunTask(const RunContext& ctx, size_t leg, const ThinkingTask& task) {
  // Room for a one-sentence thought, then the answer; the generation stops once the answer has
  // run past what was asked for, or a thought runs on without closing.
  constexpr int kThoughtTokens = 64;
  constexpr size_t kThoughtBytes = 600;
  const size_t answer_bytes = task.expected.size();
  const bool prefix = task.prefix;
  GenerationRequest request;
  request.user = task.user;
  request.thinking = true;
  request.max_tokens = TokenBudget(ctx, leg, task.expected) + kThoughtTokens + 16;
  request.stop = [answer_bytes, prefix](const std::string& text) {
    const size_t close = text.find(chat::kThinkClose);
    if (close == std::string::npos) return text.size() > kThoughtBytes;
    const size_t answer = Trim(text.substr(close + chat::kThinkClose.size())).size();
    return prefix ? answer >= answer_bytes : answer > answer_bytes + 8;
  };
  const Generation g = ctx.legs[leg].backend->Generate(request);
  ThinkingItem item;
  item.task = task.name;
  item.expected = task.expected;
  item.output = g.text;
  if (g.error) item.error = g.error_message;
  SplitThought(g.text, item);
  const bool answer_ok =
      task.prefix ? item.answer.rfind(task.expected, 0) == 0 : item.answer == task.expected;
  item.right = !g.error && item.closed && answer_ok;
  return item;
}

// The table cell: right and closed counts, then (other legs) whether the texts match the
// reference's byte for byte.
std::string ThinkingCell(const ThinkingResult& p, bool reference) {
  const std::string n = std::to_string(p.items.size());
  std::string cell = "right " + std::to_string(p.right) + "/" + n;
  if (p.closed < static_cast<int>(p.items.size())) {
    cell += ", closed " + std::to_string(p.closed) + "/" + n;
  }
  if (reference) return cell;
  if (!p.first_difference) return cell + ", same text";
  char buf[64];
  std::snprintf(buf, sizeof(buf), ", differs at item %d byte %lld", p.first_difference->item,
                static_cast<long long>(p.first_difference->byte));
  return cell + buf;
}

// The first task the reference got right and this leg did not, and how it went wrong.
std::string FirstMiss(const std::vector<ThinkingItem>& items, const std::vector<bool>& ref_right) {
  for (size_t k = 0; k < items.size(); ++k) {
    if (!ref_right[k] || items[k].right) continue;
    return items[k].task + (items[k].closed ? " (wrong answer)" : " (no </think>)");
  }
  return "none";
}

}  // namespace

std::vector<ThinkingResult> RunThinkingProbe(const RunContext& ctx) {
  const std::vector<ThinkingTask> tasks = ThinkingTasks(ctx);
  std::vector<ThinkingResult> results;
  std::vector<std::string> ref_outputs;
  std::vector<bool> ref_right;  // per task, reference leg
  int ref_closed = 0, ref_total = 0;
  for (size_t i = 0; i < ctx.legs.size(); ++i) {
    ctx.Progress("thinking", i);
    ThinkingResult p;
    std::string error;
    std::vector<std::string> outs;
    int right_on_ref = 0;
    for (size_t k = 0; k < tasks.size(); ++k) {
      ThinkingItem item = RunTask(ctx, i, tasks[k]);
      if (i == 0) ref_right.push_back(item.right);
      p.closed += item.closed;
      p.right += item.right;
      right_on_ref += item.right && ref_right[k];
      if (!item.error.empty() && error.empty()) error = item.error;
      outs.push_back(item.output);
      p.items.push_back(std::move(item));
    }
    if (i == 0) {
      ref_outputs = outs;
      ref_closed = p.closed;
      ref_total = p.right;
    }
    p.first_difference = FirstDifferenceFromReference(outs, ref_outputs);
    p.outcome.cell = ThinkingCell(p, i == 0);
    if (error.empty() && ref_closed == 0) {
      p.outcome.status = Status::kNotApplicable;
      p.outcome.reason = "the model does not think: no </think> in the reference's answers";
    } else {
      RateVerdict(ctx, p.outcome, ref_total ? static_cast<double>(right_on_ref) / ref_total : 0.0,
                  ref_total ? 1.0 : 0.0, "closed thought + right answer",
                  "model cannot do the thinking tasks: reference leg fails too", error);
      if (p.outcome.status == Status::kFail && error.empty()) {
        p.outcome.reason += "; first miss: " + FirstMiss(p.items, ref_right);
      }
    }
    results.push_back(std::move(p));
  }
  return results;
}

}  // namespace lamina::probe
