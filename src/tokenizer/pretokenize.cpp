// PCRE2-backed implementation of llama.cpp's unicode_regex_split (see pretokenize.h).
#include "tokenizer/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>

#include "tokenizer/unicode.h"

namespace lamina {

namespace {

// llama.cpp's contraction alternatives are spelled with explicit case classes rather than
// (?i:...) so that PCRE2's Unicode case folding (e.g. U+017F matching 's') cannot widen them.
constexpr const char* kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Qwen3.5's: Qwen2's with combining marks (\p{M}) inside letter runs.
constexpr const char* kQwen35 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]"
    "+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// GPT-4o's o200k split (gpt-oss, llama4) as llama.cpp spells it: a "case-leading" letter is
// any letter but an ASCII lower-case one ((?=\p{L})[^a-z]) and a "case-trailing" letter any
// letter but an ASCII upper-case one, which is how llama.cpp's engine reads its
// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] classes (its other letters all fall in both).
constexpr const char* kGpt4o =
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Mistral's tekken split (Ministral 3, Mistral Small 3.x, Devstral: mistral3) as llama.cpp
// spells it: gpt-4o's letter runs without the contractions, one digit at a time, punctuation
// runs swallowing newlines and slashes.
constexpr const char* kTekken =
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|"
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// CJK ideographs, U+0800..U+4E00 and Hangul, as in llama.cpp's deepseek patterns.
constexpr const char* kCjk = "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+";
constexpr const char* kGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

}  // namespace

bool PreTokenizerConfigFor(std::string_view pre, PreTokenizerConfig* config) {
  *config = PreTokenizerConfig();
  auto is = [&](std::initializer_list<std::string_view> names) {
    for (auto n : names) {
      if (pre == n) return true;
    }
    return false;
  };
  if (pre.empty() || pre == "default") {
    config->patterns = {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"};
  } else if (is({"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"})) {
    config->patterns = {kLlama3};
    config->ignore_merges = true;
    config->force_add_bos = true;
  } else if (is({"dbrx", "smaug-bpe"})) {
    config->patterns = {kLlama3};
  } else if (is({"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"})) {
    config->patterns = {kQwen2};
  } else if (pre == "qwen35") {
    config->patterns = {kQwen35};
  } else if (is({"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es",
                 "jina-v2-de", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais"})) {
    config->patterns = {kGpt2};
  } else if (is({"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone",
                 "minerva-7b"})) {
    config->patterns = {"\\p{N}", kGpt2};
  } else if (pre == "falcon") {
    config->patterns = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"};
  } else if (pre == "deepseek-coder") {
    config->patterns = {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", kCjk, "\\p{N}"};
  } else if (pre == "deepseek-llm") {
    config->patterns = {
        "[\r\n]",
        "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"
        "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"
        "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"
        "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"
        "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"
        "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
        "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"
        "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"
        "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}"
        "\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}"
        "\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}"
        "\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"
        "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"
        "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"
        "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"
        "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"
        "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
        "\\x{1E900}-\\x{1E943}]+",
        "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
        "\\s+$",
        kCjk,
        "\\p{N}+"};
  } else if (is({"poro-chat", "bloom", "gpt3-finnish"})) {
    config->patterns = {
        " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"};
  } else if (pre == "gpt-4o") {
    config->patterns = {kGpt4o};
  } else if (pre == "tekken") {
    config->patterns = {kTekken};
    config->ignore_merges = true;
    config->force_add_bos = true;
  } else if (is({"chatglm-bpe", "glm4"})) {
    config->patterns = {kLlama3};
  } else {
    return false;
  }
  return true;
}

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
};

PreTokenizer::~PreTokenizer() {
  for (auto& r : regexes_) pcre2_code_free(r.code);
}

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(
    const std::vector<std::string>& patterns) {
  std::unique_ptr<PreTokenizer> pre(new PreTokenizer());
  for (const auto& pattern : patterns) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    // DOLLAR_ENDONLY: llama.cpp's std::regex '$' matches only at the very end of a piece.
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &error_code,
                                     &error_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof(message));
      return Error{"tokenizer: cannot compile pre-tokenizer regex at offset " +
                   std::to_string(error_offset) + ": " + reinterpret_cast<const char*>(message)};
    }
    // JIT is an optimisation only; the interpreter is used when it is unavailable.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    pre->regexes_.push_back(Compiled{code});
  }
  return pre;
}

std::vector<std::string> PreTokenizer::Split(std::string_view text) const {
  const std::vector<uint32_t> cpts = unicode::Decode(text);
  // The subject PCRE2 sees: valid UTF-8 where surrogates and out-of-range codepoints (which
  // llama.cpp's lenient decoder lets through) read as U+FFFD. cpt_start[i] is the byte offset
  // of codepoint i; cpt_index maps a byte offset back to its codepoint.
  std::string subject;
  subject.reserve(text.size());
  std::vector<size_t> cpt_start(cpts.size() + 1);
  for (size_t i = 0; i < cpts.size(); ++i) {
    cpt_start[i] = subject.size();
    uint32_t c = cpts[i];
    if ((c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF) c = 0xFFFD;
    unicode::AppendUtf8(c, &subject);
  }
  cpt_start[cpts.size()] = subject.size();
  std::vector<uint32_t> cpt_index(subject.size() + 1, 0);
  for (size_t i = 0; i <= cpts.size(); ++i) cpt_index[cpt_start[i]] = static_cast<uint32_t>(i);

  // Pieces as codepoint lengths, like llama.cpp's bpe_offsets.
  std::vector<size_t> lengths;
  if (!cpts.empty()) lengths.push_back(cpts.size());
  for (const auto& regex : regexes_) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(regex.code, nullptr);
    std::vector<size_t> next;
    next.reserve(lengths.size() * 2);
    size_t piece_start = 0;  // in codepoints
    for (size_t len : lengths) {
      const size_t b0 = cpt_start[piece_start];
      const size_t b1 = cpt_start[piece_start + len];
      const auto* base = reinterpret_cast<PCRE2_SPTR>(subject.data() + b0);
      const size_t piece_bytes = b1 - b0;
      size_t emitted = 0;  // bytes of this piece already emitted
      size_t search = 0;
      while (search <= piece_bytes) {
        int rc =
            pcre2_match(regex.code, base, piece_bytes, search, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
          // The JIT's fixed stack can run out on huge pieces; the interpreter uses the heap.
          rc = pcre2_match(regex.code, base, piece_bytes, search, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                           md, nullptr);
        }
        if (rc < 0) break;  // no further match: the rest of the piece is one gap
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t m0 = ov[0];
        const size_t m1 = ov[1];
        if (m1 == m0) {
          // Empty matches split nothing; step past one codepoint to keep going.
          if (m0 >= piece_bytes) break;
          search = m0 + unicode::SequenceLength(subject[b0 + m0]);
          continue;
        }
        if (m0 > emitted) {
          next.push_back(cpt_index[b0 + m0] - cpt_index[b0 + emitted]);
        }
        next.push_back(cpt_index[b0 + m1] - cpt_index[b0 + m0]);
        emitted = m1;
        search = m1;
      }
      if (emitted < piece_bytes) {
        next.push_back(cpt_index[b0 + piece_bytes] - cpt_index[b0 + emitted]);
      }
      piece_start += len;
    }
    pcre2_match_data_free(md);
    lengths = std::move(next);
  }

  std::vector<std::string> words;
  words.reserve(lengths.size());
  size_t start = 0;
  std::string utf8;
  for (size_t len : lengths) {
    utf8.clear();
    for (size_t i = start; i < start + len; ++i) unicode::AppendUtf8(cpts[i], &utf8);
    std::string encoded;
    encoded.reserve(utf8.size() * 2);
    for (char c : utf8) encoded += unicode::ByteToUtf8(static_cast<uint8_t>(c));
    words.push_back(std::move(encoded));
    start += len;
  }
  return words;
}

}  // namespace lamina
