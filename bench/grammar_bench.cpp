// Cost of grammar-constrained sampling per token: the mask (which tokens the grammar allows
// next) at states along a JSON document, for vocabularies of 512 to 151K tokens, with the JSON
// grammar that JSON schemas convert to. Prints figures; nothing is asserted.
//   build/release/bench/grammar_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "runtime/grammar.h"
#include "tokenizer/tokenizer.h"

namespace lamina {
namespace {

const char* kJsonGbnf = R"(
root ::= object
value ::= object | array | string | number | ("true" | "false" | "null") space
object ::= "{" space ( string ":" space value ("," space string ":" space value)* )? "}" space
array ::= "[" space ( value ("," space value)* )? "]" space
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" space
number ::= "-"? ([0] | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,16})? space
space ::= | " " | "\n" [ \t]{0,20}
)";

// The document the states are taken along (after each of its tokens).
const char* kDoc =
    R"({"name": "Ada Lovelace", "born": 1815, "tags": ["math", "poetry"], "ok": true, )"
    R"("nested": {"x": -1.5e3, "list": [1, 2, 3]}})";

struct Vocab {
  std::string name;
  std::string path;
};

std::vector<Vocab> Vocabs() {
  const std::string shared = std::string(LAMINA_SOURCE_DIR) + "/../shared";
  return {{"shipped-1K", std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf"},
          {"stories260K-512", shared + "/models/stories260K.gguf"},
          {"llama-spm-32K", shared + "/vocab/ggml-vocab-llama-spm.gguf"},
          {"llama-bpe-128K", shared + "/vocab/ggml-vocab-llama-bpe.gguf"},
          {"qwen2-151K", shared + "/vocab/ggml-vocab-qwen2.gguf"}};
}

void BM_Mask(benchmark::State& st, std::string path) {
  if (!std::filesystem::exists(path)) {
    st.SkipWithError(("absent: " + path).c_str());
    return;
  }
  auto file = gguf::File::Open(path);
  if (!file.ok()) {
    st.SkipWithError(file.error().message.c_str());
    return;
  }
  auto tok = Tokenizer::FromGguf(**file);
  if (!tok.ok()) {
    st.SkipWithError(tok.error().message.c_str());
    return;
  }
  auto grammar = Grammar::Parse(kJsonGbnf);
  if (!grammar.ok()) {
    st.SkipWithError(grammar.error().message.c_str());
    return;
  }
  (void)(*tok)->PieceTrie();  // built once per tokenizer, outside the timing
  // The document's tokens, the first one's text as output (SPM's lone leading-space piece
  // decodes to nothing there and is skipped).
  std::vector<TokenId> ids = (*tok)->Encode(kDoc, false, false);
  if (!ids.empty() && (*tok)->Decode({ids[0]}).empty()) ids.erase(ids.begin());
  // Each iteration is one request: a fresh matcher (cold caches), the mask before each token
  // of the document, then the token.
  std::vector<uint8_t> allowed;
  size_t n_allowed = 0, n_masks = 0, n_states = 0;
  for (auto _ : st) {
    GrammarMatcher m(*grammar);
    for (size_t i = 0; i < ids.size(); ++i) {
      m.AllowedTokens(**tok, i == 0, &allowed);
      for (uint8_t a : allowed) n_allowed += a;
      ++n_masks;
      if (!m.AcceptToken(**tok, ids[i], i == 0)) {
        st.SkipWithError(("the document's token " + std::to_string(i) + " ('" +
                          (*tok)->TokenToPiece(ids[i], false) + "') is refused")
                             .c_str());
        return;
      }
    }
    n_states += m.n_states();
  }
  st.counters["vocab"] = (*tok)->vocab_size();
  st.counters["tokens"] = static_cast<double>(ids.size());
  st.counters["us_per_token"] = benchmark::Counter(
      static_cast<double>(n_masks), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  st.counters["allowed_avg"] = static_cast<double>(n_allowed) / n_masks;
  st.counters["dfa_states"] = static_cast<double>(n_states) / st.iterations();
}

int Register() {
  for (const Vocab& v : Vocabs()) {
    benchmark::RegisterBenchmark(("BM_Mask/" + v.name).c_str(), BM_Mask, v.path)
        ->Unit(benchmark::kMicrosecond);
  }
  return 0;
}
const int registered = Register();

}  // namespace
}  // namespace lamina
