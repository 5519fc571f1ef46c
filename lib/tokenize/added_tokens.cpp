// Added-token splitting (added_tokens.hpp).
#include "tokenize/added_tokens.hpp"

namespace trainctl::tokenize::detail {
namespace {

int32_t child_of(const std::vector<std::pair<uint8_t, int32_t>>& children, uint8_t byte) {
  for (const auto& [edge, node] : children)
    if (edge == byte) return node;
  return -1;
}

}  // namespace

void AddedTokenMatcher::add(std::string_view content, int32_t id, bool lstrip, bool rstrip) {
  if (content.empty()) return;
  int32_t node = 0;
  for (const char c : content) {
    const auto byte = static_cast<uint8_t>(c);
    int32_t next = child_of(nodes_[node].children, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_[node].children.emplace_back(byte, next);
      nodes_.emplace_back();
    }
    node = next;
  }
  first_byte_[static_cast<uint8_t>(content[0])] = true;
  // Two tokens with one content: the later one wins, as in HF's map of contents.
  nodes_[node].token = static_cast<int32_t>(tokens_.size());
  tokens_.push_back({id, lstrip, rstrip});
}

AddedTokenMatcher::Match AddedTokenMatcher::longest_at(std::string_view text, size_t pos) const {
  Match best;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    node = child_of(nodes_[node].children, static_cast<uint8_t>(text[i]));
    if (node < 0) break;
    if (nodes_[node].token >= 0) best = {nodes_[node].token, i + 1 - pos};
  }
  return best;
}

size_t AddedTokenMatcher::whitespace_before(std::string_view text, size_t pos) {
  while (pos > 0) {
    size_t start = pos - 1;
    while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80)
      --start;
    size_t end = 0;
    if (!is_unicode_whitespace(decode_utf8(text, start, end))) break;
    pos = start;
  }
  return pos;
}

size_t AddedTokenMatcher::whitespace_after(std::string_view text, size_t pos) {
  while (pos < text.size()) {
    size_t end = 0;
    if (!is_unicode_whitespace(decode_utf8(text, pos, end))) break;
    pos = end;
  }
  return pos;
}

}  // namespace trainctl::tokenize::detail
