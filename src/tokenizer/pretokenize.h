// Byte-level BPE pre-tokenization: the regex sequence llama.cpp applies for each
// tokenizer.ggml.pre value, run with PCRE2 (UTF + Unicode properties). Each regex splits every
// piece produced by the previous one into matches and the unmatched gaps between them.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace lamina {

// Per-pre-type behaviour besides the regexes.
struct PreTokenizerConfig {
  std::vector<std::string> patterns;
  bool ignore_merges = false;  // a word that is itself a token skips the merge loop
  bool force_add_bos = false;  // llama.cpp defaults add_bos to true for this type
};

// Fills *config for a tokenizer.ggml.pre value ("" means "default"); false if unknown.
bool PreTokenizerConfigFor(std::string_view pre, PreTokenizerConfig* config);

class PreTokenizer {
 public:
  static Result<std::unique_ptr<PreTokenizer>> Create(const std::vector<std::string>& patterns);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Splits arbitrary bytes into words; each word is returned GPT-2 byte-encoded. Invalid UTF-8
  // bytes become U+FFFD first, as in llama.cpp. Thread-safe.
  std::vector<std::string> Split(std::string_view text) const;

 private:
  PreTokenizer() = default;
  struct Compiled;
  std::vector<Compiled> regexes_;
};

}  // namespace lamina
