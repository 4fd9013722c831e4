// Fuzz target: StreamingDetokenizer over arbitrary id streams on every shipped vocabulary.
// Input: byte 0 picks the vocabulary, then 2-byte little-endian ids (taken modulo a range a
// little wider than the vocabulary on both sides, so invalid ids occur too). The pieces pushed
// and flushed must concatenate to Decode of the ids.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "vocabularies.h"

// Loads the vocabularies before fuzzing starts, so that loading does not count against an
// input's time limit (the regression runner loads on first use instead).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)lamina::fuzz::Vocabs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lamina::TokenId;
  const auto& vocabs = lamina::fuzz::Vocabs();
  if (size < 1) return 0;
  const lamina::fuzz::FuzzVocab& v = vocabs[data[0] % vocabs.size()];
  const lamina::Tokenizer& tok = *v.tokenizer;
  const int64_t span = static_cast<int64_t>(tok.vocab_size()) + 16;  // ids -8 .. n_vocab + 7
  std::vector<TokenId> ids;                                          // [(size - 1) / 2]
  for (size_t i = 1; i + 1 < size; i += 2) {
    const int64_t raw = data[i] | (data[i + 1] << 8);
    ids.push_back(static_cast<TokenId>(raw * (span / 65536 + 1) % span - 8));
  }
  lamina::StreamingDetokenizer detok(tok);
  std::string streamed;
  for (TokenId id : ids) {
    streamed += detok.Push(id);
  }
  streamed += detok.Flush();
  if (streamed != tok.Decode(ids)) {
    std::fprintf(stderr, "fuzz_detokenizer: %s: the stream differs from Decode of the ids\n",
                 v.name.c_str());
    std::abort();
  }
  return 0;
}
