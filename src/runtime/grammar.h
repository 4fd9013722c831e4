// Grammar-constrained sampling: GBNF grammars (llama.cpp's format: `name ::= alternatives`,
// "literals", [character classes], `.`, ( groups ), `|`, `*` `+` `?` `{m}` `{m,}` `{m,n}`,
// `# comments`) parsed into rules of code-point elements, and a matcher that says which tokens
// may come next. The matcher is a set of pushdown stacks (one per way the text so far can be
// read); a token is allowed when its bytes leave at least one stack alive. Text is matched in
// code points; a token may end inside a UTF-8 sequence, whose remaining bytes the next token
// must complete.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace lamina {

// Hard caps on untrusted grammar text.
constexpr size_t kMaxGrammarBytes = 1 << 20;     // source text
constexpr size_t kMaxGrammarElements = 1 << 20;  // after repetitions are expanded
constexpr int kMaxGrammarRepeat = 10000;         // m and n of x{m,n}
constexpr size_t kMaxGrammarStacks = 4096;       // live parses kept by the matcher
// Groups nested in one rule: the parser recurses per group (the matcher never recurses: its
// stacks are heap nodes and its expansion a work list). Deeper is an error naming the position.
constexpr int kMaxGrammarNesting = 256;

class Grammar {
 public:
  enum class ElemType : uint8_t {
    kEnd,   // end of an alternative
    kChar,  // one code point of char_sets()[value]
    kRule,  // rule `value`
  };
  struct Elem {
    ElemType type;
    uint32_t value;
  };
  struct CharSet {
    bool negated = false;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive [lo, hi] code points
    bool Contains(uint32_t cp) const;
    // Whether some code point in [lo, hi] is in the set.
    bool Intersects(uint32_t lo, uint32_t hi) const;
  };

  // Parses GBNF source; `root` names the start rule. Errors name the line and column.
  static Result<std::shared_ptr<const Grammar>> Parse(std::string_view source,
                                                      std::string_view root = "root");

  const std::vector<Elem>& elems() const { return elems_; }  // [n_elems] alternatives, flat
  // rule_alts()[r]: the index in elems() where each alternative of rule r starts.
  const std::vector<std::vector<uint32_t>>& rule_alts() const { return rule_alts_; }
  const std::vector<CharSet>& char_sets() const { return char_sets_; }
  const std::vector<std::string>& rule_names() const { return rule_names_; }
  uint32_t root() const { return root_; }

 private:
  friend class GrammarBuilder;
  std::vector<Elem> elems_;
  std::vector<std::vector<uint32_t>> rule_alts_;
  std::vector<CharSet> char_sets_;
  std::vector<std::string> rule_names_;
  uint32_t root_ = 0;
};

// The matcher keeps parses as hash-consed stacks (a stack is an element and the id of the stack
// under it, so advancing one is O(1) and equal stacks share one id) and the set of live parses
// as an interned state; the transition from a state over a byte is computed once and cached,
// so the trie walk over a vocabulary costs a table lookup per trie node once the states it
// meets are known (a lazily built DFA over the grammar's reachable parse sets). The caches are
// compacted to the current state when they grow past their caps.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  // Advances over `bytes` (UTF-8, possibly ending inside a sequence); false (state unchanged)
  // when the text cannot continue the grammar.
  bool AcceptBytes(std::string_view bytes);
  // The text so far is a complete sentence of the grammar (an end token may come now).
  bool CanEnd() const { return states_[state_].can_end; }
  // Nothing can be added: every parse is complete.
  bool Complete() const { return states_[state_].complete; }

  // allowed[id] (resized to the vocabulary) = 1 when token id may come next. End-of-generation
  // tokens are allowed exactly when CanEnd(); control and unused tokens never. first_token:
  // the token starts the output, so its text is tokenizer.Decode({id}) (which may drop the
  // vocabulary's leading space) rather than its piece.
  void AllowedTokens(const Tokenizer& tokenizer, bool first_token, std::vector<uint8_t>* allowed);
  // Whether token id may come next (the same rule as AllowedTokens, for one token).
  bool Allows(const Tokenizer& tokenizer, TokenId id, bool first_token);
  // Advances over token id (its text as above); false when it is not allowed.
  bool AcceptToken(const Tokenizer& tokenizer, TokenId id, bool first_token);

  // Cache sizes, for benchmarks.
  size_t n_states() const { return states_.size(); }
  size_t n_stack_nodes() const { return nodes_.size(); }

 private:
  static constexpr uint32_t kEmptyStack = 0xFFFFFFFFu;  // the stack of a complete parse
  static constexpr int32_t kUnknown = -1;               // transition not computed yet
  static constexpr int32_t kDead = -2;                  // no parse survives
  struct StackNode {
    uint32_t pos;     // element index matched next
    uint32_t parent;  // the stack under it (kEmptyStack at the bottom)
  };
  struct DfaState {
    std::vector<uint32_t> stacks;  // sorted, unique stack ids: every live parse
    uint32_t partial = 0;          // bits of a code point whose UTF-8 bytes are not all read
    int8_t partial_left = 0;       // its continuation bytes still to come
    int8_t partial_len = 0;        // the whole sequence's length in bytes (2-4)
    bool can_end = false;
    bool complete = false;
    std::vector<int32_t> next;  // [256] next state per byte (kUnknown / kDead), on first use
  };

  uint32_t InternStack(uint32_t pos, uint32_t parent);
  // Pushes the stacks that `stack` expands to (top a character element, or empty) into out.
  void Expand(uint32_t stack, std::vector<uint32_t>* out);
  void Advance(const std::vector<uint32_t>& stacks, uint32_t cp, std::vector<uint32_t>* out);
  int32_t InternState(std::vector<uint32_t> stacks, uint32_t partial, int left, int len,
                      bool allow_empty = false);
  // The state after one byte from `state` (kDead when no parse survives).
  int32_t Step(int32_t state, uint8_t byte);
  int32_t StepBytes(int32_t state, std::string_view bytes);
  void Walk(const TokenTrie& trie, uint32_t node, int32_t state, std::vector<uint8_t>* allowed);
  // Drops every cache but the current state when they have grown past their caps.
  void CompactIfLarge();

  std::shared_ptr<const Grammar> grammar_;
  std::vector<StackNode> nodes_;                        // [n_stack_nodes]
  std::unordered_map<uint64_t, uint32_t> node_ids_;     // (pos, parent) → stack id
  std::vector<DfaState> states_;                        // [n_states]
  std::unordered_map<std::string, int32_t> state_ids_;  // serialized state → id
  std::vector<uint32_t> scratch_;                       // Advance / Expand output
  std::vector<uint32_t> expand_todo_;                   // Expand's work list
  size_t expand_budget_ = 0;                            // expansion steps left in this step
  bool expand_overflow_ = false;                        // the budget ran out in this step
  int32_t state_ = 0;
};

}  // namespace lamina
