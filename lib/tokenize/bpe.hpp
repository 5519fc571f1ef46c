// Internal to lib/tokenize: the BPE model of a byte-level tokenizer.json, over raw bytes.
//
// The file spells tokens in GPT-2's byte-level alphabet (each byte as one printable character,
// ' ' as 'Ġ'); the loader maps them back to bytes once, so encoding never converts text. A word
// (one pre-token) starts as one symbol per byte and merges exactly as HF's Word::merge_all does:
// a min-heap of (rank, position) over adjacent pairs, stale entries skipped, so ties and
// overlapping pairs resolve as in tokenizers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace trainctl::tokenize::detail {

// GPT-2's bytes_to_unicode: the printable character that stands for each byte.
char32_t byte_to_char(uint8_t byte);
// The inverse: the byte a character stands for, or -1 when it is not in the alphabet.
int char_to_byte(char32_t c);

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Reusable buffers for merge_word (one per thread).
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t length;  // 0: merged into its left neighbour
  };
  struct Merge {
    int32_t rank;
    int32_t position;
    int32_t new_id;
  };
  std::vector<Symbol> symbols;
  std::vector<Merge> heap;
};

class BpeModel {
 public:
  // Token bytes -> id, for the tokens whose text is in the byte-level alphabet.
  TokenMap vocab;
  int32_t unk_id = -1;  // -1: bytes without a token are dropped (as HF without unk_token)
  bool fuse_unk = false;
  bool ignore_merges = false;  // a word that is itself a token is emitted whole

  // Called once per merge, in the file's order (a later duplicate overrides, as in HF).
  void add_merge(int32_t left, int32_t right, int32_t rank, int32_t merged);
  // Fills the single-byte table from `vocab`; call after vocab is complete.
  void finish();

  // Appends the ids of one word (its raw bytes).
  void merge_word(std::string_view word, BpeScratch& scratch, std::vector<int32_t>& out) const;

 private:
  struct Entry {
    uint64_t key;  // left << 32 | right; kEmpty marks a free slot
    int32_t rank;
    int32_t merged;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  const Entry* find(int32_t left, int32_t right) const;
  void grow();

  int32_t byte_ids_[256];
  std::vector<Entry> merges_;  // open addressing, power-of-two size
  size_t num_merges_ = 0;
};

}  // namespace trainctl::tokenize::detail
