// gpt-oss's harmony messages in generated text: reasoning, content and tool calls, whole or
// streamed.
#include "chat/harmony.h"

#include <algorithm>
#include <array>

namespace lamina::chat {

namespace {

constexpr std::array<std::string_view, 7> kMarkers = {
    kHarmonyStart, kHarmonyChannel, kHarmonyMessage, kHarmonyConstrain,
    kHarmonyEnd,   kHarmonyReturn,  kHarmonyCall};
constexpr std::string_view kFunctions = "functions.";

bool StartsWith(std::string_view s, size_t at, std::string_view prefix) {
  return s.substr(at, prefix.size()) == prefix;
}

// The word after `at` (up to white space, '<' or the end).
std::string_view WordAt(std::string_view s, size_t at) {
  size_t end = at;
  while (end < s.size() && s[end] != ' ' && s[end] != '\n' && s[end] != '<') ++end;
  return s.substr(at, end - at);
}

std::string_view Trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Where a message header may start: a new message or its channel.
bool HeaderStartsAt(std::string_view s, size_t at) {
  return StartsWith(s, at, kHarmonyStart) || StartsWith(s, at, kHarmonyChannel) ||
         StartsWith(s, at, " to=") || StartsWith(s, at, "to=");
}

// The first header start at or after `from` (npos: none): only the markers, since " to=" may be
// plain text.
size_t NextHeader(std::string_view s, size_t from) {
  return std::min(s.find(kHarmonyStart, from), s.find(kHarmonyChannel, from));
}

// Where a body starting at `from` ends: its terminator, or the next message, or the end; *skip:
// the terminator's length (0 when none is consumed).
size_t BodyEnd(std::string_view s, size_t from, size_t* skip) {
  size_t end = s.size();
  *skip = 0;
  for (std::string_view t : {kHarmonyEnd, kHarmonyReturn, kHarmonyCall, kHarmonyStart}) {
    const size_t at = s.find(t, from);
    if (at < end) {
      end = at;
      *skip = t == kHarmonyStart ? 0 : t.size();
    }
  }
  return end;
}

void Append(std::string& to, std::string_view text, std::string_view separator) {
  if (text.empty()) return;
  if (!to.empty()) to += separator;
  to += text;
}

// One header's routing: the channel and recipient, as the header text names them.
void Route(std::string_view header, std::string_view body, bool ended, bool final,
           HarmonyParse* out) {
  std::string_view channel, recipient;
  if (const size_t c = header.find(kHarmonyChannel); c != std::string_view::npos) {
    channel = WordAt(header, c + kHarmonyChannel.size());
  }
  if (const size_t r = header.find("to="); r != std::string_view::npos) {
    recipient = WordAt(header, r + 3);
  }
  if (!recipient.empty() && recipient != "assistant") {
    // A call: its arguments once the message is complete. Recipients other than functions.*
    // (the built-in browser and python tools) are not the client's: dropped, as llama.cpp does.
    // Arguments that are not one JSON value (a call cut off by the token limit) stay content.
    if (recipient.starts_with(kFunctions) && recipient.size() > kFunctions.size() &&
        (ended || final)) {
      const std::string_view args = Trim(body);
      if (args.empty() || IsJson(args)) {
        out->calls.push_back({std::string(recipient.substr(kFunctions.size())),
                              args.empty() ? std::string("{}") : std::string(args)});
      } else {
        out->content += body;
      }
    }
    return;
  }
  if (channel == "analysis") {
    Append(out->reasoning, body, "\n");
  } else {
    out->content += body;
  }
}

// The parse of `s`; unless `final`, an unfinished header and an unfinished call are left out
// (they may still become something else).
HarmonyParse Parse(std::string_view s, bool final) {
  HarmonyParse out;
  size_t i = 0;
  while (i < s.size()) {
    if (!final && (std::string_view(" to=").starts_with(s.substr(i)) ||
                   std::string_view("to=").starts_with(s.substr(i)))) {
      break;  // may become a recipient
    }
    if (!HeaderStartsAt(s, i)) {  // text outside the structure
      const size_t next = NextHeader(s, i + 1);
      const size_t end = next == std::string_view::npos ? s.size() : next;
      out.content += s.substr(i, end - i);
      i = end;
      continue;
    }
    const size_t m = s.find(kHarmonyMessage, i);
    size_t skip = 0;
    const size_t cut = BodyEnd(s, i + 1, &skip);  // a header holds no terminator
    if (m == std::string_view::npos || m > cut) {
      if (!final) break;  // the header may still be completed
      out.content += s.substr(i, cut - i);
      i = cut + skip;
      continue;
    }
    const size_t body = m + kHarmonyMessage.size();
    const size_t end = BodyEnd(s, body, &skip);
    const bool ended = end < s.size();
    Route(s.substr(i, m - i), s.substr(body, end - body), ended, final, &out);
    i = end + skip;
  }
  return out;
}

// The length of `s` without a trailing proper prefix of a marker.
size_t StableLength(std::string_view s) {
  const size_t lt = s.rfind('<');
  if (lt == std::string_view::npos) return s.size();
  const std::string_view tail = s.substr(lt);
  for (std::string_view m : kMarkers) {
    if (tail.size() < m.size() && m.substr(0, tail.size()) == tail) return lt;
  }
  return s.size();
}

}  // namespace

bool IsHarmonyTemplate(std::string_view t) {
  return t.find(kHarmonyChannel) != std::string_view::npos &&
         t.find(kHarmonyMessage) != std::string_view::npos &&
         t.find(kHarmonyStart) != std::string_view::npos;
}

HarmonyParse ParseHarmony(std::string_view text) { return Parse(text, true); }

HarmonyParse HarmonyStream::Push(std::string_view text) {
  all_ += text;
  return Delta(false);
}

HarmonyParse HarmonyStream::Flush() { return Delta(true); }

HarmonyParse HarmonyStream::Delta(bool final) {
  const std::string_view all = all_;
  HarmonyParse now = Parse(final ? all : all.substr(0, StableLength(all)), final);
  HarmonyParse d;
  // What was released is a prefix of what is parsed now (held-back text only ever extends it).
  if (now.reasoning.size() > reasoning_out_) d.reasoning = now.reasoning.substr(reasoning_out_);
  if (now.content.size() > content_out_) d.content = now.content.substr(content_out_);
  for (size_t c = calls_out_; c < now.calls.size(); ++c) d.calls.push_back(now.calls[c]);
  reasoning_out_ = std::max(reasoning_out_, now.reasoning.size());
  content_out_ = std::max(content_out_, now.content.size());
  calls_out_ = std::max(calls_out_, now.calls.size());
  return d;
}

}  // namespace lamina::chat
