// The deterministic, resumable global sampler over fixed-length windows of a TokenSource, and the
// fixed sequence of validation windows.
//
// Samples: sample s is the window of seq_len + 1 tokens starting at token s * seq_len (inputs are
// its first seq_len tokens, targets its last seq_len), so windows do not overlap except for the one
// token they share; num_samples = (size - 1) / seq_len; a tail shorter than a window is never read.
//
// Global order: the samples are visited epoch after epoch; with shuffle, epoch e visits them in a
// Fisher-Yates permutation driven by splitmix64 keyed by (seed, e), otherwise in index order.
// The position is the number of samples consumed globally (by all data-parallel ranks together).
// Order index p therefore maps to epoch p / num_samples and to sample permutation_e[p %
// num_samples], whatever the batch size, world size or resume history: a run that resumes from
// state() sees exactly the samples it would have seen without stopping.
//
// Blends: a sampler may read several sources (SamplerPart), each with a weight. Each part has its
// own samples and epochs as above (its shuffle keyed by its place in the blend), and order index p
// goes to the part whose share lags most: the part d maximising w_d * (p + 1) - taken_d (ties to
// the first), the rule of Megatron's BlendedDataset. After any n samples every part has taken
// within one sample of n * w_d (weights normalised to sum to 1), and order index p still maps to
// the same (part, sample) whatever the batch size, world size or resume history.
//
// Batches are written as batch rows of seq_len + 1 int32 tokens: out[row * (seq_len + 1) + t].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/token_source.hpp"

namespace trainctl::data {

// What a checkpoint must keep to resume the sampler; plain fields, serialised by the caller.
struct SamplerState {
  int64_t position = 0;      // samples consumed globally
  int64_t epoch = 0;         // position / num_samples at save time (informational)
  uint64_t seed = 0;         // shuffle seed
  int32_t seq_len = 0;       // window length minus one
  bool shuffle = true;       // whether epochs are permuted
  uint64_t fingerprint = 0;  // of the source and seq_len; restore() refuses other data
};

// One source of a blend and its weight (> 0; the weights need not sum to 1).
struct SamplerPart {
  const TokenSource* source = nullptr;
  double weight = 1.0;
};

class Sampler {
 public:
  // Reads windows of `source`, which must outlive the sampler. When vocab_size > 0 every token
  // read is checked to be in [0, vocab_size) (an out-of-range id from disk would index past the
  // embedding table). Throws DataError when seq_len < 1 or the source is shorter than one window.
  Sampler(const TokenSource& source, int seq_len, uint64_t seed, bool shuffle,
          int32_t vocab_size = 0);
  // A blend of parts (one part reads exactly as the constructor above). Throws DataError for no
  // parts, a weight that is not a positive finite number, or a part shorter than one window.
  Sampler(std::vector<SamplerPart> parts, int seq_len, uint64_t seed, bool shuffle,
          int32_t vocab_size = 0);

  int seq_len() const { return seq_len_; }
  int64_t window_length() const { return int64_t{seq_len_} + 1; }
  // Windows of the source; of a blend, the sum of its parts' (its "epoch" for epoch()).
  int64_t num_samples() const { return num_samples_; }
  int64_t position() const { return position_; }
  int64_t epoch() const { return position_ / num_samples_; }
  uint64_t fingerprint() const { return fingerprint_; }
  int num_parts() const { return static_cast<int>(parts_.size()); }

  // Where global order index `order_index` (>= 0) reads: the part and the sample in it.
  // Stateless in meaning; caches the blend's position to make forward walks cheap.
  struct Sample {
    int part = 0;
    int64_t index = 0;
  };
  Sample locate(int64_t order_index) const;
  // The sample index (within its part) at global order index `order_index`.
  int64_t sample_at(int64_t order_index) const { return locate(order_index).index; }

  // Writes the windows of order indices [first, first + batch) to out (batch * window_length()
  // tokens). Stateless: does not move the position. Not thread-safe (it caches the permutation of
  // the last epoch it touched).
  void fill_batch(int64_t first, int batch, int32_t* out) const;

  // Takes the next `batch` samples of the global order and advances the position by batch.
  void next_batch(int batch, int32_t* out);

  // Data parallel: of the next `global_batch` samples, rank `rank` of `num_ranks` takes
  // [position + rank * b, position + (rank + 1) * b) with b = global_batch / num_ranks, written to
  // out (b windows); the position advances by global_batch, as on every rank. global_batch must be
  // a multiple of num_ranks.
  void next_batch_slice(int global_batch, int rank, int num_ranks, int32_t* out);
  // Passes over the next `samples` samples without reading them (a batch the run skips).
  void skip(int64_t samples) { position_ += samples; }

  SamplerState state() const;

  // Continues from a saved state. Refuses (DataError, sampler unchanged) a state saved with another
  // seq_len, seed, shuffle setting or other data (fingerprint), or a negative position.
  void restore(const SamplerState& state);

 private:
  struct Part {
    const TokenSource* source;
    double weight;  // normalised: the parts' weights sum to 1
    int64_t num_samples;
    uint64_t shuffle_seed;
    mutable int64_t cached_epoch = -1;
    mutable std::vector<int64_t> cached_permutation;
  };
  static constexpr int64_t kBlendSnapshotEvery = 4096;

  const std::vector<int64_t>& permutation(const Part& part, int64_t epoch) const;
  int blend_part_at(int64_t order_index, int64_t& index_in_part) const;
  void read_window(const Part& part, int64_t sample, int32_t* out) const;
  std::string describe() const;

  std::vector<Part> parts_;
  int seq_len_;
  uint64_t seed_;
  bool shuffle_;
  int32_t vocab_size_;
  int64_t num_samples_ = 0;
  uint64_t fingerprint_ = 0;
  int64_t position_ = 0;
  // The blend's walk: taken_[d] samples of part d in order indices [0, cursor_), and taken_ at
  // every multiple of kBlendSnapshotEvery walked so far (a backward jump restarts from one).
  mutable int64_t cursor_ = 0;
  mutable std::vector<int64_t> taken_;
  mutable std::vector<std::vector<int64_t>> snapshots_;
};

// The fingerprint Sampler uses: a hash of the source's size, vocab_hint, 64 evenly spaced tokens
// and seq_len. Cheap to compute, and different for data that differs in length or content.
uint64_t fingerprint_source(const TokenSource& source, int seq_len);

// Validation windows: the samples of `source` in index order, never shuffled, so every evaluation
// sees the same batches. Batch k holds samples [k * batch, (k + 1) * batch); only full batches.
class ValidationSet {
 public:
  // `source` must outlive this object; vocab_size as for Sampler.
  ValidationSet(const TokenSource& source, int seq_len, int32_t vocab_size = 0);
  // A blend's validation windows: the parts' windows in index order, interleaved by weight.
  ValidationSet(std::vector<SamplerPart> parts, int seq_len, int32_t vocab_size = 0);

  int64_t num_samples() const { return sampler_.num_samples(); }
  int64_t window_length() const { return sampler_.window_length(); }

  // Full batches of `batch` samples available (0 when the source is smaller than one batch).
  int64_t num_batches(int batch) const;

  // Writes batch `batch_index` (< num_batches(global_batch)); with num_ranks > 1 only this rank's
  // slice of global_batch / num_ranks windows, as Sampler::next_batch_slice.
  void fill_batch(int64_t batch_index, int global_batch, int32_t* out, int rank = 0,
                  int num_ranks = 1) const;

 private:
  Sampler sampler_;
};

}  // namespace trainctl::data
