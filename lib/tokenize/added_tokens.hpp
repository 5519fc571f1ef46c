// Internal to lib/tokenize: splitting added tokens (<|endoftext|>, ...) out of text, as HF's
// AddedVocabulary does before anything else sees the text.
//
// Matching is leftmost-longest (HF uses Aho-Corasick with that match kind): the match that starts
// first wins, and of those the longest. lstrip/rstrip widen a match over the Unicode whitespace
// beside it (which then belongs to the token and is not encoded).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenize/unicode.hpp"

namespace trainctl::tokenize::detail {

class AddedTokenMatcher {
 public:
  void add(std::string_view content, int32_t id, bool lstrip, bool rstrip);
  bool empty() const { return nodes_.size() <= 1; }

  // Calls piece(id, begin, end) for every part of `text` in order: id >= 0 for an added token
  // (its match, widened by lstrip/rstrip), -1 for the text between matches (never empty).
  template <typename Piece>
  void split(std::string_view text, Piece&& piece) const {
    size_t gap = 0;  // start of the text not yet handed out
    for (size_t pos = 0; pos < text.size();) {
      if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
        ++pos;
        continue;
      }
      const Match match = longest_at(text, pos);
      if (match.token < 0) {
        ++pos;
        continue;
      }
      const Token& token = tokens_[match.token];
      size_t begin = pos;
      size_t end = pos + match.length;
      if (token.lstrip) begin = std::max(whitespace_before(text, begin), gap);
      if (token.rstrip) end = whitespace_after(text, end);
      if (gap < begin) piece(-1, gap, begin);
      piece(token.id, begin, end);
      gap = pos = end;
    }
    if (gap < text.size()) piece(-1, gap, text.size());
  }

 private:
  struct Token {
    int32_t id;
    bool lstrip;
    bool rstrip;
  };
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte -> node
    int32_t token = -1;                                 // index in tokens_, -1: none ends here
  };
  struct Match {
    int32_t token = -1;
    size_t length = 0;
  };
  Match longest_at(std::string_view text, size_t pos) const;
  static size_t whitespace_before(std::string_view text, size_t pos);
  static size_t whitespace_after(std::string_view text, size_t pos);

  std::vector<Node> nodes_{1};  // a byte trie; node 0 is the root
  std::vector<Token> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace trainctl::tokenize::detail
