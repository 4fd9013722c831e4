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
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace lamina {

// Hard caps on untrusted grammar text.
constexpr size_t kMaxGrammarBytes = 1 << 20;     // source text
constexpr size_t kMaxGrammarElements = 1 << 20;  // after repetitions are expanded
constexpr int kMaxGrammarRepeat = 10000;         // m and n of x{m,n}
constexpr size_t kMaxGrammarStacks = 4096;       // live parses kept by the matcher

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

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  // Advances over `bytes` (UTF-8, possibly ending inside a sequence); false (state unchanged)
  // when the text cannot continue the grammar.
  bool AcceptBytes(std::string_view bytes);
  // The text so far is a complete sentence of the grammar (an end token may come now).
  bool CanEnd() const;
  // Nothing can be added: every parse is complete.
  bool Complete() const;

  // allowed[id] (resized to the vocabulary) = 1 when token id may come next. End-of-generation
  // tokens are allowed exactly when CanEnd(); control and unused tokens never. first_token:
  // the token starts the output, so its text is tokenizer.Decode({id}) (which may drop the
  // vocabulary's leading space) rather than its piece.
  void AllowedTokens(const Tokenizer& tokenizer, bool first_token,
                     std::vector<uint8_t>* allowed) const;
  // Whether token id may come next (the same rule as AllowedTokens, for one token).
  bool Allows(const Tokenizer& tokenizer, TokenId id, bool first_token) const;
  // Advances over token id (its text as above); false when it is not allowed.
  bool AcceptToken(const Tokenizer& tokenizer, TokenId id, bool first_token);

  using Stack = std::vector<uint32_t>;  // [depth] element indices; back() is matched next
  struct State {
    std::vector<Stack> stacks;  // every live parse; an empty stack is a complete one
    uint32_t partial = 0;       // bits of a code point whose UTF-8 bytes are not all read
    int partial_left = 0;       // its continuation bytes still to come
    int partial_len = 0;        // the whole sequence's length in bytes (2-4)
  };

 private:
  // Pushes `stack` with its top expanded to a character element (or empty) into out.
  void Expand(Stack stack, std::vector<Stack>* out) const;
  // One byte; false when no parse survives (next is then unspecified).
  bool StepByte(const State& state, uint8_t byte, State* next) const;
  void Advance(const std::vector<Stack>& stacks, uint32_t cp, std::vector<Stack>* out) const;
  bool AcceptBytes(const State& from, std::string_view bytes, State* to) const;
  void Walk(const TokenTrie& trie, uint32_t node, const State& state,
            std::vector<uint8_t>* allowed) const;

  std::shared_ptr<const Grammar> grammar_;
  State state_;
};

}  // namespace lamina
