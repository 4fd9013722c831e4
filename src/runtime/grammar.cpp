// GBNF parser (rules → flat alternatives of code-point elements, repetitions rewritten into
// helper rules, left recursion refused) and the pushdown matcher behind constrained sampling.
#include "runtime/grammar.h"

#include <algorithm>
#include <map>
#include <set>

#include "tokenizer/unicode.h"

namespace lamina {

bool Grammar::CharSet::Contains(uint32_t cp) const {
  bool in = false;
  for (const auto& [lo, hi] : ranges) {
    if (cp >= lo && cp <= hi) {
      in = true;
      break;
    }
  }
  return in != negated;
}

bool Grammar::CharSet::Intersects(uint32_t lo, uint32_t hi) const {
  if (!negated) {
    for (const auto& [a, b] : ranges) {
      if (a <= hi && b >= lo) return true;
    }
    return false;
  }
  // Some point of [lo, hi] outside every range: walk up from lo past the ranges covering it.
  uint32_t at = lo;
  bool moved = true;
  while (moved) {
    moved = false;
    for (const auto& [a, b] : ranges) {
      if (a <= at && b >= at) {
        if (b >= hi) return false;
        at = b + 1;
        moved = true;
      }
    }
  }
  return at <= hi;
}

// ---------------------------------------------------------------------------------------------
// Parser.

class GrammarBuilder {
 public:
  explicit GrammarBuilder(std::string_view src) : src_(src) {}

  Result<std::shared_ptr<const Grammar>> Build(std::string_view root_name) {
    if (src_.size() > kMaxGrammarBytes) {
      return Error{"grammar: " + std::to_string(src_.size()) + " bytes, over the limit of " +
                   std::to_string(kMaxGrammarBytes)};
    }
    while (true) {
      SkipSpace(/*newline_ok=*/true);
      if (AtEnd()) break;
      if (!ParseRule()) return Error{error_};
    }
    if (defined_.empty()) return Error{"grammar: no rules"};
    for (uint32_t r = 0; r < rules_.size(); ++r) {
      if (!defined_.count(r)) {
        return Error{"grammar: " + Where(first_use_[r]) + ": rule '" + names_[r] +
                     "' is used but never defined"};
      }
    }
    auto root = ids_.find(std::string(root_name));
    if (root == ids_.end()) {
      return Error{"grammar: no rule named '" + std::string(root_name) + "' (the start rule)"};
    }
    if (!CheckLeftRecursion()) return Error{error_};
    auto g = std::make_shared<Grammar>();
    g->root_ = root->second;
    g->char_sets_ = std::move(sets_);
    g->rule_names_ = names_;
    g->rule_alts_.resize(rules_.size());
    for (uint32_t r = 0; r < rules_.size(); ++r) {
      for (const auto& alt : rules_[r]) {
        g->rule_alts_[r].push_back(static_cast<uint32_t>(g->elems_.size()));
        g->elems_.insert(g->elems_.end(), alt.begin(), alt.end());
        g->elems_.push_back({Grammar::ElemType::kEnd, 0});
      }
    }
    return std::shared_ptr<const Grammar>(std::move(g));
  }

 private:
  using Elem = Grammar::Elem;
  using Seq = std::vector<Elem>;
  using Alts = std::vector<Seq>;

  bool AtEnd() const { return pos_ >= src_.size(); }
  char Peek(size_t ahead = 0) const {
    return pos_ + ahead < src_.size() ? src_[pos_ + ahead] : '\0';
  }

  std::string Where(size_t at) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(col);
  }
  bool Fail(const std::string& what, size_t at) {
    if (error_.empty()) error_ = "grammar: " + Where(at) + ": " + what;
    return false;
  }
  bool Fail(const std::string& what) { return Fail(what, pos_); }

  void SkipSpace(bool newline_ok) {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && Peek() != '\n') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  static bool IsNameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  }

  std::string ParseName() {
    const size_t start = pos_;
    while (!AtEnd() && IsNameChar(Peek())) ++pos_;
    return std::string(src_.substr(start, pos_ - start));
  }

  uint32_t RuleId(const std::string& name, size_t at) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const uint32_t id = static_cast<uint32_t>(rules_.size());
    ids_.emplace(name, id);
    names_.push_back(name);
    rules_.emplace_back();
    first_use_.push_back(at);
    return id;
  }

  // A rule for a group or repetition; '#' keeps its name apart from every name the source may
  // define later (a JSON schema's converter names rules "root-1", "root-2", ...).
  uint32_t NewRule(const std::string& base) {
    std::string name;
    do {
      name = base + "#" + std::to_string(++generated_);
    } while (ids_.count(name));
    const uint32_t id = RuleId(name, pos_);
    defined_.insert(id);
    return id;
  }

  bool CountElems(size_t n) {
    n_elems_ += n;
    if (n_elems_ > kMaxGrammarElements) {
      return Fail("the grammar expands to over " + std::to_string(kMaxGrammarElements) +
                  " elements");
    }
    return true;
  }

  bool ParseRule() {
    const size_t start = pos_;
    const std::string name = ParseName();
    if (name.empty()) return Fail("expected a rule name");
    SkipSpace(false);
    if (src_.substr(pos_, 3) != "::=") return Fail("expected '::=' after rule name '" + name + "'");
    pos_ += 3;
    SkipSpace(true);
    const uint32_t id = RuleId(name, start);
    if (defined_.count(id)) return Fail("rule '" + name + "' is defined twice", start);
    defined_.insert(id);
    Alts alts;
    if (!ParseAlternatives(name, /*nested=*/false, &alts)) return false;
    rules_[id] = std::move(alts);
    SkipSpace(false);
    if (AtEnd()) return true;
    if (Peek() == '\r') ++pos_;
    if (Peek() != '\n') return Fail("expected the end of the line after rule '" + name + "'");
    ++pos_;
    return true;
  }

  bool ParseAlternatives(const std::string& rule_name, bool nested, Alts* alts) {
    if (depth_ > kMaxGrammarNesting) {  // depth_ counts the rule itself, then its groups
      return Fail("groups nest deeper than the limit of " + std::to_string(kMaxGrammarNesting));
    }
    ++depth_;
    while (true) {
      Seq seq;
      if (!ParseSequence(rule_name, nested, &seq)) {
        --depth_;
        return false;
      }
      alts->push_back(std::move(seq));
      if (!nested && (Peek() == '\n' || Peek() == '\r')) {
        // A rule may go on with `| ...` on the next line.
        const size_t line_end = pos_;
        SkipSpace(true);
        if (Peek() != '|') pos_ = line_end;
      }
      if (Peek() != '|') break;
      ++pos_;
      SkipSpace(true);
    }
    --depth_;
    return true;
  }

  // One code point of a literal or class, escapes decoded.
  bool ParseChar(uint32_t* cp) {
    if (AtEnd()) return Fail("unexpected end of the grammar");
    if (Peek() == '\\') {
      const char e = Peek(1);
      pos_ += 2;
      int hex_digits = 0;
      switch (e) {
        case 'n':
          *cp = '\n';
          return true;
        case 'r':
          *cp = '\r';
          return true;
        case 't':
          *cp = '\t';
          return true;
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
          *cp = static_cast<uint8_t>(e);
          return true;
        case 'x':
          hex_digits = 2;
          break;
        case 'u':
          hex_digits = 4;
          break;
        case 'U':
          hex_digits = 8;
          break;
        default:
          return Fail(std::string("unknown escape '\\") + e + "'", pos_ - 2);
      }
      uint32_t v = 0;
      for (int i = 0; i < hex_digits; ++i) {
        const char h = Peek();
        int d;
        if (h >= '0' && h <= '9') {
          d = h - '0';
        } else if (h >= 'a' && h <= 'f') {
          d = h - 'a' + 10;
        } else if (h >= 'A' && h <= 'F') {
          d = h - 'A' + 10;
        } else {
          return Fail("expected " + std::to_string(hex_digits) + " hex digits");
        }
        v = v * 16 + d;
        ++pos_;
      }
      if (v > 0x10FFFF) return Fail("code point above U+10FFFF", pos_ - hex_digits);
      *cp = v;
      return true;
    }
    size_t at = pos_;
    if (!unicode::DecodeOne(src_, &at, cp)) return Fail("invalid UTF-8");
    pos_ = at;
    return true;
  }

  uint32_t AddSet(Grammar::CharSet set) {
    sets_.push_back(std::move(set));
    return static_cast<uint32_t>(sets_.size() - 1);
  }

  // A string literal: one single-code-point element per code point.
  bool ParseLiteral(Seq* seq) {
    const size_t at = pos_;
    ++pos_;
    while (!AtEnd() && Peek() != '"') {
      if (Peek() == '\n') return Fail("unterminated string", at);
      uint32_t cp;
      if (!ParseChar(&cp)) return false;
      Grammar::CharSet set;
      set.ranges.push_back({cp, cp});
      if (!CountElems(1)) return false;
      seq->push_back({Grammar::ElemType::kChar, AddSet(std::move(set))});
    }
    if (AtEnd()) return Fail("unterminated string", at);
    ++pos_;
    return true;
  }

  // A character class [...] or [^...]: one element.
  bool ParseCharClass(Seq* seq) {
    const size_t at = pos_;
    ++pos_;
    Grammar::CharSet set;
    if (Peek() == '^') {
      set.negated = true;
      ++pos_;
    }
    while (!AtEnd() && Peek() != ']') {
      if (Peek() == '\n') return Fail("unterminated character class", at);
      uint32_t lo, hi;
      if (!ParseChar(&lo)) return false;
      hi = lo;
      if (Peek() == '-' && Peek(1) != ']' && pos_ + 1 < src_.size()) {
        ++pos_;
        if (!ParseChar(&hi)) return false;
        if (hi < lo) return Fail("character range is backwards");
      }
      set.ranges.push_back({lo, hi});
    }
    if (AtEnd()) return Fail("unterminated character class", at);
    ++pos_;
    if (!CountElems(1)) return false;
    seq->push_back({Grammar::ElemType::kChar, AddSet(std::move(set))});
    return true;
  }

  // A parenthesised group: a helper rule of its alternatives, referenced by one element.
  bool ParseGroup(const std::string& rule_name, Seq* seq) {
    const size_t at = pos_;
    ++pos_;
    SkipSpace(true);
    const uint32_t sub = NewRule(rule_name);
    Alts alts;
    if (!ParseAlternatives(rule_name, /*nested=*/true, &alts)) return false;
    rules_[sub] = std::move(alts);
    if (Peek() != ')') return Fail("expected ')' to close the group", at);
    ++pos_;
    if (!CountElems(1)) return false;
    seq->push_back({Grammar::ElemType::kRule, sub});
    return true;
  }

  // A repetition operator (*, +, ? or {m}, {m,}, {m,n}) after an item: *min -1 when there is
  // none; *max -1 for unbounded.
  bool ParseRepetition(bool nested, int* min, int* max) {
    *min = -1;
    *max = -1;
    const size_t op_at = pos_;
    if (Peek() == '*') {
      *min = 0;
      ++pos_;
    } else if (Peek() == '+') {
      *min = 1;
      ++pos_;
    } else if (Peek() == '?') {
      *min = 0;
      *max = 1;
      ++pos_;
    } else if (Peek() == '{') {
      ++pos_;
      SkipSpace(nested);
      if (!ParseCount(min)) return false;
      SkipSpace(nested);
      *max = *min;
      if (Peek() == ',') {
        ++pos_;
        SkipSpace(nested);
        *max = -1;
        if (Peek() >= '0' && Peek() <= '9') {
          if (!ParseCount(max)) return false;
          if (*max < *min) return Fail("repetition {m,n} with n < m", op_at);
        }
        SkipSpace(nested);
      }
      if (Peek() != '}') return Fail("expected '}'");
      ++pos_;
    }
    return true;
  }

  bool ParseSequence(const std::string& rule_name, bool nested, Seq* seq) {
    while (!AtEnd()) {
      const size_t item_start = seq->size();
      const size_t at = pos_;
      const char c = Peek();
      if (c == '"') {
        if (!ParseLiteral(seq)) return false;
      } else if (c == '[') {
        if (!ParseCharClass(seq)) return false;
      } else if (c == '.') {
        ++pos_;
        Grammar::CharSet any;
        any.negated = true;
        if (!CountElems(1)) return false;
        seq->push_back({Grammar::ElemType::kChar, AddSet(std::move(any))});
      } else if (IsNameChar(c)) {
        const std::string name = ParseName();
        if (!CountElems(1)) return false;
        seq->push_back({Grammar::ElemType::kRule, RuleId(name, at)});
      } else if (c == '(') {
        if (!ParseGroup(rule_name, seq)) return false;
      } else {
        break;  // '|', ')', a newline or something the caller reports
      }
      SkipSpace(nested);
      // Repetition of the item just parsed.
      int min, max;
      if (!ParseRepetition(nested, &min, &max)) return false;
      if (min >= 0) {
        if (!Repeat(rule_name, item_start, min, max, seq)) return false;
        SkipSpace(nested);
      }
    }
    if (!AtEnd()) {
      const char c = Peek();
      const bool ok = c == '|' || (nested && c == ')') || (!nested && (c == '\n' || c == '\r'));
      if (!ok) {
        if (c == ')') return Fail("unexpected ')'");
        return Fail(std::string("unexpected character '") + c + "'");
      }
    } else if (nested) {
      return Fail("expected ')' before the end of the grammar");
    }
    return true;
  }

  bool ParseCount(int* out) {
    if (!(Peek() >= '0' && Peek() <= '9')) return Fail("expected a number");
    long v = 0;
    while (Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + (Peek() - '0');
      if (v > kMaxGrammarRepeat) {
        return Fail("repetition count over the limit of " + std::to_string(kMaxGrammarRepeat));
      }
      ++pos_;
    }
    *out = static_cast<int>(v);
    return true;
  }

  // Rewrites seq[item_start..] (one item) repeated min..max times (max -1: unbounded).
  bool Repeat(const std::string& rule_name, size_t item_start, int min, int max, Seq* seq) {
    if (item_start == seq->size()) return Fail("nothing to repeat");
    const Seq unit(seq->begin() + item_start, seq->end());
    seq->resize(item_start);
    for (int i = 0; i < min; ++i) {
      if (!CountElems(unit.size())) return false;
      seq->insert(seq->end(), unit.begin(), unit.end());
    }
    if (max == -1) {
      // R ::= unit R | ε
      const uint32_t r = NewRule(rule_name);
      Seq loop = unit;
      loop.push_back({Grammar::ElemType::kRule, r});
      if (!CountElems(loop.size() + 1)) return false;
      rules_[r] = {loop, {}};
      seq->push_back({Grammar::ElemType::kRule, r});
    } else if (max > min) {
      // O_1 ::= unit | ε; O_k ::= unit O_{k-1} | ε
      uint32_t prev = 0;
      for (int k = 1; k <= max - min; ++k) {
        const uint32_t r = NewRule(rule_name);
        Seq s = unit;
        if (k > 1) s.push_back({Grammar::ElemType::kRule, prev});
        if (!CountElems(s.size() + 1)) return false;
        rules_[r] = {s, {}};
        prev = r;
      }
      seq->push_back({Grammar::ElemType::kRule, prev});
    }
    return true;
  }

  // Left recursion would make the matcher's expansion loop forever: refuse it.
  bool CheckLeftRecursion() {
    const size_t n = rules_.size();
    std::vector<uint8_t> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Seq& alt : rules_[r]) {
          bool all = true;
          for (const Elem& e : alt) {
            if (e.type != Grammar::ElemType::kRule || !nullable[e.value]) {
              all = false;
              break;
            }
          }
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    // Edges r → s where s can be the first thing r reads.
    std::vector<std::vector<uint32_t>> first(n);
    for (size_t r = 0; r < n; ++r) {
      for (const Seq& alt : rules_[r]) {
        for (const Elem& e : alt) {
          if (e.type != Grammar::ElemType::kRule) break;
          first[r].push_back(e.value);
          if (!nullable[e.value]) break;
        }
      }
    }
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
    for (uint32_t start = 0; start < n; ++start) {
      if (color[start]) continue;
      // Iterative DFS: (rule, next edge).
      std::vector<std::pair<uint32_t, size_t>> path{{start, 0}};
      color[start] = 1;
      while (!path.empty()) {
        auto& [r, edge] = path.back();
        if (edge == first[r].size()) {
          color[r] = 2;
          path.pop_back();
          continue;
        }
        const uint32_t s = first[r][edge++];
        if (color[s] == 1) {
          return Fail("rule '" + names_[s] +
                          "' is left-recursive (it can reach itself before reading a character; "
                          "a repetition of something that may be empty does this too)",
                      first_use_[s]);
        }
        if (color[s] == 0) {
          color[s] = 1;
          path.push_back({s, 0});
        }
      }
    }
    return true;
  }

  std::string_view src_;
  size_t pos_ = 0;
  int depth_ = 0;
  int generated_ = 0;
  size_t n_elems_ = 0;
  std::string error_;
  std::map<std::string, uint32_t> ids_;
  std::vector<std::string> names_;
  std::vector<Alts> rules_;
  std::vector<size_t> first_use_;  // [n_rules] where each rule was first named
  std::set<uint32_t> defined_;
  std::vector<Grammar::CharSet> sets_;
};

Result<std::shared_ptr<const Grammar>> Grammar::Parse(std::string_view source,
                                                      std::string_view root) {
  return GrammarBuilder(source).Build(root);
}

// ---------------------------------------------------------------------------------------------
// Matcher.

namespace {
constexpr size_t kMaxCachedStates = 1 << 14;  // DFA states kept (each holds 1 KiB of next ids)
constexpr size_t kMaxStackNodes = 1 << 20;
// Rule expansions per byte step (and for the start): real grammars need tens to hundreds;
// pathological ones (long chains of rules that may be empty) are cut off here.
constexpr size_t kMaxExpandSteps = 1 << 16;
}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)) {
  const Grammar& g = *grammar_;
  std::vector<uint32_t> stacks;
  expand_budget_ = kMaxExpandSteps;
  expand_overflow_ = false;
  for (uint32_t alt : g.rule_alts()[g.root()]) {
    const uint32_t s = g.elems()[alt].type != Grammar::ElemType::kEnd
                           ? InternStack(alt, kEmptyStack)
                           : kEmptyStack;
    Expand(s, &stacks);
  }
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  // A grammar whose start takes more expansion than the budget allows nothing at all.
  if (expand_overflow_) stacks.clear();
  state_ = InternState(std::move(stacks), 0, 0, 0, /*allow_empty=*/true);
}

uint32_t GrammarMatcher::InternStack(uint32_t pos, uint32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(pos) << 32) | parent;
  auto [it, inserted] = node_ids_.emplace(key, static_cast<uint32_t>(nodes_.size()));
  if (inserted) nodes_.push_back({pos, parent});
  return it->second;
}

void GrammarMatcher::Expand(uint32_t stack, std::vector<uint32_t>* out) {
  // A work list, not recursion: chains of rules that may be empty (("a"{0}){9999} repeated)
  // would otherwise nest as deep as the chain is long.
  const auto& elems = grammar_->elems();
  std::vector<uint32_t>& todo = expand_todo_;
  todo.clear();
  todo.push_back(stack);
  while (!todo.empty()) {
    if (out->size() >= kMaxGrammarStacks) return;
    if (expand_budget_ == 0) {
      expand_overflow_ = true;
      return;
    }
    --expand_budget_;
    const uint32_t s = todo.back();
    todo.pop_back();
    if (s == kEmptyStack) {
      out->push_back(s);
      continue;
    }
    const StackNode node = nodes_[s];
    const Grammar::Elem& e = elems[node.pos];
    if (e.type == Grammar::ElemType::kChar) {
      out->push_back(s);
      continue;
    }
    LAMINA_CHECK(e.type == Grammar::ElemType::kRule);
    uint32_t base = node.parent;
    if (elems[node.pos + 1].type != Grammar::ElemType::kEnd) base = InternStack(node.pos + 1, base);
    const auto& alts = grammar_->rule_alts()[e.value];
    for (auto alt = alts.rbegin(); alt != alts.rend(); ++alt) {
      todo.push_back(elems[*alt].type != Grammar::ElemType::kEnd ? InternStack(*alt, base) : base);
    }
  }
}

void GrammarMatcher::Advance(const std::vector<uint32_t>& stacks, uint32_t cp,
                             std::vector<uint32_t>* out) {
  out->clear();
  const auto& elems = grammar_->elems();
  for (uint32_t s : stacks) {
    if (s == kEmptyStack) continue;
    const StackNode node = nodes_[s];
    if (!grammar_->char_sets()[elems[node.pos].value].Contains(cp)) continue;
    uint32_t next = node.parent;
    if (elems[node.pos + 1].type != Grammar::ElemType::kEnd) {
      next = InternStack(node.pos + 1, node.parent);
    }
    Expand(next, out);
  }
  if (out->size() > 1) {
    std::sort(out->begin(), out->end());
    out->erase(std::unique(out->begin(), out->end()), out->end());
  }
}

int32_t GrammarMatcher::InternState(std::vector<uint32_t> stacks, uint32_t partial, int left,
                                    int len, bool allow_empty) {
  if (stacks.empty() && !allow_empty) return kDead;
  std::string key(reinterpret_cast<const char*>(stacks.data()), stacks.size() * sizeof(uint32_t));
  key.append(reinterpret_cast<const char*>(&partial), sizeof(partial));
  key.push_back(static_cast<char>(left));
  key.push_back(static_cast<char>(len));
  auto [it, inserted] = state_ids_.emplace(std::move(key), static_cast<int32_t>(states_.size()));
  if (!inserted) return it->second;
  DfaState st;
  st.partial = partial;
  st.partial_left = static_cast<int8_t>(left);
  st.partial_len = static_cast<int8_t>(len);
  st.can_end = left == 0 && !stacks.empty() && stacks.back() == kEmptyStack;  // sorts last
  st.complete = left == 0 && stacks.size() == 1 && stacks[0] == kEmptyStack;
  st.stacks = std::move(stacks);
  states_.push_back(std::move(st));
  return it->second;
}

int32_t GrammarMatcher::Step(int32_t state, uint8_t b) {
  {
    DfaState& st = states_[state];
    if (st.next.empty()) st.next.assign(256, kUnknown);
    if (st.next[b] != kUnknown) return st.next[b];
  }
  const DfaState& st = states_[state];
  const std::vector<uint32_t> stacks = st.stacks;  // states_ may grow below
  expand_budget_ = kMaxExpandSteps;
  expand_overflow_ = false;
  uint32_t value = 0;
  int left = 0, len = 0;
  int32_t result = kDead;
  bool done = false;
  if (st.partial_left == 0) {
    if (b < 0x80) {
      Advance(stacks, b, &scratch_);
      result = InternState(scratch_, 0, 0, 0);
      done = true;
    } else if ((b & 0xE0) == 0xC0) {
      value = b & 0x1F;
      left = 1;
    } else if ((b & 0xF0) == 0xE0) {
      value = b & 0x0F;
      left = 2;
    } else if ((b & 0xF8) == 0xF0) {
      value = b & 0x07;
      left = 3;
    } else {
      done = true;
    }
    len = left + 1;
  } else if ((b & 0xC0) != 0x80) {
    done = true;
  } else {
    value = (st.partial << 6) | (b & 0x3F);
    left = st.partial_left - 1;
    len = st.partial_len;
  }
  if (!done) {
    // The code points this sequence can still become, within what its length may encode (no
    // overlong forms, no surrogates, nothing above U+10FFFF).
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    static constexpr uint32_t kMax[5] = {0, 0, 0x7FF, 0xFFFF, 0x10FFFF};
    uint32_t lo = value << (6 * left);
    uint32_t hi = lo | ((1u << (6 * left)) - 1);
    lo = std::max(lo, kMin[len]);
    hi = std::min(hi, kMax[len]);
    if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) {
      result = kDead;
    } else if (left == 0) {
      Advance(stacks, value, &scratch_);
      result = InternState(scratch_, 0, 0, 0);
    } else {
      // Inside a sequence: keep the parses whose next class holds a code point it can become.
      scratch_.clear();
      const auto& elems = grammar_->elems();
      for (uint32_t s : stacks) {
        if (s == kEmptyStack) continue;
        if (grammar_->char_sets()[elems[nodes_[s].pos].value].Intersects(lo, hi)) {
          scratch_.push_back(s);
        }
      }
      result = InternState(scratch_, value, left, len);
    }
  }
  // Past the expansion budget the parse sets are incomplete: refuse the byte (deterministically,
  // so the cached answer is the one every later call would compute).
  if (expand_overflow_) result = kDead;
  states_[state].next[b] = result;
  return result;
}

int32_t GrammarMatcher::StepBytes(int32_t state, std::string_view bytes) {
  if (bytes.empty()) return kDead;
  for (char c : bytes) {
    state = Step(state, static_cast<uint8_t>(c));
    if (state < 0) return kDead;
  }
  return state;
}

void GrammarMatcher::CompactIfLarge() {
  if (states_.size() < kMaxCachedStates && nodes_.size() < kMaxStackNodes) return;
  // The current state's stacks as explicit element lists (bottom first).
  const DfaState cur = states_[state_];
  std::vector<std::vector<uint32_t>> stacks;
  for (uint32_t s : cur.stacks) {
    std::vector<uint32_t> elems;
    for (uint32_t at = s; at != kEmptyStack; at = nodes_[at].parent)
      elems.push_back(nodes_[at].pos);
    std::reverse(elems.begin(), elems.end());
    stacks.push_back(std::move(elems));
  }
  nodes_.clear();
  node_ids_.clear();
  states_.clear();
  state_ids_.clear();
  std::vector<uint32_t> ids;
  for (const auto& elems : stacks) {
    uint32_t id = kEmptyStack;
    for (uint32_t pos : elems) id = InternStack(pos, id);
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  state_ = InternState(std::move(ids), cur.partial, cur.partial_left, cur.partial_len);
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  CompactIfLarge();
  const int32_t next = StepBytes(state_, bytes);
  if (next < 0) return false;
  state_ = next;
  return true;
}

void GrammarMatcher::Walk(const TokenTrie& trie, uint32_t node, int32_t state,
                          std::vector<uint8_t>* allowed) {
  const TokenTrie::Node& n = trie.node(node);
  for (uint32_t c = n.first_child; c < n.first_child + n.n_children; ++c) {
    const TokenTrie::Node& child = trie.node(c);
    const int32_t next = Step(state, child.byte);
    if (next < 0) continue;
    for (uint32_t t = child.first_token; t < child.first_token + child.n_tokens; ++t) {
      (*allowed)[trie.tokens()[t]] = 1;
    }
    if (child.n_children > 0) Walk(trie, c, next, allowed);
  }
}

namespace {

bool NeverText(const Tokenizer& tokenizer, TokenId id) {
  const TokenAttr attr = tokenizer.Attr(id);
  return attr == TokenAttr::kControl || attr == TokenAttr::kUnused;
}

std::string TokenText(const Tokenizer& tokenizer, TokenId id, bool first_token) {
  return first_token ? tokenizer.Decode({id}) : tokenizer.TokenToPiece(id, false);
}

}  // namespace

void GrammarMatcher::AllowedTokens(const Tokenizer& tokenizer, bool first_token,
                                   std::vector<uint8_t>* allowed) {
  CompactIfLarge();
  const int32_t n_vocab = tokenizer.vocab_size();
  allowed->assign(n_vocab, 0);
  if (first_token) {
    for (TokenId id = 0; id < n_vocab; ++id) {
      if (NeverText(tokenizer, id) || tokenizer.IsEog(id)) continue;
      if (StepBytes(state_, TokenText(tokenizer, id, true)) >= 0) (*allowed)[id] = 1;
    }
  } else {
    const TokenTrie& trie = tokenizer.PieceTrie();
    Walk(trie, 0, state_, allowed);
    for (int32_t id : trie.long_tokens()) {
      if (StepBytes(state_, TokenText(tokenizer, id, false)) >= 0) (*allowed)[id] = 1;
    }
  }
  if (CanEnd()) {
    for (TokenId id = 0; id < n_vocab; ++id) {
      if (tokenizer.IsEog(id)) (*allowed)[id] = 1;
    }
  }
}

bool GrammarMatcher::Allows(const Tokenizer& tokenizer, TokenId id, bool first_token) {
  if (id < 0 || id >= tokenizer.vocab_size()) return false;
  if (tokenizer.IsEog(id)) return CanEnd();
  if (NeverText(tokenizer, id)) return false;
  CompactIfLarge();
  return StepBytes(state_, TokenText(tokenizer, id, first_token)) >= 0;
}

bool GrammarMatcher::AcceptToken(const Tokenizer& tokenizer, TokenId id, bool first_token) {
  if (id < 0 || id >= tokenizer.vocab_size()) return false;
  if (tokenizer.IsEog(id)) return CanEnd();
  if (NeverText(tokenizer, id)) return false;
  return AcceptBytes(TokenText(tokenizer, id, first_token));
}

}  // namespace lamina
