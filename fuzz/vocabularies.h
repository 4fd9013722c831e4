// The vocabularies the tokenizer targets run on: the shipped model's and, when present, the
// vocabulary GGUFs of the shared fixtures (LAMINA_FUZZ_VOCAB_DIR, else ../shared/vocab beside
// the source tree), each loaded once per process.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace lamina::fuzz {

struct FuzzVocab {
  std::string name;  // file name without ".gguf"
  // Decode(Encode(text)) gives back the text (see tests/tokenizer_test.cpp,
  // AllVocabs.ArbitraryBytesRoundTrip): SentencePiece with byte fallback keeps every byte,
  // byte-level BPE keeps the leniently re-encoded UTF-8.
  bool round_trip = false;
  bool spm = false;
  std::unique_ptr<Tokenizer> tokenizer;
};

inline std::vector<FuzzVocab> LoadVocabs() {
  namespace fs = std::filesystem;
  std::vector<std::string> paths = {std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf"};
  const char* env = std::getenv("LAMINA_FUZZ_VOCAB_DIR");
  const std::string dir =
      env != nullptr ? env : std::string(LAMINA_SOURCE_DIR) + "/../shared/vocab";
  std::error_code ec;
  std::vector<std::string> shared;
  if (fs::is_directory(dir, ec)) {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".gguf") shared.push_back(e.path().string());
    }
  } else {
    std::fprintf(stderr, "fuzz: %s not found; only the shipped model's vocabulary is fuzzed\n",
                 dir.c_str());
  }
  std::sort(shared.begin(), shared.end());  // the first input byte picks one: keep it stable
  paths.insert(paths.end(), shared.begin(), shared.end());
  std::vector<FuzzVocab> out;
  for (const std::string& path : paths) {
    auto file = gguf::File::Open(path);
    if (!file.ok()) {
      std::fprintf(stderr, "fuzz: %s: %s\n", path.c_str(), file.error().message.c_str());
      continue;
    }
    auto tok = Tokenizer::FromGguf(**file);
    if (!tok.ok()) {
      std::fprintf(stderr, "fuzz: %s: %s\n", path.c_str(), tok.error().message.c_str());
      continue;
    }
    FuzzVocab v;
    v.name = fs::path(path).stem().string();
    for (const char* rt : {"llama-spm", "gpt-2", "deepseek-coder", "qwen2", "llama-bpe"}) {
      if (v.name == std::string("ggml-vocab-") + rt) v.round_trip = true;
    }
    v.spm = v.name == "ggml-vocab-llama-spm";
    v.tokenizer = std::move(tok).value();
    out.push_back(std::move(v));
  }
  if (out.empty()) {
    std::fprintf(stderr, "fuzz: no vocabulary could be loaded\n");
    std::abort();
  }
  return out;
}

// Loaded on first use and kept for the process (a fuzz target runs millions of inputs).
inline const std::vector<FuzzVocab>& Vocabs() {
  static const std::vector<FuzzVocab>* vocabs = new std::vector<FuzzVocab>(LoadVocabs());
  return *vocabs;
}

}  // namespace lamina::fuzz
