// Internal tables shared by the SentencePiece and byte-level BPE algorithms: token text <-> id,
// scores and merge ranks. Not part of the public tokenizer API.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

namespace lamina::tokenizer_internal {

// Lets unordered_map<std::string, ...> be probed with a string_view without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct Vocab {
  const std::vector<std::string>* tokens = nullptr;  // owned by the Tokenizer
  std::vector<float> scores;                         // one per token (0 when absent)
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> token_to_id;
  // Key is "left right" (the merge line itself); value is the rank (line index).
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> merge_ranks;
  TokenId unk = -1;

  TokenId TextToToken(std::string_view text) const {
    auto it = token_to_id.find(text);
    return it == token_to_id.end() ? -1 : it->second;
  }
  // Rank of merging left+right, or -1.
  int32_t MergeRank(const std::string& left, const std::string& right) const;
  // SentencePiece byte fallback: "<0xNN>", else the byte itself as a token, else -1.
  TokenId SpmByteToToken(uint8_t byte) const;
};

// llama.cpp's llm_tokenizer_spm: text is already space-escaped (U+2581) and prefixed.
void SpmTokenize(const Vocab& vocab, const std::string& text, std::vector<TokenId>* out);

// llama.cpp's llm_tokenizer_bpe on one raw-text fragment.
void BpeTokenize(const Vocab& vocab, const PreTokenizer& pre, bool ignore_merges,
                 std::string_view text, std::vector<TokenId>* out);

}  // namespace lamina::tokenizer_internal
