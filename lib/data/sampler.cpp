#include "data/sampler.hpp"

#include <bit>
#include <cmath>
#include <numeric>
#include <utility>

#include <fmt/format.h>

#include "data/mix.hpp"

namespace trainctl::data {

namespace {

constexpr uint64_t kTagShuffle = 0x53485546464c45ULL;  // "SHUFFLE": keeps shuffles apart from data
constexpr uint64_t kTagBlend = 0x424c454e44ULL;        // "BLEND": a blend's parts and fingerprint
constexpr int kFingerprintTokens = 64;

void check_batch(int batch, const char* what) {
  if (batch < 1) {
    throw DataError(fmt::format("{} {} is not positive; use a batch of at least 1", what, batch));
  }
}

// Validates a data-parallel slice request and returns the per-rank batch.
int rank_batch(int global_batch, int rank, int num_ranks) {
  check_batch(global_batch, "global batch");
  if (num_ranks < 1 || rank < 0 || rank >= num_ranks) {
    throw DataError(fmt::format("rank {} is not in [0, num_ranks {})", rank, num_ranks));
  }
  if (global_batch % num_ranks != 0) {
    throw DataError(fmt::format(
        "global batch {} is not a multiple of the {} data-parallel ranks; use a global batch of {} "
        "or {}",
        global_batch, num_ranks, global_batch / num_ranks * num_ranks,
        (global_batch / num_ranks + 1) * num_ranks));
  }
  return global_batch / num_ranks;
}

}  // namespace

uint64_t fingerprint_source(const TokenSource& source, int seq_len) {
  const int64_t size = source.size();
  uint64_t hash =
      detail::hash_keys(static_cast<uint64_t>(size), static_cast<uint64_t>(source.vocab_hint()),
                        static_cast<uint64_t>(seq_len));
  for (int k = 0; k < kFingerprintTokens && size > 0; ++k) {
    const int64_t offset = size == 1 ? 0 : (size - 1) * k / (kFingerprintTokens - 1);
    int32_t token = 0;
    source.read(offset, 1, &token);
    hash = detail::hash_keys(hash, static_cast<uint64_t>(offset), static_cast<uint64_t>(token));
  }
  return hash;
}

Sampler::Sampler(const TokenSource& source, int seq_len, uint64_t seed, bool shuffle,
                 int32_t vocab_size)
    : Sampler(std::vector<SamplerPart>{{&source, 1.0}}, seq_len, seed, shuffle, vocab_size) {}

Sampler::Sampler(std::vector<SamplerPart> parts, int seq_len, uint64_t seed, bool shuffle,
                 int32_t vocab_size)
    : seq_len_(seq_len), seed_(seed), shuffle_(shuffle), vocab_size_(vocab_size) {
  if (seq_len < 1) {
    throw DataError(
        fmt::format("seq_len {} is not positive; use a sequence length of at least 1", seq_len));
  }
  if (parts.empty()) throw DataError("a data blend needs at least one dataset");
  double total_weight = 0;
  for (const SamplerPart& part : parts) {
    if (!(part.weight > 0) || !std::isfinite(part.weight))
      throw DataError(
          fmt::format("{}: blend weight {} is not a positive number; give every "
                      "dataset of the blend a weight > 0",
                      part.source->describe(), part.weight));
    total_weight += part.weight;
  }
  const bool blend = parts.size() > 1;
  // One source keeps the fingerprint and shuffle of a sampler that never knew blends, so runs
  // saved before them resume.
  uint64_t fingerprint = detail::hash_keys(kTagBlend, parts.size(), static_cast<uint64_t>(seq_len));
  for (size_t d = 0; d < parts.size(); ++d) {
    const TokenSource& source = *parts[d].source;
    const int64_t windows = (source.size() - 1) / seq_len;
    if (source.size() < 1 || windows < 1) {
      throw DataError(fmt::format(
          "{} has {} tokens, fewer than one window of seq_len + 1 = {} tokens; use a shorter "
          "seq_len or more data",
          source.describe(), source.size(), int64_t{seq_len} + 1));
    }
    const uint64_t part_fingerprint = fingerprint_source(source, seq_len);
    const double weight = parts[d].weight / total_weight;
    fingerprint = detail::hash_keys(fingerprint, part_fingerprint, std::bit_cast<uint64_t>(weight));
    parts_.push_back(Part{
        &source, weight, windows, blend ? detail::hash_keys(seed, kTagBlend, d) : seed, -1, {}});
    num_samples_ += windows;
  }
  fingerprint_ = blend ? fingerprint : fingerprint_source(*parts_[0].source, seq_len);
  taken_.assign(parts_.size(), 0);
}

const std::vector<int64_t>& Sampler::permutation(const Part& part, int64_t epoch) const {
  if (part.cached_epoch != epoch) {
    std::vector<int64_t>& order = part.cached_permutation;
    order.resize(static_cast<size_t>(part.num_samples));
    std::iota(order.begin(), order.end(), int64_t{0});
    // Fisher-Yates from the back. The modulo bias is below num_samples / 2^64: negligible.
    detail::SplitMix64 rng(
        detail::hash_keys(part.shuffle_seed, kTagShuffle, static_cast<uint64_t>(epoch)));
    for (int64_t i = part.num_samples - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(i + 1));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
    part.cached_epoch = epoch;
  }
  return part.cached_permutation;
}

int Sampler::blend_part_at(int64_t order_index, int64_t& index_in_part) const {
  if (order_index < cursor_) {
    // Back to the last snapshot at or before order_index (snapshot k is at k * every).
    const int64_t k = order_index / kBlendSnapshotEvery;
    taken_ = snapshots_[static_cast<size_t>(k)];
    cursor_ = k * kBlendSnapshotEvery;
  }
  const auto num_parts = static_cast<int>(parts_.size());
  for (;; ++cursor_) {
    if (cursor_ % kBlendSnapshotEvery == 0 &&
        static_cast<int64_t>(snapshots_.size()) == cursor_ / kBlendSnapshotEvery)
      snapshots_.push_back(taken_);
    // The part whose count lags its share of cursor_ + 1 samples most.
    const auto wanted = static_cast<double>(cursor_ + 1);
    int best = 0;
    double best_lag = parts_[0].weight * wanted - static_cast<double>(taken_[0]);
    for (int d = 1; d < num_parts; ++d) {
      const double lag = parts_[static_cast<size_t>(d)].weight * wanted -
                         static_cast<double>(taken_[static_cast<size_t>(d)]);
      if (lag > best_lag) {
        best = d;
        best_lag = lag;
      }
    }
    const int64_t taken = taken_[static_cast<size_t>(best)]++;
    if (cursor_ == order_index) {
      ++cursor_;
      index_in_part = taken;
      return best;
    }
  }
}

Sampler::Sample Sampler::locate(int64_t order_index) const {
  if (order_index < 0) {
    throw DataError(fmt::format("sample order index {} is negative", order_index));
  }
  Sample sample;
  int64_t k = order_index;
  if (parts_.size() > 1) sample.part = blend_part_at(order_index, k);
  const Part& part = parts_[static_cast<size_t>(sample.part)];
  const int64_t index_in_epoch = k % part.num_samples;
  sample.index = shuffle_
                     ? permutation(part, k / part.num_samples)[static_cast<size_t>(index_in_epoch)]
                     : index_in_epoch;
  return sample;
}

std::string Sampler::describe() const {
  if (parts_.size() == 1) return parts_[0].source->describe();
  return fmt::format("a blend of {} datasets ({} .. {})", parts_.size(),
                     parts_.front().source->describe(), parts_.back().source->describe());
}

void Sampler::read_window(const Part& part, int64_t sample, int32_t* out) const {
  const TokenSource& source = *part.source;
  const int64_t length = window_length();
  const int64_t offset = sample * seq_len_;
  source.read(offset, length, out);
  if (vocab_size_ <= 0) return;
  for (int64_t t = 0; t < length; ++t) {
    if (out[t] < 0 || out[t] >= vocab_size_) {
      throw DataError(fmt::format(
          "token {} at position {} of {} is outside the model vocabulary [0, {}); use a model "
          "vocab of at least {} or data tokenised for this model",
          out[t], offset + t, source.describe(), vocab_size_, source.vocab_hint()));
    }
  }
}

void Sampler::fill_batch(int64_t first, int batch, int32_t* out) const {
  check_batch(batch, "batch");
  for (int row = 0; row < batch; ++row) {
    const Sample sample = locate(first + row);
    read_window(parts_[static_cast<size_t>(sample.part)], sample.index,
                out + row * window_length());
  }
}

void Sampler::next_batch(int batch, int32_t* out) {
  fill_batch(position_, batch, out);
  position_ += batch;
}

void Sampler::next_batch_slice(int global_batch, int rank, int num_ranks, int32_t* out) {
  const int batch = rank_batch(global_batch, rank, num_ranks);
  fill_batch(position_ + int64_t{rank} * batch, batch, out);
  position_ += global_batch;
}

SamplerState Sampler::state() const {
  SamplerState state;
  state.position = position_;
  state.epoch = epoch();
  state.seed = seed_;
  state.seq_len = seq_len_;
  state.shuffle = shuffle_;
  state.fingerprint = fingerprint_;
  return state;
}

void Sampler::restore(const SamplerState& state) {
  if (state.seq_len != seq_len_) {
    throw DataError(fmt::format(
        "cannot resume the data sampler: the checkpoint was made with seq_len {} but this run has "
        "seq_len {}; resume with seq_len {} or start a new run",
        state.seq_len, seq_len_, state.seq_len));
  }
  if (state.fingerprint != fingerprint_) {
    throw DataError(fmt::format(
        "cannot resume the data sampler: the checkpoint was made on other data (fingerprint "
        "{:016x}, this run's {} has {:016x}); resume with the data the checkpoint was trained on "
        "or start a new run",
        state.fingerprint, describe(), fingerprint_));
  }
  if (state.seed != seed_) {
    throw DataError(fmt::format(
        "cannot resume the data sampler: the checkpoint was made with data seed {} but this run "
        "has seed {}; set the seed back to {} to resume",
        state.seed, seed_, state.seed));
  }
  if (state.shuffle != shuffle_) {
    throw DataError(fmt::format(
        "cannot resume the data sampler: the checkpoint was made with shuffle {} but this run has "
        "shuffle {}; set shuffle back to {} to resume",
        state.shuffle, shuffle_, state.shuffle));
  }
  if (state.position < 0) {
    throw DataError(fmt::format(
        "cannot resume the data sampler: the saved position {} is negative; the checkpoint's "
        "training state is corrupt",
        state.position));
  }
  position_ = state.position;
}

ValidationSet::ValidationSet(const TokenSource& source, int seq_len, int32_t vocab_size)
    : sampler_(source, seq_len, /*seed=*/0, /*shuffle=*/false, vocab_size) {}

ValidationSet::ValidationSet(std::vector<SamplerPart> parts, int seq_len, int32_t vocab_size)
    : sampler_(std::move(parts), seq_len, /*seed=*/0, /*shuffle=*/false, vocab_size) {}

int64_t ValidationSet::num_batches(int batch) const {
  check_batch(batch, "validation batch");
  return sampler_.num_samples() / batch;
}

void ValidationSet::fill_batch(int64_t batch_index, int global_batch, int32_t* out, int rank,
                               int num_ranks) const {
  const int batch = rank_batch(global_batch, rank, num_ranks);
  const int64_t available = num_batches(global_batch);
  if (batch_index < 0 || batch_index >= available) {
    throw DataError(fmt::format(
        "validation batch {} does not exist: the validation data holds {} full batches of {} "
        "windows; evaluate fewer batches or hold out more validation data",
        batch_index, available, global_batch));
  }
  sampler_.fill_batch(batch_index * global_batch + int64_t{rank} * batch, batch, out);
}

}  // namespace trainctl::data
