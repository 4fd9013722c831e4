// GBNF grammars: the parser's errors name line and column; the matcher accepts exactly the
// sentences of a test set (fixed repetitions, alternations, recursion, classes, UTF-8); the
// trie walk allows exactly the tokens a per-token check allows; and generation under a grammar
// on real models always produces a sentence of it (or a prefix when the budget ends it).
#include "runtime/grammar.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "engine/generate.h"
#include "model/model.h"
#include "runtime/generate.h"

namespace lamina {
namespace {

std::shared_ptr<const Grammar> MustParse(const std::string& src) {
  Result<std::shared_ptr<const Grammar>> g = Grammar::Parse(src);
  EXPECT_TRUE(g.ok()) << src << "\n" << (g.ok() ? "" : g.error().message);
  return g.ok() ? *g : nullptr;
}

// The whole text is a sentence of the grammar.
bool Matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  if (!text.empty() && !m.AcceptBytes(text)) return false;
  return m.CanEnd();
}

// The text can be continued into a sentence (byte by byte, so UTF-8 is split everywhere).
bool IsPrefix(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  for (char c : text) {
    if (!m.AcceptBytes(std::string(1, c))) return false;
  }
  return true;
}

TEST(GrammarParse, ErrorsNameLineAndColumn) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "no rules"},
      {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice"},
      {"root ::= foo", "line 1, column 10: rule 'foo' is used but never defined"},
      {"root ::= \"abc", "line 1, column 10: unterminated string"},
      {"root ::= [a-z", "line 1, column 10: unterminated character class"},
      {"root ::= (\"a\" | \"b\"", "expected ')'"},
      {"root ::= \"a\" )", "line 1, column 14: unexpected ')'"},
      {"root := \"a\"", "line 1, column 6: expected '::='"},
      {"root ::= \"a\"{3,1}", "n < m"},
      {"root ::= \"a\"{99999}", "over the limit"},
      {"root ::= \"\\q\"", "unknown escape"},
      {"root ::= [z-a]", "backwards"},
      {"root ::= root \"a\" | \"a\"", "left-recursive"},
      {"root ::= x \"a\"\nx ::= y\ny ::= x | \"b\"", "left-recursive"},
      {"root ::= (\"a\"?)*", "left-recursive"},
      {"start ::= \"a\"", "no rule named 'root'"},
      {"root ::= *", "unexpected character '*'"},
      {"root ::= \"a\" @", "unexpected character '@'"},
  };
  for (const auto& [src, want] : cases) {
    Result<std::shared_ptr<const Grammar>> g = Grammar::Parse(src);
    ASSERT_FALSE(g.ok()) << src;
    EXPECT_NE(g.error().message.find(want), std::string::npos)
        << src << "\n got: " << g.error().message << "\n want: " << want;
  }
}

TEST(GrammarMatch, FixedAndBoundedRepetitions) {
  auto five = MustParse("root ::= \"a\"{5}");
  EXPECT_TRUE(Matches(five, "aaaaa"));
  EXPECT_FALSE(Matches(five, "aaaa"));
  EXPECT_TRUE(IsPrefix(five, "aaaa"));
  EXPECT_FALSE(IsPrefix(five, "aaaaaa"));
  auto range = MustParse("root ::= \"ab\"{2,4} \"!\"");
  EXPECT_FALSE(Matches(range, "ab!"));
  EXPECT_TRUE(Matches(range, "abab!"));
  EXPECT_TRUE(Matches(range, "abababab!"));
  EXPECT_FALSE(Matches(range, "ababababab!"));
  auto open = MustParse("root ::= [0-9]{2,} | \"x\"+ \"y\"? | \"z\"*");
  EXPECT_TRUE(Matches(open, "12"));
  EXPECT_TRUE(Matches(open, "1234567890"));
  EXPECT_FALSE(Matches(open, "1"));
  EXPECT_TRUE(Matches(open, "xxx"));
  EXPECT_TRUE(Matches(open, "xy"));
  EXPECT_FALSE(Matches(open, "y"));
  EXPECT_TRUE(Matches(open, ""));
  EXPECT_TRUE(Matches(open, "zzzz"));
}

TEST(GrammarMatch, AlternationsGroupsAndRecursion) {
  auto animals = MustParse(
      "# a comment line\n"
      "root ::= animal (\", \" animal)*   # trailing comment\n"
      "animal ::= \"cat\" | \"dog\"\n"
      "  | \"bird\"\n");
  EXPECT_TRUE(Matches(animals, "cat"));
  EXPECT_TRUE(Matches(animals, "dog, bird, cat"));
  EXPECT_FALSE(Matches(animals, "cow"));
  EXPECT_FALSE(Matches(animals, "cat,dog"));
  auto parens = MustParse("root ::= p\np ::= \"(\" p \")\" p | ");
  EXPECT_TRUE(Matches(parens, ""));
  EXPECT_TRUE(Matches(parens, "(()())()"));
  EXPECT_TRUE(Matches(parens, "((((((((((()))))))))))"));
  EXPECT_FALSE(Matches(parens, "(()"));
  EXPECT_TRUE(IsPrefix(parens, "(()"));
  EXPECT_FALSE(IsPrefix(parens, "())"));
  auto nested = MustParse(
      "root ::= (\n"
      "  \"[\" ( root (\",\" root)* )? \"]\"\n"
      "  | [0-9]+\n"
      ")");
  EXPECT_TRUE(Matches(nested, "[1,[2,[]],[[3]]]"));
  EXPECT_FALSE(Matches(nested, "[1,]"));
}

TEST(GrammarParse, GroupRulesNeverClashWithLaterNames) {
  // A group's own rule once took the name "root-1", refusing a later rule of that name (as
  // the JSON schema converter writes for an anyOf at the top).
  auto g = MustParse("root ::= (root-0 | root-1)\nroot-0 ::= \"a\"\nroot-1 ::= \"b\" (\"c\")*\n");
  EXPECT_TRUE(Matches(g, "a"));
  EXPECT_TRUE(Matches(g, "bcc"));
  EXPECT_FALSE(Matches(g, "ab"));
}

TEST(GrammarMatch, ClassesNegationAnyAndUtf8) {
  auto g = MustParse(
      "root ::= [a-zA-Z_] [a-zA-Z0-9_]* \" \" [^\\n0-9]+ \"\\n\" greek\n"
      "greek ::= [α-ω]+ . \"\\u00e9\" \"\\x41\"");
  EXPECT_TRUE(Matches(g, "x_1 anything but digits\nαβγ€éA"));
  EXPECT_FALSE(Matches(g, "1x anything\nαé!A"));
  EXPECT_FALSE(Matches(g, "x has 1 digit\nαéA"));
  EXPECT_FALSE(Matches(g, "x ok\nAé!A"));
  // Byte by byte through multi-byte characters; a wrong continuation byte is refused.
  EXPECT_TRUE(IsPrefix(g, "x ok\n\xce\xb1\xce"));
  EXPECT_FALSE(IsPrefix(g, "x ok\n\xce\x41"));
  // A lead byte whose every completion is outside the class is refused at once.
  auto ascii = MustParse("root ::= [a-z]+");
  EXPECT_FALSE(IsPrefix(ascii, "ab\xc3"));
  // Overlong forms, surrogates and code points above U+10FFFF never match (a byte-fallback
  // vocabulary could otherwise spell "{" as C1 BB).
  auto brace = MustParse("root ::= \"{\" .*");
  EXPECT_FALSE(IsPrefix(brace, "\xc1\xbb"));
  EXPECT_FALSE(IsPrefix(brace, "{\xe0\x81\xbd"));
  EXPECT_FALSE(IsPrefix(brace, "{\xed\xa0\x80"));
  EXPECT_FALSE(IsPrefix(brace, "{\xf4\x90"));
  EXPECT_TRUE(IsPrefix(brace, "{\xf4\x8f\xbf\xbf\xe2\x82\xac"));
  auto not_a = MustParse("root ::= [^a]");
  EXPECT_TRUE(Matches(not_a, "é"));
  EXPECT_TRUE(Matches(not_a, "b"));
  EXPECT_FALSE(Matches(not_a, "a"));
}

const char* kJsonGrammar = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws
array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws
string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
  )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";

TEST(GrammarMatch, JsonGrammar) {
  auto g = MustParse(kJsonGrammar);
  EXPECT_TRUE(Matches(g, R"({"a": [1, 2.5, -3e4, "x\"y", true, null, {}], "b": {"c": "\u00e9"}})"));
  EXPECT_TRUE(Matches(g, "{\n  \"k\": \"v\"\n}"));
  EXPECT_FALSE(Matches(g, R"({"a": 01x})"));
  EXPECT_FALSE(Matches(g, R"({"a": [1,]})"));
  EXPECT_FALSE(Matches(g, R"([1])"));
  EXPECT_TRUE(IsPrefix(g, R"({"a": [1, {"b)"));
}

// The trie walk and the per-token check agree on every token, at many states of a grammar.
void ExpectTrieAgrees(const Tokenizer& tok, const std::shared_ptr<const Grammar>& g,
                      const std::string& text) {
  GrammarMatcher m(g);
  std::vector<uint8_t> allowed;
  bool first = true;
  size_t at = 0;
  // Walk the text in small steps (1-3 bytes), checking each state.
  std::mt19937 rng(7);
  while (true) {
    m.AllowedTokens(tok, first, &allowed);
    for (TokenId id = 0; id < tok.vocab_size(); ++id) {
      ASSERT_EQ(allowed[id] != 0, m.Allows(tok, id, first))
          << "token " << id << " '" << tok.TokenText(id) << "' after '" << text.substr(0, at)
          << "'";
    }
    if (at >= text.size()) break;
    const size_t n = std::min<size_t>(1 + rng() % 3, text.size() - at);
    ASSERT_TRUE(m.AcceptBytes(text.substr(at, n))) << text.substr(0, at + n);
    at += n;
    first = false;
  }
}

const std::string kShipped = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
const std::string kStories = std::string(LAMINA_SHARED_DIR) + "/models/stories260K.gguf";

struct ModelCase {
  std::string path;
};

class GrammarModel : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(GetParam())) GTEST_SKIP() << GetParam() << " is absent";
    Result<std::unique_ptr<Model>> m = LoadModel(GetParam());
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
  }
  std::unique_ptr<Model> model_;
  ThreadPool pool_{2};
};

TEST_P(GrammarModel, TrieWalkEqualsPerTokenCheck) {
  const Tokenizer& tok = model_->tokenizer();
  ExpectTrieAgrees(tok, MustParse(kJsonGrammar), R"({"name": "é\u00e9", "n": [1, -2.5e3, {}]})");
  ExpectTrieAgrees(tok, MustParse("root ::= [a-z ]+ \"\\n\" [α-ω]{2} \"end\""), "one two\nαβend");
}

// Generation under each grammar gives a sentence of it when it ends by itself, and a prefix of
// one when the token budget ends it; greedy and sampled, plain and speculative-free.
TEST_P(GrammarModel, GenerationAlwaysMatches) {
  const std::vector<std::string> grammars = {
      "root ::= \"a\"{5}",
      "root ::= (\"yes\" | \"no\" | \"maybe\") \".\"",
      "root ::= \"(\" p \")\"\np ::= (\"(\" p \")\")*",
      "root ::= [0-9]{1,3} (\",\" [0-9]{1,3}){2,4}",
      "root ::= \"Once upon a time\" [a-z ,.]{10,40} \"\\n\"",
      kJsonGrammar,
  };
  const Tokenizer& tok = model_->tokenizer();
  const std::vector<int32_t> prompt = tok.Encode("Once upon a time", true, false);
  SessionConfig sc;
  sc.n_ctx = 256;
  int ended = 0;
  for (const std::string& src : grammars) {
    auto g = MustParse(src);
    for (int seed = 0; seed < 6; ++seed) {
      Session session(*model_, sc, pool_);
      GenerateOptions o;
      o.params.grammar = g;
      o.params.n_predict = 48;
      o.params.sampler.temperature = seed == 0 ? 0.0f : 1.5f;
      o.params.sampler.top_k = 0;
      o.params.sampler.top_p = 1.0f;
      o.params.sampler.min_p = 0.0f;
      o.params.sampler.seed = seed;
      Result<GenerateResult> r = engine::Generate(session, 0, prompt, o);
      ASSERT_TRUE(r.ok()) << r.error().message;
      if (r->reason == StopReason::kEos) {
        EXPECT_TRUE(Matches(g, r->text)) << src << "\nseed " << seed << ": '" << r->text << "'";
        ++ended;
      } else {
        EXPECT_EQ(r->reason, StopReason::kLimit);
        EXPECT_TRUE(IsPrefix(g, r->text)) << src << "\nseed " << seed << ": '" << r->text << "'";
      }
    }
  }
  EXPECT_GE(ended, 12);  // the bounded grammars end by themselves
}

INSTANTIATE_TEST_SUITE_P(Models, GrammarModel, testing::Values(kShipped, kStories),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.index == 0 ? std::string("shipped")
                                                  : std::string("stories260K");
                         });

}  // namespace
}  // namespace lamina

namespace lamina {
namespace {

// Chains of rules that may be empty expand without recursion and within a budget: a modest one
// works, a pathological one (10^8 empty expansions) allows nothing instead of overflowing the
// stack or hanging.
TEST(GrammarMatch, NullableChainsAreBoundedNotOverflowed) {
  auto modest = MustParse("root ::= (\"a\"?){100} \"b\"");
  EXPECT_TRUE(Matches(modest, "b"));
  EXPECT_TRUE(Matches(modest, "aab"));
  EXPECT_FALSE(Matches(modest, std::string(101, 'a') + "b"));
  auto huge = MustParse("root ::= (((\"a\"{0}){9999}){9999}) \"b\"");
  GrammarMatcher m(huge);
  EXPECT_FALSE(m.AcceptBytes("b"));
  EXPECT_FALSE(m.CanEnd());
}

// Deep nesting of every kind ends in an error naming line and column or in a working grammar,
// never a stack overflow: groups (refused past kMaxGrammarNesting), long chains of rule
// references (parsed and expanded without recursion) and deeply recursive sentences (the
// matcher's stacks are heap nodes).
TEST(GrammarParse, DeepNestingIsAnErrorNotACrash) {
  auto nest = [](size_t n) {
    return "root ::= \"x\" " + std::string(n, '(') + "\"a\"" + std::string(n, ')') + "\n";
  };
  for (size_t n : {size_t{100000}, size_t{kMaxGrammarNesting + 1}}) {
    Result<std::shared_ptr<const Grammar>> g = Grammar::Parse(nest(n));
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.error().message,
              "grammar: line 1, column 271: groups nest deeper than the limit of 256");
  }
  // Unclosed, and with alternatives and repetitions inside.
  std::string open;
  for (int i = 0; i < 100000; ++i) open += "(\"a\" | ";
  Result<std::shared_ptr<const Grammar>> g = Grammar::Parse("root ::= " + open);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("groups nest deeper than the limit of 256"), std::string::npos);
  auto at_limit = MustParse(nest(kMaxGrammarNesting));
  ASSERT_NE(at_limit, nullptr);
  EXPECT_TRUE(Matches(at_limit, "xa"));
  EXPECT_FALSE(Matches(at_limit, "xaa"));

  // 60,000 rules (within the source cap), each naming the next: parsed and expanded without
  // recursion (a longer chain would reach the expansion budget and allow nothing).
  std::string chain = "root::=r0\n";
  for (int i = 0; i < 60000; ++i) {
    chain += "r" + std::to_string(i) + "::=r" + std::to_string(i + 1) + "\n";
  }
  chain += "r60000::=\"a\"\n";
  auto long_chain = MustParse(chain);
  ASSERT_NE(long_chain, nullptr);
  EXPECT_TRUE(Matches(long_chain, "a"));
  EXPECT_FALSE(Matches(long_chain, "b"));

  // A recursive rule matched 100,000 levels deep.
  auto parens = MustParse("root ::= \"(\" root \")\" | \"a\"");
  ASSERT_NE(parens, nullptr);
  const std::string deep = std::string(100000, '(') + "a" + std::string(100000, ')');
  GrammarMatcher m(parens);
  for (size_t i = 0; i < deep.size(); i += 1000) {
    ASSERT_TRUE(m.AcceptBytes(std::string_view(deep).substr(i, 1000))) << i;
  }
  EXPECT_TRUE(m.CanEnd());
}

}  // namespace
}  // namespace lamina
