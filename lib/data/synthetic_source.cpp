#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "data/mix.hpp"
#include "data/sources.hpp"

namespace trainctl::data {

namespace {
// Stream tags keep the hashes of the table, the choices and the block starts independent.
constexpr uint64_t kTagOffset = 1;
constexpr uint64_t kTagStride = 2;
constexpr uint64_t kTagChoice = 3;
constexpr uint64_t kTagBlockStart = 4;
}  // namespace

SyntheticSource::SyntheticSource(uint64_t seed, int32_t vocab, int64_t num_tokens,
                                 int32_t branching)
    : seed_(seed), vocab_(vocab), num_tokens_(num_tokens), branching_(branching) {
  if (vocab < 2) {
    throw DataError(
        fmt::format("synthetic data: vocab {} is too small; use a vocab of at least 2", vocab));
  }
  if (branching < 1 || branching > vocab) {
    throw DataError(fmt::format("synthetic data: branching {} is not in [1, vocab {}]; use e.g. {}",
                                branching, vocab,
                                kDefaultBranching <= vocab ? kDefaultBranching : vocab));
  }
  if (num_tokens < 1) {
    throw DataError(fmt::format(
        "synthetic data: {} tokens requested; ask for at least one (e.g. 1000000)", num_tokens));
  }
}

int32_t SyntheticSource::successor(int32_t token, int32_t k) const {
  // Successors are offset + k * stride (mod vocab) with 1 <= stride <= vocab / branching, so the
  // branching successors of a token are distinct: (k1 - k2) * stride is never a multiple of vocab.
  const auto vocab = static_cast<uint64_t>(vocab_);
  const uint64_t max_stride = std::max<uint64_t>(1, vocab / static_cast<uint64_t>(branching_));
  const uint64_t offset =
      detail::hash_keys(seed_, kTagOffset, static_cast<uint64_t>(token)) % vocab;
  const uint64_t stride =
      1 + detail::hash_keys(seed_, kTagStride, static_cast<uint64_t>(token)) % max_stride;
  return static_cast<int32_t>((offset + static_cast<uint64_t>(k) * stride) % vocab);
}

int32_t SyntheticSource::block_start_token(int64_t block) const {
  return static_cast<int32_t>(
      detail::hash_keys(seed_, kTagBlockStart, static_cast<uint64_t>(block)) %
      static_cast<uint64_t>(vocab_));
}

int32_t SyntheticSource::next_token(int32_t previous, int64_t position) const {
  const uint64_t choice = detail::hash_keys(seed_, kTagChoice, static_cast<uint64_t>(position)) %
                          static_cast<uint64_t>(branching_);
  return successor(previous, static_cast<int32_t>(choice));
}

void SyntheticSource::read(int64_t offset, int64_t count, int32_t* out) const {
  check_range(offset, count);
  if (count == 0) return;
  // Replay the chain from the start of the block holding `offset` (at most kBlockLength - 1 extra
  // steps), so any window can be read without state.
  int64_t position = (offset / kBlockLength) * kBlockLength;
  int32_t token = 0;
  const int64_t end = offset + count;
  for (; position < end; ++position) {
    token = position % kBlockLength == 0 ? block_start_token(position / kBlockLength)
                                         : next_token(token, position);
    if (position >= offset) out[position - offset] = token;
  }
}

double SyntheticSource::entropy_nats_per_token() const {
  const auto length = static_cast<double>(kBlockLength);
  return ((length - 1.0) * std::log(static_cast<double>(branching_)) +
          std::log(static_cast<double>(vocab_))) /
         length;
}

std::string SyntheticSource::describe() const {
  return fmt::format("synthetic (seed {}, vocab {}, {} tokens, branching {})", seed_, vocab_,
                     num_tokens_, branching_);
}

}  // namespace trainctl::data
