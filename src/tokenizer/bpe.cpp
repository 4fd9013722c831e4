// Byte-level BPE as in llama.cpp's llm_tokenizer_bpe: pre-tokenize into byte-encoded words,
// then within each word repeatedly apply the lowest-ranked merge (leftmost on ties).
#include <algorithm>
#include <queue>
#include <string>

#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace lamina::tokenizer_internal {

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
  std::string text;
  int rank;
};

struct BigramGreater {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};

using BigramQueue = std::priority_queue<Bigram, std::vector<Bigram>, BigramGreater>;

void AddBigram(const Vocab& vocab, const std::vector<Symbol>& symbols, int left, int right,
               BigramQueue* queue) {
  if (left == -1 || right == -1) return;
  std::string left_text(symbols[left].text, symbols[left].n);
  std::string right_text(symbols[right].text, symbols[right].n);
  const int rank = vocab.MergeRank(left_text, right_text);
  if (rank < 0) return;
  queue->push(Bigram{left, right, left_text + right_text, rank});
}

}  // namespace

void BpeTokenize(const Vocab& vocab, const PreTokenizer& pre, bool ignore_merges,
                 std::string_view text, std::vector<TokenId>* out) {
  const std::vector<std::string> words = pre.Split(text);
  std::vector<Symbol> symbols;
  for (const std::string& word : words) {
    symbols.clear();
    BigramQueue queue;
    size_t offset = 0;
    if (ignore_merges && vocab.TextToToken(word) >= 0) {
      symbols.push_back(Symbol{-1, -1, word.data(), word.size()});
      offset = word.size();
    }
    int index = 0;
    while (offset < word.size()) {
      Symbol sym;
      sym.text = word.data() + offset;
      sym.n = std::min(word.size() - offset, unicode::SequenceLength(word[offset]));
      offset += sym.n;
      sym.prev = index - 1;
      sym.next = offset == word.size() ? -1 : index + 1;
      ++index;
      symbols.push_back(sym);
    }
    for (int i = 1; i < static_cast<int>(symbols.size()); ++i) {
      AddBigram(vocab, symbols, i - 1, i, &queue);
    }
    while (!queue.empty()) {
      const Bigram bigram = queue.top();
      queue.pop();
      Symbol& left = symbols[bigram.left];
      Symbol& right = symbols[bigram.right];
      if (left.n == 0 || right.n == 0) continue;
      // Skip pairs made stale by an earlier merge.
      if (left.n + right.n != bigram.text.size() ||
          std::string_view(left.text, left.n + right.n) != bigram.text) {
        continue;
      }
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = bigram.left;
      AddBigram(vocab, symbols, left.prev, bigram.left, &queue);
      AddBigram(vocab, symbols, bigram.left, left.next, &queue);
    }
    for (const Symbol& sym : symbols) {
      if (sym.n == 0) continue;
      const std::string_view piece(sym.text, sym.n);
      const TokenId token = vocab.TextToToken(piece);
      if (token >= 0) {
        out->push_back(token);
        continue;
      }
      // A merge whose result is not a token: llama.cpp looks each raw byte up as a token and
      // drops the ones that are not.
      for (char c : piece) {
        const TokenId byte_token = vocab.TextToToken(std::string_view(&c, 1));
        if (byte_token >= 0) out->push_back(byte_token);
      }
    }
  }
}

}  // namespace lamina::tokenizer_internal
