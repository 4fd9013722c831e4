// ReasoningSplitter: a small state machine over held-back text.
#include "chat/reasoning.h"

#include <cstddef>

namespace lamina::chat {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

size_t SkipSpace(std::string_view s, size_t at = 0) {
  while (at < s.size() && IsSpace(s[at])) ++at;
  return at;
}

// The length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t PartialTagTail(std::string_view s, std::string_view tag) {
  for (size_t len = std::min(s.size(), tag.size() - 1); len > 0; --len) {
    if (s.substr(s.size() - len) == tag.substr(0, len)) return len;
  }
  return 0;
}

}  // namespace

bool ReasoningFormatFromName(std::string_view name, ReasoningFormat* out) {
  if (name == "none") {
    *out = ReasoningFormat::kNone;
  } else if (name == "deepseek" || name == "auto") {
    *out = ReasoningFormat::kDeepseek;
  } else if (name == "deepseek-legacy") {
    *out = ReasoningFormat::kDeepseekLegacy;
  } else {
    return false;
  }
  return true;
}

bool PromptOpensThinking(std::string_view prompt) {
  size_t end = prompt.size();
  while (end > 0 && IsSpace(prompt[end - 1])) --end;
  return prompt.substr(0, end).ends_with(kThinkOpen);
}

ReasoningSplitter::ReasoningSplitter(ReasoningFormat format, bool starts_inside)
    : format_(format), state_(starts_inside ? State::kReasoning : State::kStart) {}

ReasoningDelta ReasoningSplitter::Push(std::string_view text) {
  held_ += text;
  return Run(false);
}

ReasoningDelta ReasoningSplitter::Flush() { return Run(true); }

ReasoningDelta ReasoningSplitter::Run(bool final) {
  ReasoningDelta out;
  const bool legacy = format_ == ReasoningFormat::kDeepseekLegacy;
  if (format_ == ReasoningFormat::kNone) {
    out.content.swap(held_);
    return out;
  }
  for (;;) {
    switch (state_) {
      case State::kStart: {
        // Leading white space, then the open tag or not.
        const size_t at = SkipSpace(held_);
        const std::string_view rest = std::string_view(held_).substr(at);
        if (rest.starts_with(kThinkOpen)) {
          if (legacy) out.content += held_.substr(0, at + kThinkOpen.size());
          held_.erase(0, at + kThinkOpen.size());
          state_ = State::kReasoning;
          continue;
        }
        if (!final && kThinkOpen.starts_with(rest)) return out;  // maybe the tag
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        // White space right after the open tag is dropped.
        if (!reasoning_started_) {
          const size_t at = SkipSpace(held_);
          if (legacy) out.content += held_.substr(0, at);
          held_.erase(0, at);
          if (held_.empty()) return out;
          reasoning_started_ = true;
        }
        const size_t close = held_.find(kThinkClose);
        if (close != std::string::npos) {
          size_t end = close;
          while (end > 0 && IsSpace(held_[end - 1])) --end;
          out.reasoning += held_.substr(0, end);
          if (legacy) out.content += held_.substr(0, close + kThinkClose.size());
          held_.erase(0, close + kThinkClose.size());
          state_ = State::kContentStart;
          continue;
        }
        if (final) {  // the answer ended inside the block
          size_t end = held_.size();
          while (end > 0 && IsSpace(held_[end - 1])) --end;
          out.reasoning += held_.substr(0, end);
          if (legacy) out.content += held_;
          held_.clear();
          return out;
        }
        // Hold back a possible start of the close tag and trailing white space.
        size_t keep = held_.size() - PartialTagTail(held_, kThinkClose);
        while (keep > 0 && IsSpace(held_[keep - 1])) --keep;
        out.reasoning += held_.substr(0, keep);
        if (legacy) out.content += held_.substr(0, keep);
        held_.erase(0, keep);
        return out;
      }
      case State::kContentStart: {
        const size_t at = SkipSpace(held_);
        if (legacy) out.content += held_.substr(0, at);
        held_.erase(0, at);
        if (held_.empty() && !final) return out;
        state_ = State::kContent;
        continue;
      }
      case State::kContent:
        out.content += held_;
        held_.clear();
        return out;
    }
  }
}

}  // namespace lamina::chat
