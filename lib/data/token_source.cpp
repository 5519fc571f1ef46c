#include "data/token_source.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <xxhash.h>

namespace trainctl::data {

std::string TokenizerInfo::describe() const {
  return fmt::format("{} ({}, vocab {}, eod {})", path, kind, vocab_size, eod_id);
}

void TokenSource::check_range(int64_t offset, int64_t count) const {
  if (offset < 0 || count < 0 || offset > size() || count > size() - offset) {
    throw DataError(fmt::format("read of tokens [{}, {}) is outside {} which has {} tokens", offset,
                                offset + count, describe(), size()));
  }
}

std::string TokenSource::where(int64_t offset) const {
  return fmt::format("{}, token {}", describe(), offset);
}

uint64_t token_digest(const int32_t* ids, int64_t count, int64_t chunk_index) {
  static_assert(std::endian::native == std::endian::little, "ids are digested as little-endian");
  return XXH3_64bits_withSeed(ids, static_cast<size_t>(count) * sizeof(int32_t),
                              static_cast<uint64_t>(chunk_index));
}

VocabScan scan_vocab(const TokenSource& source, int32_t vocab) {
  return scan_vocab(source, vocab, 0, source.size());
}

VocabScan scan_vocab(const TokenSource& source, int32_t vocab, int64_t begin, int64_t end) {
  VocabScan scan;
  if (source.ids_below_hint() && source.vocab_hint() <= vocab && source.files().empty())
    return scan;
  std::vector<int32_t> chunk(static_cast<size_t>(kDigestChunk));
  const int64_t total = std::min(end, source.size());
  for (int64_t offset = std::max<int64_t>(begin, 0); offset < total;) {
    const int64_t count = std::min<int64_t>(total - offset, static_cast<int64_t>(chunk.size()));
    source.read(offset, count, chunk.data());
    int32_t chunk_max = -1;
    int32_t chunk_min = 0;
    for (int64_t i = 0; i < count; ++i) {
      chunk_max = std::max(chunk_max, chunk[static_cast<size_t>(i)]);
      chunk_min = std::min(chunk_min, chunk[static_cast<size_t>(i)]);
    }
    scan.max_id = std::max(scan.max_id, chunk_max);
    if (scan.first_outside < 0 && (chunk_max >= vocab || chunk_min < 0)) {
      for (int64_t i = 0; i < count; ++i) {
        const int32_t id = chunk[static_cast<size_t>(i)];
        if (id < 0 || id >= vocab) {
          scan.first_outside = offset + i;
          scan.first_outside_id = id;
          break;
        }
      }
    }
    scan.digest += token_digest(chunk.data(), count, offset / kDigestChunk);
    offset += count;
    scan.tokens_read += count;
  }
  return scan;
}

namespace {

class SliceSource final : public TokenSource {
 public:
  SliceSource(std::shared_ptr<const TokenSource> base, int64_t offset, int64_t count)
      : base_(std::move(base)), offset_(offset), count_(count) {}

  int64_t size() const override { return count_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override {
    check_range(offset, count);
    base_->read(offset_ + offset, count, out);
  }
  int32_t vocab_hint() const override { return base_->vocab_hint(); }
  bool ids_below_hint() const override { return base_->ids_below_hint(); }
  const TokenizerInfo* tokenizer() const override { return base_->tokenizer(); }
  std::vector<SourceFile> files() const override { return base_->files(); }
  std::string where(int64_t offset) const override { return base_->where(offset_ + offset); }
  std::string describe() const override {
    return fmt::format("{} tokens [{}, {})", base_->describe(), offset_, offset_ + count_);
  }

 private:
  std::shared_ptr<const TokenSource> base_;
  int64_t offset_;
  int64_t count_;
};

}  // namespace

std::shared_ptr<const TokenSource> slice_source(std::shared_ptr<const TokenSource> base,
                                                int64_t offset, int64_t count) {
  if (base == nullptr) throw DataError("slice_source: no base source given");
  if (offset < 0 || count < 0 || offset > base->size() || count > base->size() - offset) {
    throw DataError(fmt::format("slice [{}, {}) does not fit inside {} which has {} tokens", offset,
                                offset + count, base->describe(), base->size()));
  }
  return std::make_shared<SliceSource>(std::move(base), offset, count);
}

HoldoutSplit split_holdout(std::shared_ptr<const TokenSource> source, double val_fraction) {
  if (source == nullptr) throw DataError("split_holdout: no source given");
  if (!(val_fraction > 0.0 && val_fraction < 1.0)) {
    throw DataError(fmt::format(
        "validation fraction {} is not in (0, 1); hold out e.g. 0.05 (5%) of the tokens",
        val_fraction));
  }
  const int64_t total = source->size();
  const auto num_val =
      static_cast<int64_t>(std::llround(static_cast<double>(total) * val_fraction));
  if (num_val < 1 || num_val >= total) {
    throw DataError(fmt::format(
        "holding out {} of {} ({} tokens) leaves {} validation and {} training tokens; both must "
        "be non-empty: use more data or another validation fraction",
        val_fraction, source->describe(), total, num_val, total - num_val));
  }
  HoldoutSplit split;
  split.train = slice_source(source, 0, total - num_val);
  split.val = slice_source(source, total - num_val, num_val);
  return split;
}

}  // namespace trainctl::data
