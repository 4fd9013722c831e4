// A byte trie over the pieces of a vocabulary's tokens, so that a walk over the output text's
// possible next bytes (grammar-constrained sampling) visits each shared prefix once instead of
// once per token. Built once per tokenizer (Tokenizer::PieceTrie).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lamina {

class TokenTrie {
 public:
  struct Node {
    uint32_t first_child = 0;  // children are nodes [first_child, first_child + n_children)
    uint32_t n_children = 0;
    uint32_t first_token = 0;  // tokens whose piece ends here: tokens()[first_token, +n_tokens)
    uint32_t n_tokens = 0;
    uint8_t byte = 0;  // the edge byte from the parent (root: unused)
  };

  // Pieces longer than this are kept out of the trie (its build and walks recurse once per byte)
  // and listed in long_tokens() for a check of their own.
  static constexpr size_t kMaxTriePiece = 1024;

  // pieces: [n_vocab] the bytes of each token; ids with an empty piece are left out, as are
  // ids for which include[id] is false (include empty: all).
  TokenTrie(const std::vector<std::string>& pieces, const std::vector<uint8_t>& include);

  const Node& root() const { return nodes_[0]; }
  const Node& node(uint32_t i) const { return nodes_[i]; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  size_t n_nodes() const { return nodes_.size(); }
  const std::vector<int32_t>& long_tokens() const { return long_tokens_; }

 private:
  void Build(uint32_t node, size_t lo, size_t hi, size_t depth,
             const std::vector<std::string>& pieces);

  std::vector<Node> nodes_;           // [n_nodes], node 0 = the root (the empty prefix)
  std::vector<int32_t> tokens_;       // [n_tokens in the trie] ids, grouped by the node they end at
  std::vector<int32_t> order_;        // build scratch: ids sorted by piece
  std::vector<int32_t> long_tokens_;  // ids whose piece is over kMaxTriePiece bytes
};

}  // namespace lamina
