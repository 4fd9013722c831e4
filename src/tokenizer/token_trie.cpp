// TokenTrie: ids sorted by piece, then one node per distinct prefix, children contiguous.
#include "tokenizer/token_trie.h"

#include <algorithm>

namespace lamina {

TokenTrie::TokenTrie(const std::vector<std::string>& pieces, const std::vector<uint8_t>& include) {
  for (size_t id = 0; id < pieces.size(); ++id) {
    if (pieces[id].empty()) continue;
    if (!include.empty() && !include[id]) continue;
    if (pieces[id].size() > kMaxTriePiece) {
      long_tokens_.push_back(static_cast<int32_t>(id));
      continue;
    }
    order_.push_back(static_cast<int32_t>(id));
  }
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    return pieces[a] < pieces[b] || (pieces[a] == pieces[b] && a < b);
  });
  nodes_.emplace_back();
  Build(0, 0, order_.size(), 0, pieces);
  order_.clear();
  order_.shrink_to_fit();
}

void TokenTrie::Build(uint32_t node, size_t lo, size_t hi, size_t depth,
                      const std::vector<std::string>& pieces) {
  // Sorted order puts the pieces that end at this depth first.
  size_t i = lo;
  nodes_[node].first_token = static_cast<uint32_t>(tokens_.size());
  while (i < hi && pieces[order_[i]].size() == depth) tokens_.push_back(order_[i++]);
  nodes_[node].n_tokens = static_cast<uint32_t>(tokens_.size()) - nodes_[node].first_token;
  // Group the rest by their byte at `depth`.
  struct Group {
    uint8_t byte;
    size_t lo, hi;
  };
  std::vector<Group> groups;
  while (i < hi) {
    const uint8_t b = static_cast<uint8_t>(pieces[order_[i]][depth]);
    size_t j = i + 1;
    while (j < hi && static_cast<uint8_t>(pieces[order_[j]][depth]) == b) ++j;
    groups.push_back({b, i, j});
    i = j;
  }
  const uint32_t first = static_cast<uint32_t>(nodes_.size());
  nodes_[node].first_child = first;
  nodes_[node].n_children = static_cast<uint32_t>(groups.size());
  nodes_.resize(nodes_.size() + groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    nodes_[first + g].byte = groups[g].byte;
    Build(first + static_cast<uint32_t>(g), groups[g].lo, groups[g].hi, depth + 1, pieces);
  }
}

}  // namespace lamina
