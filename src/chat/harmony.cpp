// gpt-oss's harmony messages in generated text: reasoning, content and tool calls, whole or
// streamed.
#include "chat/harmony.h"

#include <algorithm>
#include <array>
#include <utility>

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

// A header's channel and recipient (`<|channel|>NAME`, `to=NAME`), empty where it names none.
std::pair<std::string_view, std::string_view> HeaderNames(std::string_view header) {
  std::string_view channel, recipient;
  if (const size_t c = header.find(kHarmonyChannel); c != std::string_view::npos) {
    channel = WordAt(header, c + kHarmonyChannel.size());
  }
  if (const size_t r = header.find("to="); r != std::string_view::npos) {
    recipient = WordAt(header, r + 3);
  }
  return {channel, recipient};
}

void Append(std::string& to, std::string_view text, std::string_view separator) {
  if (text.empty()) return;
  if (!to.empty()) to += separator;
  to += text;
}

// One header's routing: the channel and recipient, as the header text names them.
void Route(std::string_view header, std::string_view body, bool ended, bool final,
           HarmonyParse* out) {
  const std::pair<std::string_view, std::string_view> names = HeaderNames(header);
  const std::string_view channel = names.first, recipient = names.second;
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

// The length of `s` without a trailing proper prefix of a marker (which starts at the last '<'
// and is shorter than the longest marker, so only the last bytes are looked at).
size_t StableLength(std::string_view s) {
  constexpr size_t kLongest = kHarmonyConstrain.size();
  const size_t from = s.size() >= kLongest ? s.size() - (kLongest - 1) : 0;
  const size_t at = s.substr(from).rfind('<');
  if (at == std::string_view::npos) return s.size();
  const size_t lt = from + at;
  const std::string_view tail = s.substr(lt);
  for (std::string_view m : kMarkers) {
    if (tail.size() < m.size() && m.substr(0, tail.size()) == tail) return lt;
  }
  return s.size();
}

// A search that found nothing in s[from, end) resumes here once more text has come: a marker
// found later may begin in the last bytes already searched.
size_t Resume(std::string_view s, size_t from) {
  constexpr size_t kOverlap = kHarmonyConstrain.size();
  return std::max(from, s.size() >= kOverlap ? s.size() - kOverlap : 0);
}

// The first of `markers` at or after `from` (npos: none); *skip: its length, or 0 for <|start|>
// (which begins the next message rather than ending this one).
template <size_t N>
size_t FirstOf(std::string_view s, size_t from, const std::array<std::string_view, N>& markers,
               size_t* skip) {
  size_t best = std::string_view::npos;
  for (std::string_view m : markers) {
    const size_t at = s.find(m, from);
    if (at < best) {
      best = at;
      if (skip != nullptr) *skip = m == kHarmonyStart ? 0 : m.size();
    }
  }
  return best;
}

constexpr std::array<std::string_view, 4> kBodyEnds = {kHarmonyEnd, kHarmonyReturn, kHarmonyCall,
                                                       kHarmonyStart};
constexpr std::array<std::string_view, 2> kHeaderStarts = {kHarmonyStart, kHarmonyChannel};

}  // namespace

bool IsHarmonyTemplate(std::string_view t) {
  return t.find(kHarmonyChannel) != std::string_view::npos &&
         t.find(kHarmonyMessage) != std::string_view::npos &&
         t.find(kHarmonyStart) != std::string_view::npos;
}

HarmonyParse ParseHarmony(std::string_view text) { return Parse(text, true); }

// The stream reads the answer unit by unit as Parse does, and commits each unit once its end is
// in the text: a unit's output never changes afterwards, so only the open unit is looked at
// again, from where its searches stopped. The open unit's text is released as Parse(final =
// false) would release it; the units' results together are Parse(final = true)'s.
HarmonyParse HarmonyStream::Push(std::string_view text) {
  all_ += text;
  return Run(false);
}

HarmonyParse HarmonyStream::Flush() { return Run(true); }

HarmonyParse HarmonyStream::Run(bool final) {
  const std::string_view all = all_;
  const std::string_view s = final ? all : all.substr(0, StableLength(all));
  HarmonyParse out;
  while (Step(s, final, &out)) {
  }
  return out;
}

bool HarmonyStream::Step(std::string_view s, bool final, HarmonyParse* out) {
  switch (unit_) {
    case Unit::kStart: {
      if (pos_ >= s.size()) return false;
      const std::string_view rest = s.substr(pos_);
      if (!final && (std::string_view(" to=").starts_with(rest) ||
                     std::string_view("to=").starts_with(rest))) {
        return false;  // may become a recipient
      }
      unit_ = HeaderStartsAt(s, pos_) ? Unit::kHeader : Unit::kOutside;
      emitted_ = pos_;
      scan_ = unit_ == Unit::kHeader ? pos_ : pos_ + 1;
      return true;
    }
    case Unit::kOutside:
      return StepOutside(s, final, out);
    case Unit::kHeader:
      return StepHeader(s, final, out);
    case Unit::kBody:
      return StepBody(s, final, out);
  }
  return false;
}

// Text outside the structure runs to the next header start.
bool HarmonyStream::StepOutside(std::string_view s, bool final, HarmonyParse* out) {
  const size_t next = FirstOf(s, scan_, kHeaderStarts, nullptr);
  const size_t end = next == std::string_view::npos ? s.size() : next;
  out->content += s.substr(emitted_, end - emitted_);
  emitted_ = end;
  if (next == std::string_view::npos) {
    scan_ = Resume(s, scan_);
    return false;
  }
  pos_ = next;
  unit_ = Unit::kStart;
  return true;
}

// A header ends at its `<|message|>`; a terminator or a new message before it makes it text.
bool HarmonyStream::StepHeader(std::string_view s, bool final, HarmonyParse* out) {
  const size_t m = s.find(kHarmonyMessage, scan_);
  size_t skip = 0;
  const size_t cut = FirstOf(s, std::max(scan_, pos_ + 1), kBodyEnds, &skip);
  if (m != std::string_view::npos && m < cut) {
    const std::string_view header = s.substr(pos_, m - pos_);
    const std::pair<std::string_view, std::string_view> names = HeaderNames(header);
    const std::string_view channel = names.first, recipient = names.second;
    if (!recipient.empty() && recipient != "assistant") {
      const bool function =
          recipient.starts_with(kFunctions) && recipient.size() > kFunctions.size();
      sink_ = function ? Sink::kCall : Sink::kDropped;
      call_name_ = function ? std::string(recipient.substr(kFunctions.size())) : "";
    } else {
      sink_ = channel == "analysis" ? Sink::kReasoning : Sink::kContent;
    }
    body_ = emitted_ = scan_ = m + kHarmonyMessage.size();
    body_started_ = false;
    unit_ = Unit::kBody;
    return true;
  }
  if (cut != std::string_view::npos || final) {  // never a header: its text is content
    const size_t end = cut == std::string_view::npos ? s.size() : cut;
    out->content += s.substr(pos_, end - pos_);
    pos_ = end + (cut == std::string_view::npos ? 0 : skip);
    unit_ = Unit::kStart;
    return cut != std::string_view::npos;
  }
  scan_ = Resume(s, scan_);
  return false;
}

// A body runs to its terminator (or the next message); reasoning and content are released as
// they come, a call once it has ended.
bool HarmonyStream::StepBody(std::string_view s, bool final, HarmonyParse* out) {
  size_t skip = 0;
  const size_t found = FirstOf(s, scan_, kBodyEnds, &skip);
  const size_t end = found == std::string_view::npos ? s.size() : found;
  if (sink_ == Sink::kReasoning || sink_ == Sink::kContent) {
    EmitBody(s.substr(emitted_, end - emitted_), out);
    emitted_ = end;
  }
  if (found == std::string_view::npos && !final) {
    scan_ = Resume(s, scan_);
    return false;
  }
  if (sink_ == Sink::kCall) {  // ended, or cut off by the end of the answer
    const std::string_view body = s.substr(body_, end - body_);
    const std::string_view args = Trim(body);
    if (args.empty() || IsJson(args)) {
      out->calls.push_back({call_name_, args.empty() ? std::string("{}") : std::string(args)});
    } else {
      out->content += body;
    }
  }
  pos_ = end + skip;
  unit_ = Unit::kStart;
  return found != std::string_view::npos;
}

void HarmonyStream::EmitBody(std::string_view text, HarmonyParse* out) {
  if (text.empty()) return;
  if (sink_ == Sink::kContent) {
    out->content += text;
    return;
  }
  if (!body_started_ && reasoning_any_) out->reasoning += '\n';  // Append's separator
  body_started_ = true;
  reasoning_any_ = true;
  out->reasoning += text;
}

}  // namespace lamina::chat
