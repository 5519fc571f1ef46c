// Internal to lib/tokenize: one thread's cache of word -> ids for BPE (HF keeps one too).
//
// Natural text repeats its words, so most pre-tokens are found here and never merged. Open
// addressing over two arenas (key bytes, ids): a lookup allocates nothing, and a full cache is
// cleared in one step instead of evicting entry by entry.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trainctl::tokenize::detail {

class WordCache {
 public:
  // Words longer than this are merged every time (they are rare, and would crowd the arena).
  static constexpr size_t kMaxWordBytes = 256;

  explicit WordCache(size_t num_slots = size_t{1} << 16);

  // Appends the cached ids of `word` to `out` and returns true, or returns false.
  bool find(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const;
  // Remembers ids[0, count) for `word` (absent from the cache; see find).
  void insert(std::string_view word, uint64_t hash, const int32_t* ids, size_t count);

  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t hash;
    uint32_t key_offset;
    uint32_t key_length;  // 0: free (words are never empty)
    uint32_t ids_offset;
    uint32_t ids_count;
  };
  void clear();

  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t size_ = 0;
};

}  // namespace trainctl::tokenize::detail
