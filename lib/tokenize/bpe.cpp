// Byte-level BPE merges (bpe.hpp).
#include "tokenize/bpe.hpp"

#include <algorithm>
#include <array>

namespace trainctl::tokenize::detail {
namespace {

struct Alphabet {
  std::array<char32_t, 256> to_char{};
  Alphabet() {
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_char[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
    }
  }
};
const Alphabet kAlphabet;

size_t slot_of(uint64_t key, size_t mask) {
  return static_cast<size_t>((key * 0x9E3779B97F4A7C15ULL) >> 20) & mask;
}

// HF's Merge ordering as a min-heap: lower rank first, then the leftmost position.
bool heap_after(const BpeScratch::Merge& a, const BpeScratch::Merge& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.position > b.position;
}

}  // namespace

char32_t byte_to_char(uint8_t byte) {
  return kAlphabet.to_char[byte];
}

int char_to_byte(char32_t c) {
  if (c < 256) {
    if (kAlphabet.to_char[c] == c) return static_cast<int>(c);
    return -1;
  }
  if (c >= 256 + 68) return -1;  // 68 bytes are not printable and map to 256..323
  for (int b = 0; b < 256; ++b)
    if (kAlphabet.to_char[b] == c) return b;
  return -1;
}

void BpeModel::grow() {
  std::vector<Entry> old = std::move(merges_);
  merges_.assign(std::max<size_t>(1024, old.size() * 2), Entry{kEmpty, 0, 0});
  const size_t mask = merges_.size() - 1;
  for (const Entry& entry : old) {
    if (entry.key == kEmpty) continue;
    size_t slot = slot_of(entry.key, mask);
    while (merges_[slot].key != kEmpty)
      slot = (slot + 1) & mask;
    merges_[slot] = entry;
  }
}

void BpeModel::add_merge(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  if ((num_merges_ + 1) * 2 > merges_.size()) grow();
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  const size_t mask = merges_.size() - 1;
  size_t slot = slot_of(key, mask);
  while (merges_[slot].key != kEmpty && merges_[slot].key != key)
    slot = (slot + 1) & mask;
  if (merges_[slot].key == kEmpty) ++num_merges_;
  merges_[slot] = Entry{key, rank, merged};
}

const BpeModel::Entry* BpeModel::find(int32_t left, int32_t right) const {
  if (merges_.empty()) return nullptr;
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  const size_t mask = merges_.size() - 1;
  for (size_t slot = slot_of(key, mask);; slot = (slot + 1) & mask) {
    if (merges_[slot].key == key) return &merges_[slot];
    if (merges_[slot].key == kEmpty) return nullptr;
  }
}

void BpeModel::finish() {
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab.find(std::string(1, static_cast<char>(b)));
    byte_ids_[b] = it == vocab.end() ? -1 : it->second;
  }
}

void BpeModel::merge_word(std::string_view word, BpeScratch& scratch,
                          std::vector<int32_t>& out) const {
  auto& symbols = scratch.symbols;
  auto& heap = scratch.heap;
  symbols.clear();
  heap.clear();
  // One symbol per byte; a byte without a token becomes unk (fused when asked) or is dropped, and
  // then its neighbours are adjacent, as in HF.
  bool previous_unk = false;
  for (const char c : word) {
    int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    const bool unknown = id < 0;
    if (unknown) {
      if (unk_id < 0) continue;
      if (fuse_unk && previous_unk) {
        ++symbols.back().length;
        continue;
      }
      id = unk_id;
    }
    previous_unk = unknown;
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  const auto count = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i + 1 < count; ++i)
    if (const Entry* merge = find(symbols[i].id, symbols[i + 1].id))
      heap.push_back({merge->rank, i, merge->merged});
  std::make_heap(heap.begin(), heap.end(), heap_after);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), heap_after);
    const BpeScratch::Merge top = heap.back();
    heap.pop_back();
    BpeScratch::Symbol& current = symbols[top.position];
    if (current.length == 0 || current.next < 0) continue;
    const BpeScratch::Symbol right = symbols[current.next];
    const Entry* still = find(current.id, right.id);
    if (still == nullptr || still->merged != top.new_id) continue;  // a stale entry
    current.id = top.new_id;
    current.length += right.length;
    symbols[current.next].length = 0;
    current.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.position;
    if (current.prev >= 0)
      if (const Entry* merge = find(symbols[current.prev].id, current.id)) {
        heap.push_back({merge->rank, current.prev, merge->merged});
        std::push_heap(heap.begin(), heap.end(), heap_after);
      }
    if (current.next >= 0)
      if (const Entry* merge = find(current.id, symbols[current.next].id)) {
        heap.push_back({merge->rank, top.position, merge->merged});
        std::push_heap(heap.begin(), heap.end(), heap_after);
      }
  }
  for (const BpeScratch::Symbol& symbol : symbols)
    if (symbol.length != 0) out.push_back(symbol.id);
}

}  // namespace trainctl::tokenize::detail
