#include "data/sampler.hpp"

#include <numeric>
#include <utility>

#include <fmt/format.h>

#include "data/mix.hpp"

namespace trainctl::data {

namespace {

constexpr uint64_t kTagShuffle = 0x53485546464c45ULL;  // "SHUFFLE": keeps shuffles apart from data
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
    : source_(source), seq_len_(seq_len), seed_(seed), shuffle_(shuffle), vocab_size_(vocab_size) {
  if (seq_len < 1) {
    throw DataError(
        fmt::format("seq_len {} is not positive; use a sequence length of at least 1", seq_len));
  }
  num_samples_ = (source.size() - 1) / seq_len;
  if (source.size() < 1 || num_samples_ < 1) {
    throw DataError(fmt::format(
        "{} has {} tokens, fewer than one window of seq_len + 1 = {} tokens; use a shorter seq_len "
        "or more data",
        source.describe(), source.size(), int64_t{seq_len} + 1));
  }
  fingerprint_ = fingerprint_source(source, seq_len);
}

const std::vector<int64_t>& Sampler::permutation(int64_t epoch) const {
  if (cached_epoch_ != epoch) {
    cached_permutation_.resize(static_cast<size_t>(num_samples_));
    std::iota(cached_permutation_.begin(), cached_permutation_.end(), int64_t{0});
    // Fisher-Yates from the back. The modulo bias is below num_samples / 2^64: negligible.
    detail::SplitMix64 rng(detail::hash_keys(seed_, kTagShuffle, static_cast<uint64_t>(epoch)));
    for (int64_t i = num_samples_ - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(i + 1));
      std::swap(cached_permutation_[static_cast<size_t>(i)],
                cached_permutation_[static_cast<size_t>(j)]);
    }
    cached_epoch_ = epoch;
  }
  return cached_permutation_;
}

int64_t Sampler::sample_at(int64_t order_index) const {
  if (order_index < 0) {
    throw DataError(fmt::format("sample order index {} is negative", order_index));
  }
  const int64_t index_in_epoch = order_index % num_samples_;
  if (!shuffle_) return index_in_epoch;
  return permutation(order_index / num_samples_)[static_cast<size_t>(index_in_epoch)];
}

void Sampler::read_window(int64_t sample, int32_t* out) const {
  const int64_t length = window_length();
  const int64_t offset = sample * seq_len_;
  source_.read(offset, length, out);
  if (vocab_size_ <= 0) return;
  for (int64_t t = 0; t < length; ++t) {
    if (out[t] < 0 || out[t] >= vocab_size_) {
      throw DataError(fmt::format(
          "token {} at position {} of {} is outside the model vocabulary [0, {}); use a model "
          "vocab of at least {} or data tokenised for this model",
          out[t], offset + t, source_.describe(), vocab_size_, source_.vocab_hint()));
    }
  }
}

void Sampler::fill_batch(int64_t first, int batch, int32_t* out) const {
  check_batch(batch, "batch");
  for (int row = 0; row < batch; ++row) {
    read_window(sample_at(first + row), out + row * window_length());
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
        state.fingerprint, source_.describe(), fingerprint_));
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
