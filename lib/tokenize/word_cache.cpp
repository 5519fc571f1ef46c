// The per-thread BPE word cache (word_cache.hpp).
#include "tokenize/word_cache.hpp"

#include <cstring>

namespace trainctl::tokenize::detail {

WordCache::WordCache(size_t num_slots) : slots_(num_slots, Slot{0, 0, 0, 0, 0}) {}

bool WordCache::find(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const {
  const size_t mask = slots_.size() - 1;
  for (size_t slot = hash & mask;; slot = (slot + 1) & mask) {
    const Slot& entry = slots_[slot];
    if (entry.key_length == 0) return false;
    if (entry.hash == hash && entry.key_length == word.size() &&
        std::memcmp(keys_.data() + entry.key_offset, word.data(), word.size()) == 0) {
      out.insert(out.end(), ids_.begin() + entry.ids_offset,
                 ids_.begin() + entry.ids_offset + entry.ids_count);
      return true;
    }
  }
}

void WordCache::clear() {
  std::memset(slots_.data(), 0, slots_.size() * sizeof(Slot));
  keys_.clear();
  ids_.clear();
  size_ = 0;
}

void WordCache::insert(std::string_view word, uint64_t hash, const int32_t* ids, size_t count) {
  if (word.empty() || word.size() > kMaxWordBytes) return;
  // At half full (or arenas of 16 MiB) start over: lookups stay short, memory stays bounded.
  if ((size_ + 1) * 2 > slots_.size() || keys_.size() + word.size() > (size_t{16} << 20)) clear();
  const size_t mask = slots_.size() - 1;
  size_t slot = hash & mask;
  while (slots_[slot].key_length != 0)
    slot = (slot + 1) & mask;
  slots_[slot] = Slot{hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(word.size()),
                      static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(count)};
  keys_.append(word);
  ids_.insert(ids_.end(), ids, ids + count);
  ++size_;
}

}  // namespace trainctl::tokenize::detail
