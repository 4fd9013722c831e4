// Internal tables shared by the SentencePiece and byte-level BPE algorithms: token text <-> id,
// scores and merge ranks. Not part of the public tokenizer API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

namespace lamina::tokenizer_internal {

// Open-addressing hash index over a vector of strings: maps a string to the index of an
// equal element. Slots hold only (hash bits, index), 8 bytes each; this keeps loading
// vocabularies with 100K+ tokens and 280K merges cheap (no heap node per entry).
class StringIndex {
 public:
  // keys must outlive the index and not change while indexed.
  void Reset(const std::vector<std::string>* keys) {
    keys_ = keys;
    slots_.assign(CapacityFor(keys->size()), Slot());
    mask_ = slots_.size() - 1;
  }
  // Indexes (*keys)[i] unless an equal key is indexed already; returns the index stored.
  int32_t Insert(int32_t i) {
    const std::string_view key = (*keys_)[i];
    const size_t h = Hash(key);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t s = h & mask_;; s = (s + 1) & mask_) {
      Slot& slot = slots_[s];
      if (slot.index < 0) {
        slot = Slot{tag, i};
        return i;
      }
      if (slot.tag == tag && (*keys_)[slot.index] == key) return slot.index;
    }
  }
  int32_t Find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const size_t h = Hash(key);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t s = h & mask_;; s = (s + 1) & mask_) {
      const Slot& slot = slots_[s];
      if (slot.index < 0) return -1;
      if (slot.tag == tag && (*keys_)[slot.index] == key) return slot.index;
    }
  }

 private:
  struct Slot {
    uint32_t tag = 0;
    int32_t index = -1;  // -1: empty
  };
  static size_t Hash(std::string_view s) { return std::hash<std::string_view>{}(s); }
  static size_t CapacityFor(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;  // load factor <= 1/2
    return cap;
  }
  const std::vector<std::string>* keys_ = nullptr;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

struct Vocab {
  const std::vector<std::string>* tokens = nullptr;  // owned by the Tokenizer
  std::vector<float> scores;                         // one per token (0 when absent)
  StringIndex token_to_id;                           // over *tokens
  // Merge lines "left right"; the index maps a line to its rank (line index).
  std::vector<std::string> merges;
  StringIndex merge_ranks;
  TokenId unk = -1;

  TokenId TextToToken(std::string_view text) const {
    return token_to_id.Find(text);
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
