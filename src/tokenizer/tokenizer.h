// Tokenizers loaded from GGUF metadata: SentencePiece-style (tokenizer.ggml.model = "llama":
// scores, byte fallback) and byte-level BPE ("gpt2": merges, pre-tokenizer regexes chosen by
// tokenizer.ggml.pre and run with PCRE2). Behaviour follows llama.cpp's tokenizer so that its
// test suites pass case by case.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/token_trie.h"
#include "util/status.h"

namespace lamina {

using TokenId = int32_t;

// tokenizer.ggml.token_type values.
enum class TokenAttr : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The tokenizer.ggml.* metadata in plain form (what FromGguf reads), so that vocabularies can
// also be built in memory. Optional fields are absent from the metadata when unset; llama.cpp's
// per-model defaults then apply.
struct VocabData {
  std::string model;  // tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level BPE)
  std::string pre;    // tokenizer.ggml.pre
  std::string name;   // general.name (llama.cpp keys a few per-model token attributes on it)
  std::vector<std::string> tokens;
  std::vector<float> scores;         // empty, or one per token
  std::vector<int32_t> token_types;  // empty (all normal), or one TokenAttr value per token
  std::vector<std::string> merges;   // "left right", in rank order (BPE only)
  std::optional<int64_t> bos_id, eos_id, eot_id, unk_id, pad_id;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
};

class Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> FromGguf(const gguf::File& file);
  // Validates the data (lengths, ids, known model / pre-tokenizer) and builds the tokenizer.
  static Result<std::unique_ptr<Tokenizer>> FromVocab(VocabData vocab);
  virtual ~Tokenizer() = default;

  // add_special: prepend BOS / append EOS as the vocabulary's add_bos_token / add_eos_token say.
  // parse_special: recognise the text of special/control tokens (e.g. "<|im_start|>") as those
  // tokens; otherwise such text is tokenized as plain text.
  virtual std::vector<TokenId> Encode(std::string_view text, bool add_special,
                                      bool parse_special) const = 0;

  // The bytes of one token. special=false renders control tokens (BOS, EOS, ...) as "";
  // byte tokens (<0xNN>) become the raw byte; SPM's U+2581 becomes a space; byte-level BPE
  // pieces are mapped back to bytes.
  virtual std::string TokenToPiece(TokenId id, bool special) const = 0;
  // Concatenated pieces (special=false), with SPM's leading space of the first token removed
  // when the vocabulary adds a space prefix.
  virtual std::string Decode(const std::vector<TokenId>& ids) const = 0;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  TokenId bos() const { return bos_; }
  TokenId eos() const { return eos_; }
  TokenId eot() const { return eot_; }  // -1 when absent
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  // End of generation: EOS, EOT, or any token the vocabulary marks as such (e.g. <|im_end|>).
  bool IsEog(TokenId id) const;
  const std::string& TokenText(TokenId id) const { return tokens_.at(id); }
  TokenAttr Attr(TokenId id) const { return attrs_.at(id); }
  // The id of a token with exactly this text, or -1.
  TokenId FindToken(std::string_view text) const;
  // A byte trie over the pieces (TokenToPiece(id, false)) of every token that is not control,
  // unused, end-of-generation or empty; built on first use, then shared (thread-safe).
  const TokenTrie& PieceTrie() const;

 protected:
  std::vector<std::string> tokens_;
  std::vector<TokenAttr> attrs_;
  TokenId bos_ = -1;
  TokenId eos_ = -1;
  TokenId eot_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
  std::vector<TokenId> eog_ids_;

 private:
  mutable std::once_flag piece_trie_once_;
  mutable std::unique_ptr<TokenTrie> piece_trie_;
};

// Turns a stream of token ids into text without splitting a UTF-8 character across outputs:
// bytes of an incomplete character are held until it completes (or flushed as-is by Flush()).
// at_start: the tokens begin the text, so the first one loses its leading space as Decode drops
// it; false: they continue a text (a prompt), so every token is its piece (llama.cpp's output).
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool at_start = true)
      : tokenizer_(tokenizer), first_(at_start) {}
  std::string Push(TokenId id);
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
  bool first_ = true;
};

}  // namespace lamina
