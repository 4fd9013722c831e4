// Vocabulary loading (GGUF metadata -> VocabData -> validated tables), special-token
// partitioning, Encode / TokenToPiece / Decode and the streaming detokenizer. The per-type
// algorithms live in spm.cpp and bpe.cpp; behaviour mirrors llama.cpp's llama-vocab.cpp.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace lamina {

namespace {

using tokenizer_internal::Vocab;

enum class VocabType { kSpm, kBpe };

constexpr std::string_view kEscapedSpace = "\xE2\x96\x81";  // U+2581

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s->size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s->find(from, pos);
    if (hit == std::string::npos) break;
    out.append(*s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(*s, pos, std::string::npos);
  *s = std::move(out);
}

bool IsSpecialAttr(TokenAttr a) { return a == TokenAttr::kControl || a == TokenAttr::kUnknown; }

// A piece of input during special-token partitioning: raw text or an already-chosen token.
struct Fragment {
  TokenId token = -1;  // -1: raw text [offset, offset + length) of the input
  size_t offset = 0;
  size_t length = 0;
};

// The special ids and flags a tokenizer model implies before its metadata overrides them.
struct ModelDefaults {
  int64_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false, add_eos = false;
  PreTokenizerConfig pre_config;
};

class VocabTokenizer final : public Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> Build(VocabData data);

  std::vector<TokenId> Encode(std::string_view text, bool add_special,
                              bool parse_special) const override;
  std::string TokenToPiece(TokenId id, bool special) const override;
  std::string Decode(const std::vector<TokenId>& ids) const override;

  TokenId Find(std::string_view text) const { return vocab_.TextToToken(text); }

 private:
  VocabTokenizer() = default;
  // The steps of Build, in order.
  static Status CheckTableSizes(const VocabData& data);
  Status ApplyModelDefaults(const VocabData& data, ModelDefaults* defaults);
  Status LoadTokens(VocabData* data);
  Status LoadMerges(VocabData* data, const PreTokenizerConfig& pre_config);
  Status ResolveSpecialIds(const VocabData& data, const ModelDefaults& defaults);
  void FindEndOfGeneration();
  void HarmonyTokens(std::vector<TokenId>* eog);
  void BuildSpecialCache();
  void SetStripFlags(const std::string& model_name);

  std::vector<Fragment> Partition(std::string_view text, bool parse_special) const;

  VocabType type_ = VocabType::kSpm;
  Vocab vocab_;
  std::unique_ptr<PreTokenizer> pre_;
  bool ignore_merges_ = false;
  bool add_space_prefix_ = false;
  std::vector<uint8_t> lstrip_;         // per token: eat whitespace before it when partitioning
  std::vector<uint8_t> rstrip_;         // per token: eat whitespace after it
  std::vector<TokenId> special_cache_;  // control/user-defined/unknown, longest text first
};

Result<std::unique_ptr<Tokenizer>> VocabTokenizer::Build(VocabData data) {
  std::unique_ptr<VocabTokenizer> tok(new VocabTokenizer());
  if (Status s = CheckTableSizes(data); !s.ok()) return s.error();
  ModelDefaults defaults;
  if (Status s = tok->ApplyModelDefaults(data, &defaults); !s.ok()) return s.error();
  if (Status s = tok->LoadTokens(&data); !s.ok()) return s.error();
  if (tok->type_ == VocabType::kBpe) {
    if (Status s = tok->LoadMerges(&data, defaults.pre_config); !s.ok()) return s.error();
  }
  if (Status s = tok->ResolveSpecialIds(data, defaults); !s.ok()) return s.error();
  tok->FindEndOfGeneration();
  tok->BuildSpecialCache();
  tok->SetStripFlags(data.name);
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

// The token count, and the score and type tables at least as long as the token table.
Status VocabTokenizer::CheckTableSizes(const VocabData& data) {
  const size_t n_tokens = data.tokens.size();
  if (n_tokens == 0) return Error{"tokenizer: tokenizer.ggml.tokens is missing or empty"};
  if (n_tokens > static_cast<size_t>(INT32_MAX)) {
    return Error{"tokenizer: too many tokens (" + std::to_string(n_tokens) + ")"};
  }
  if (!data.scores.empty() && data.scores.size() < n_tokens) {
    return Error{"tokenizer: tokenizer.ggml.scores has " + std::to_string(data.scores.size()) +
                 " entries for " + std::to_string(n_tokens) + " tokens"};
  }
  if (!data.token_types.empty() && data.token_types.size() < n_tokens) {
    return Error{"tokenizer: tokenizer.ggml.token_type has " +
                 std::to_string(data.token_types.size()) + " entries for " +
                 std::to_string(n_tokens) + " tokens"};
  }
  return Status::Ok();
}

// Per-model defaults, as in llama.cpp's llama_vocab::impl::load.
Status VocabTokenizer::ApplyModelDefaults(const VocabData& data, ModelDefaults* defaults) {
  if (data.model == "llama") {
    type_ = VocabType::kSpm;
    defaults->bos = 1;
    defaults->eos = 2;
    defaults->unk = 0;
    defaults->add_bos = true;
    add_space_prefix_ = true;
  } else if (data.model == "gpt2") {
    type_ = VocabType::kBpe;
    defaults->bos = 11;
    defaults->eos = 11;
    if (!PreTokenizerConfigFor(data.pre, &defaults->pre_config)) {
      return Error{"tokenizer: unknown pre-tokenizer type (tokenizer.ggml.pre) '" + data.pre + "'"};
    }
    defaults->add_bos = defaults->pre_config.force_add_bos;
    ignore_merges_ = defaults->pre_config.ignore_merges;
    add_space_prefix_ = false;
  } else {
    return Error{"tokenizer: unsupported tokenizer model (tokenizer.ggml.model) '" + data.model +
                 "'; supported: 'llama' (SentencePiece), 'gpt2' (byte-level BPE)"};
  }
  if (data.add_space_prefix) add_space_prefix_ = *data.add_space_prefix;
  return Status::Ok();
}

// The token texts (empty ones named "[EMPTY_i]"), their scores and attributes; a text given to
// two ids is an error.
Status VocabTokenizer::LoadTokens(VocabData* data) {
  const size_t n_tokens = data->tokens.size();
  tokens_ = std::move(data->tokens);
  attrs_.assign(n_tokens, TokenAttr::kNormal);
  vocab_.tokens = &tokens_;
  vocab_.scores.assign(n_tokens, 0.0f);
  for (size_t i = 0; i < n_tokens; ++i) {
    if (tokens_[i].empty()) tokens_[i] = "[EMPTY_" + std::to_string(i) + "]";
  }
  vocab_.token_to_id.Reset(&tokens_);
  for (size_t i = 0; i < n_tokens; ++i) {
    const std::string& word = tokens_[i];
    const TokenId stored = vocab_.token_to_id.Insert(static_cast<TokenId>(i));
    if (stored != static_cast<TokenId>(i)) {
      return Error{"tokenizer: duplicate token '" + word + "' with ids " + std::to_string(stored) +
                   " and " + std::to_string(i)};
    }
    if (!data->scores.empty()) vocab_.scores[i] = data->scores[i];
    if (!data->token_types.empty()) {
      const int32_t t = data->token_types[i];
      attrs_[i] = (t >= 0 && t <= 6) ? static_cast<TokenAttr>(t) : TokenAttr::kUndefined;
    }
  }
  return Status::Ok();
}

// BPE: the merge ranks and the pre-tokenizer.
Status VocabTokenizer::LoadMerges(VocabData* data, const PreTokenizerConfig& pre_config) {
  if (data->merges.empty()) {
    return Error{"tokenizer: tokenizer.ggml.merges is missing or empty"};
  }
  if (data->merges.size() > static_cast<size_t>(INT32_MAX)) {
    return Error{"tokenizer: too many merges (" + std::to_string(data->merges.size()) + ")"};
  }
  vocab_.merges = std::move(data->merges);
  vocab_.merge_ranks.Reset(&vocab_.merges);
  for (size_t i = 0; i < vocab_.merges.size(); ++i) {
    const std::string& line = vocab_.merges[i];
    // Split at the first space after position 0, like llama.cpp; a line without one
    // names no pair that a word could ever form. Earlier lines win over duplicates.
    if (line.size() < 2 || line.find(' ', 1) == std::string::npos) continue;
    vocab_.merge_ranks.Insert(static_cast<int32_t>(i));
  }
  auto pre = PreTokenizer::Create(pre_config.patterns);
  if (!pre.ok()) return pre.error();
  pre_ = std::move(pre).value();
  return Status::Ok();
}

// Special ids: metadata wins when in range; out-of-range values (e.g. 0xFFFFFFFF for
// "none") are ignored and the default stays, as llama.cpp does.
Status VocabTokenizer::ResolveSpecialIds(const VocabData& data, const ModelDefaults& defaults) {
  const auto n = static_cast<int64_t>(tokens_.size());
  auto resolve = [&](int64_t def, const std::optional<int64_t>& given) -> TokenId {
    int64_t id = (def >= 0 && def < n) ? def : -1;
    if (given && *given >= 0 && *given < n) id = *given;
    return static_cast<TokenId>(id);
  };
  bos_ = resolve(defaults.bos, data.bos_id);
  eos_ = resolve(defaults.eos, data.eos_id);
  eot_ = resolve(-1, data.eot_id);
  vocab_.unk = resolve(defaults.unk, data.unk_id);
  bool add_bos = defaults.add_bos, add_eos = defaults.add_eos;
  if (data.add_bos) add_bos = *data.add_bos;
  if (data.add_eos) add_eos = *data.add_eos;
  if (add_bos && bos_ < 0) {
    return Error{"tokenizer: tokenizer.ggml.add_bos_token is true but there is no valid BOS id"};
  }
  if (add_eos && eos_ < 0) {
    return Error{"tokenizer: tokenizer.ggml.add_eos_token is true but there is no valid EOS id"};
  }
  add_bos_ = add_bos;
  add_eos_ = add_eos;
  return Status::Ok();
}

// End-of-turn / end-of-generation tokens found by their text (llama.cpp's workaround for
// converters that do not record them). The first list entry present becomes EOT when the
// metadata names none; such tokens are made control tokens so they render and parse as
// specials. "</s>" counts only when it already is a control token: some vocabularies (phi-3)
// use it as plain user-defined text.
void VocabTokenizer::FindEndOfGeneration() {
  static const char* const kEogTexts[] = {
      "<|eot_id|>",
      "<|im_end|>",
      "<|end|>",
      "<end_of_turn>",
      "<|endoftext|>",
      "<|end_of_text|>",
      "<EOT>",
      "_<EOT>",
      "<|eom_id|>",
      // One text, split so that the hex escapes end where they should.
      ("<\xEF\xBD\x9C"
       "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"),
  };
  std::vector<TokenId> eog;
  for (const char* text : kEogTexts) {
    const TokenId id = vocab_.TextToToken(text);
    if (id < 0) continue;
    if (eot_ < 0 && std::string_view(text) != "<|eom_id|>") eot_ = id;
    attrs_[id] = TokenAttr::kControl;
    eog.push_back(id);
  }
  for (const char* text : {"</s>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}) {
    const TokenId id = vocab_.TextToToken(text);
    if (id >= 0 && attrs_[id] == TokenAttr::kControl) eog.push_back(id);
  }
  HarmonyTokens(&eog);
  if (eos_ >= 0) eog.push_back(eos_);
  if (eot_ >= 0) eog.push_back(eot_);
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  eog_ids_ = std::move(eog);
}

// gpt-oss's harmony vocabulary (o200k_harmony, as llama.cpp reads it): with both <|return|> and
// <|call|> present, those two end generation and <|end|>, which closes every message of an
// answer (its reasoning included), does not; the message markers <|start|>, <|channel|>,
// <|message|> and <|constrain|> are user-defined tokens, so they render in generated text
// (chat/harmony.h reads them) and are still matched as one token in a prompt.
void VocabTokenizer::HarmonyTokens(std::vector<TokenId>* eog) {
  const TokenId ret = vocab_.TextToToken("<|return|>");
  const TokenId call = vocab_.TextToToken("<|call|>");
  if (ret < 0 || call < 0) return;
  const TokenId end = vocab_.TextToToken("<|end|>");
  if (end >= 0) {
    eog->erase(std::remove(eog->begin(), eog->end(), end), eog->end());
    if (eot_ == end) eot_ = ret;
  }
  for (TokenId id : {ret, call}) {
    attrs_[id] = TokenAttr::kControl;
    eog->push_back(id);
  }
  for (const char* text : {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"}) {
    if (const TokenId id = vocab_.TextToToken(text); id >= 0) attrs_[id] = TokenAttr::kUserDefined;
  }
}

// The control, user-defined and unknown tokens, longest first so that a special token
// containing another one wins.
void VocabTokenizer::BuildSpecialCache() {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const TokenAttr a = attrs_[i];
    if (a == TokenAttr::kControl || a == TokenAttr::kUserDefined || a == TokenAttr::kUnknown) {
      special_cache_.push_back(static_cast<TokenId>(i));
    }
  }
  std::stable_sort(special_cache_.begin(), special_cache_.end(),
                   [&](TokenId a, TokenId b) { return tokens_[a].size() > tokens_[b].size(); });
}

// Per-model token attributes llama.cpp sets by name: phi-3 special tokens swallow the
// whitespace that follows them, except <unk>, <s> and <|endoftext|>.
void VocabTokenizer::SetStripFlags(const std::string& model_name) {
  lstrip_.assign(tokens_.size(), 0);
  rstrip_.assign(tokens_.size(), 0);
  std::string name = model_name;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (TokenId id : special_cache_) rstrip_[id] = 1;
    for (const char* text : {"</s>"}) {
      const TokenId id = vocab_.TextToToken(text);
      if (id >= 0) rstrip_[id] = 1;
    }
    for (const char* text : {"<unk>", "<s>", "<|endoftext|>"}) {
      const TokenId id = vocab_.TextToToken(text);
      if (id >= 0) rstrip_[id] = 0;
    }
  }
}

// llama.cpp's tokenizer_st_partition: for each special token in turn (longest first), split
// every remaining raw-text fragment at each occurrence of its text.
std::vector<Fragment> VocabTokenizer::Partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back(Fragment{-1, 0, text.size()});
  std::vector<Fragment> next;
  for (const TokenId special : special_cache_) {
    // Control and unknown tokens only count with parse_special; user-defined ones always do.
    if (!parse_special && IsSpecialAttr(attrs_[special])) continue;
    const std::string& needle = tokens_[special];
    bool changed = false;
    next.clear();
    for (const Fragment& frag : fragments) {
      if (frag.token >= 0) {
        next.push_back(frag);
        continue;
      }
      size_t base = frag.offset;
      size_t length = frag.length;
      const std::string_view window = text.substr(0, frag.offset + frag.length);
      while (true) {
        const size_t match = window.find(needle, base);
        if (match == std::string_view::npos) {
          if (length > 0) next.push_back(Fragment{-1, base, length});
          break;
        }
        changed = true;
        if (match > base) {
          size_t left_length = match - base;
          if (lstrip_[special]) {
            while (left_length > 0 && IsAsciiSpace(text[base + left_length - 1])) --left_length;
          }
          if (left_length > 0) next.push_back(Fragment{-1, base, left_length});
        }
        next.push_back(Fragment{special, 0, 0});
        size_t right = match + needle.size();
        size_t right_length = base + length - right;
        if (rstrip_[special]) {
          while (right_length > 0 && IsAsciiSpace(text[right])) {
            ++right;
            --right_length;
          }
        }
        base = right;
        length = right_length;
        if (length == 0) break;
      }
    }
    if (changed) fragments.swap(next);
  }
  return fragments;
}

std::vector<TokenId> VocabTokenizer::Encode(std::string_view text, bool add_special,
                                            bool parse_special) const {
  std::vector<TokenId> out;
  const std::vector<Fragment> fragments = Partition(text, parse_special);
  if (add_special && add_bos_) out.push_back(bos_);
  if (type_ == VocabType::kSpm) {
    bool prev_special = true;  // the first text fragment gets the space prefix
    std::string piece;
    for (const Fragment& frag : fragments) {
      if (frag.token >= 0) {
        out.push_back(frag.token);
        prev_special = true;
        continue;
      }
      piece.clear();
      if (add_space_prefix_ && prev_special) piece.push_back(' ');
      piece.append(text.substr(frag.offset, frag.length));
      ReplaceAll(&piece, " ", kEscapedSpace);
      tokenizer_internal::SpmTokenize(vocab_, piece, &out);
      prev_special = false;
    }
  } else {
    for (const Fragment& frag : fragments) {
      if (frag.token >= 0) {
        out.push_back(frag.token);
      } else {
        tokenizer_internal::BpeTokenize(vocab_, *pre_, ignore_merges_,
                                        text.substr(frag.offset, frag.length), &out);
      }
    }
  }
  if (add_special && add_eos_) out.push_back(eos_);
  return out;
}

std::string VocabTokenizer::TokenToPiece(TokenId id, bool special) const {
  if (id < 0 || id >= vocab_size()) return "";
  const TokenAttr attr = attrs_[id];
  if (!special && IsSpecialAttr(attr)) return "";
  const std::string& text = tokens_[id];
  switch (attr) {
    case TokenAttr::kControl:
    case TokenAttr::kUnknown:
    case TokenAttr::kUserDefined:
      return text;
    case TokenAttr::kNormal: {
      if (type_ == VocabType::kSpm) {
        std::string result = text;
        ReplaceAll(&result, kEscapedSpace, " ");
        return result;
      }
      // Byte-level BPE: every codepoint stands for one byte.
      std::string result;
      const std::vector<uint32_t> cpts = unicode::Decode(text);
      std::string utf8;
      for (uint32_t cpt : cpts) {
        utf8.clear();
        unicode::AppendUtf8(cpt, &utf8);
        uint8_t byte;
        if (unicode::Utf8ToByte(utf8, &byte)) {
          result.push_back(static_cast<char>(byte));
        } else {
          // llama.cpp's marker for a codepoint outside the byte table.
          static constexpr char kHex[] = "0123456789abcdef";
          result += "[UNK_BYTE_0x";
          for (unsigned char c : utf8) {
            result.push_back(kHex[c >> 4]);
            result.push_back(kHex[c & 15]);
          }
          result += text + "]";
        }
      }
      return result;
    }
    case TokenAttr::kByte: {
      // "<0xNN>"
      auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
      };
      if (text.size() >= 6 && text.compare(0, 3, "<0x") == 0) {
        const int hi = hex(text[3]);
        const int lo = hex(text[4]);
        if (hi >= 0 && lo >= 0) return std::string(1, static_cast<char>(hi * 16 + lo));
      }
      return "";
    }
    default:
      return "";
  }
}

std::string VocabTokenizer::Decode(const std::vector<TokenId>& ids) const {
  std::string out;
  bool remove_space = add_space_prefix_;
  for (TokenId id : ids) {
    std::string piece = TokenToPiece(id, false);
    // Only the very first token's leading space is the tokenizer's own prefix.
    if (remove_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    remove_space = false;
    out += piece;
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromVocab(VocabData vocab) {
  return VocabTokenizer::Build(std::move(vocab));
}

namespace {

Result<std::vector<std::string>> ReadStringArray(const gguf::File& file, std::string_view key,
                                                 bool required) {
  std::vector<std::string> out;
  const gguf::Value* v = file.Find(key);
  if (v == nullptr) {
    if (required) return Error{"tokenizer: missing metadata key " + std::string(key)};
    return out;
  }
  if (v->type != gguf::ValueType::kArray || v->elem_type != gguf::ValueType::kString) {
    return Error{"tokenizer: " + std::string(key) + " must be an array of strings"};
  }
  out.reserve(v->array.size());
  for (const auto& e : v->array) out.push_back(e.str);
  return out;
}

Result<std::optional<int64_t>> ReadOptionalInt(const gguf::File& file, std::string_view key) {
  const gguf::Value* v = file.Find(key);
  if (v == nullptr) return std::optional<int64_t>();
  int64_t x;
  if (!v->AsInt64(&x)) return Error{"tokenizer: " + std::string(key) + " must be an integer"};
  return std::optional<int64_t>(x);
}

Result<std::optional<bool>> ReadOptionalBool(const gguf::File& file, std::string_view key) {
  const gguf::Value* v = file.Find(key);
  if (v == nullptr) return std::optional<bool>();
  if (v->type != gguf::ValueType::kBool) {
    return Error{"tokenizer: " + std::string(key) + " must be a bool"};
  }
  return std::optional<bool>(v->u != 0);
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const gguf::File& file) {
  VocabData data;
  auto model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) return Error{"tokenizer: " + model.error().message};
  data.model = std::move(model).value();
  if (file.Find("tokenizer.ggml.pre") != nullptr) {
    auto pre = file.GetString("tokenizer.ggml.pre");
    if (!pre.ok()) return Error{"tokenizer: " + pre.error().message};
    data.pre = std::move(pre).value();
  }
  if (file.Find("general.name") != nullptr) {
    auto name = file.GetString("general.name");
    if (name.ok()) data.name = std::move(name).value();
  }

  auto tokens = ReadStringArray(file, "tokenizer.ggml.tokens", true);
  if (!tokens.ok()) return tokens.error();
  data.tokens = std::move(tokens).value();

  if (const gguf::Value* v = file.Find("tokenizer.ggml.scores")) {
    if (v->type != gguf::ValueType::kArray ||
        (v->elem_type != gguf::ValueType::kF32 && v->elem_type != gguf::ValueType::kI32)) {
      return Error{"tokenizer: tokenizer.ggml.scores must be an array of f32 or i32"};
    }
    data.scores.reserve(v->array.size());
    for (const auto& e : v->array) {
      double d = 0;
      e.AsDouble(&d);
      data.scores.push_back(static_cast<float>(d));
    }
  }
  if (const gguf::Value* v = file.Find("tokenizer.ggml.token_type")) {
    if (v->type != gguf::ValueType::kArray ||
        !(v->elem_type == gguf::ValueType::kI32 || v->elem_type == gguf::ValueType::kU32)) {
      return Error{"tokenizer: tokenizer.ggml.token_type must be an array of i32"};
    }
    data.token_types.reserve(v->array.size());
    for (const auto& e : v->array) {
      int64_t t = 0;
      e.AsInt64(&t);
      data.token_types.push_back(static_cast<int32_t>(t));
    }
  }
  auto merges = ReadStringArray(file, "tokenizer.ggml.merges", false);
  if (!merges.ok()) return merges.error();
  data.merges = std::move(merges).value();

  struct IntKey {
    const char* key;
    std::optional<int64_t>* field;
  };
  for (const IntKey& k : {IntKey{"tokenizer.ggml.bos_token_id", &data.bos_id},
                          IntKey{"tokenizer.ggml.eos_token_id", &data.eos_id},
                          IntKey{"tokenizer.ggml.eot_token_id", &data.eot_id},
                          IntKey{"tokenizer.ggml.unknown_token_id", &data.unk_id},
                          IntKey{"tokenizer.ggml.padding_token_id", &data.pad_id}}) {
    auto v = ReadOptionalInt(file, k.key);
    if (!v.ok()) return v.error();
    *k.field = *v;
  }
  struct BoolKey {
    const char* key;
    std::optional<bool>* field;
  };
  for (const BoolKey& k : {BoolKey{"tokenizer.ggml.add_bos_token", &data.add_bos},
                           BoolKey{"tokenizer.ggml.add_eos_token", &data.add_eos},
                           BoolKey{"tokenizer.ggml.add_space_prefix", &data.add_space_prefix}}) {
    auto v = ReadOptionalBool(file, k.key);
    if (!v.ok()) return v.error();
    *k.field = *v;
  }
  return FromVocab(std::move(data));
}

const TokenTrie& Tokenizer::PieceTrie() const {
  std::call_once(piece_trie_once_, [this] {
    std::vector<std::string> pieces(tokens_.size());
    std::vector<uint8_t> include(tokens_.size(), 1);
    for (size_t id = 0; id < tokens_.size(); ++id) {
      const TokenAttr attr = attrs_[id];
      if (attr == TokenAttr::kControl || attr == TokenAttr::kUnused ||
          IsEog(static_cast<TokenId>(id))) {
        include[id] = 0;
        continue;
      }
      pieces[id] = TokenToPiece(static_cast<TokenId>(id), false);
    }
    piece_trie_ = std::make_unique<TokenTrie>(pieces, include);
  });
  return *piece_trie_;
}

bool Tokenizer::IsEog(TokenId id) const {
  return id >= 0 && std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

TokenId Tokenizer::FindToken(std::string_view text) const {
  if (const auto* vt = dynamic_cast<const VocabTokenizer*>(this)) return vt->Find(text);
  // Linear fallback for other subclasses (test doubles), which have no hash index.
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i] == text) return static_cast<TokenId>(i);
  }
  return -1;
}

std::string StreamingDetokenizer::Push(TokenId id) {
  // The first token goes through Decode so that its leading space is dropped exactly as
  // Decode drops it: the concatenated output equals Decode of all ids.
  pending_ += first_ ? tokenizer_.Decode({id}) : tokenizer_.TokenToPiece(id, false);
  first_ = false;
  const size_t hold = unicode::IncompleteTailLength(pending_);
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StreamingDetokenizer::Flush() {
  std::string out = std::move(pending_);
  pending_.clear();
  return out;
}

}  // namespace lamina
