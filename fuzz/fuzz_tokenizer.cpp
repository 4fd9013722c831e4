// Fuzz target: Tokenizer::Encode / Decode / TokenToPiece over arbitrary bytes on every shipped
// vocabulary. Input: byte 0 picks the vocabulary, byte 1 the flags (bit 0 add_special, bit 1
// parse_special), the rest is the text. Every id must lie in the vocabulary, and where the
// vocabulary round-trips (vocabularies.h) Decode(Encode(text)) must give the text back.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "vocabularies.h"

namespace {

void Fail(const lamina::fuzz::FuzzVocab& v, const char* what) {
  std::fprintf(stderr, "fuzz_tokenizer: %s: %s\n", v.name.c_str(), what);
  std::abort();
}

std::string SpacesForEscapes(std::string s) {
  for (size_t p; (p = s.find("\xE2\x96\x81")) != std::string::npos;) s.replace(p, 3, " ");
  return s;
}

}  // namespace

// Loads the vocabularies before fuzzing starts, so that loading does not count against an
// input's time limit (the regression runner loads on first use instead).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)lamina::fuzz::Vocabs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lamina::TokenId;
  const auto& vocabs = lamina::fuzz::Vocabs();
  if (size < 2) return 0;
  const lamina::fuzz::FuzzVocab& v = vocabs[data[0] % vocabs.size()];
  const bool add_special = (data[1] & 1) != 0;
  const bool parse_special = (data[1] & 2) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  const lamina::Tokenizer& tok = *v.tokenizer;

  const std::vector<TokenId> ids = tok.Encode(text, add_special, parse_special);
  for (TokenId id : ids) {
    if (id < 0 || id >= tok.vocab_size()) Fail(v, "Encode produced an id outside the vocabulary");
  }
  const std::string decoded = tok.Decode(ids);
  for (TokenId id : ids) (void)tok.TokenToPiece(id, /*special=*/true);
  if (v.round_trip && !add_special && !parse_special) {
    const std::string want = v.spm ? SpacesForEscapes(std::string(text))
                                   : lamina::unicode::Encode(lamina::unicode::Decode(text));
    const std::string got = v.spm ? SpacesForEscapes(decoded) : decoded;
    if (got != want) Fail(v, "Decode(Encode(text)) differs from the text");
  }
  const TokenId found = tok.FindToken(text);
  if (found < -1 || found >= tok.vocab_size()) Fail(v, "FindToken out of range");
  return 0;
}
