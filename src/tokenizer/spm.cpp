// SentencePiece-style tokenization as in llama.cpp's llm_tokenizer_spm: start from UTF-8
// characters, repeatedly merge the adjacent pair whose concatenation is the highest-scoring
// token, then fall back to <0xNN> byte tokens for anything left that is not a token.
#include <algorithm>
#include <queue>
#include <unordered_map>
#include <utility>

#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace lamina::tokenizer_internal {

int32_t Vocab::MergeRank(const std::string& left, const std::string& right) const {
  std::string key;
  key.reserve(left.size() + right.size() + 1);
  key += left;
  key += ' ';
  key += right;
  return merge_ranks.Find(key);
}

TokenId Vocab::SpmByteToToken(uint8_t byte) const {
  static constexpr char kHex[] = "0123456789ABCDEF";
  const char buf[6] = {'<', '0', 'x', kHex[byte >> 4], kHex[byte & 15], '>'};
  TokenId id = TextToToken(std::string_view(buf, 6));
  if (id >= 0) return id;
  const char raw = static_cast<char>(byte);
  return TextToToken(std::string_view(&raw, 1));
}

namespace {

struct Symbol {
  int prev;
  int next;
  const char* text;
  size_t n;
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;
};

// Highest score first; ties go to the leftmost pair. std::priority_queue is used as in
// llama.cpp so that even ties between identical entries resolve the same way.
struct BigramLess {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return (l.score < r.score) || (l.score == r.score && l.left > r.left);
  }
};

class SpmSession {
 public:
  explicit SpmSession(const Vocab& vocab) : vocab_(vocab) {}

  void Tokenize(const std::string& text, std::vector<TokenId>* out) {
    int index = 0;
    size_t offs = 0;
    while (offs < text.size()) {
      Symbol sym;
      const size_t len = unicode::SequenceLength(text[offs]);
      sym.text = text.data() + offs;
      sym.n = std::min(len, text.size() - offs);
      offs += sym.n;
      sym.prev = index - 1;
      sym.next = offs == text.size() ? -1 : index + 1;
      ++index;
      symbols_.push_back(sym);
    }
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) TryAddBigram(i - 1, i);

    while (!queue_.empty()) {
      const Bigram bigram = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[bigram.left];
      Symbol& right = symbols_[bigram.right];
      // Skip pairs made stale by an earlier merge.
      if (left.n == 0 || right.n == 0 || left.n + right.n != bigram.size) continue;
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = bigram.left;
      TryAddBigram(left.prev, bigram.left);
      TryAddBigram(bigram.left, left.next);
    }

    if (symbols_.empty()) return;
    for (int i = 0; i != -1; i = symbols_[i].next) Resegment(symbols_[i], out, 0);
  }

 private:
  void Resegment(const Symbol& symbol, std::vector<TokenId>* out, int depth) {
    const std::string_view text(symbol.text, symbol.n);
    const TokenId token = vocab_.TextToToken(text);
    if (token >= 0) {
      out->push_back(token);
      return;
    }
    auto p = rev_merge_.find(std::string(text));
    // The depth bound only guards against pathological inputs whose pieces map back onto
    // themselves; llama.cpp would recurse without end there.
    if (p == rev_merge_.end() || depth > 64) {
      for (size_t j = 0; j < symbol.n; ++j) {
        TokenId id = vocab_.SpmByteToToken(static_cast<uint8_t>(symbol.text[j]));
        if (id < 0) id = vocab_.unk;
        if (id >= 0) out->push_back(id);
      }
      return;
    }
    const auto [l, r] = p->second;
    Resegment(symbols_[l], out, depth + 1);
    Resegment(symbols_[r], out, depth + 1);
  }

  void TryAddBigram(int left, int right) {
    if (left == -1 || right == -1) return;
    std::string text(symbols_[left].text, symbols_[left].n + symbols_[right].n);
    const TokenId token = vocab_.TextToToken(text);
    if (token < 0) return;
    Bigram bigram{left, right, vocab_.scores[token], text.size()};
    queue_.push(bigram);
    rev_merge_[std::move(text)] = {left, right};
  }

  const Vocab& vocab_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue_;
  std::unordered_map<std::string, std::pair<int, int>> rev_merge_;
};

}  // namespace

void SpmTokenize(const Vocab& vocab, const std::string& text, std::vector<TokenId>* out) {
  SpmSession session(vocab);
  session.Tokenize(text, out);
}

}  // namespace lamina::tokenizer_internal
