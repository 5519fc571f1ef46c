// Gradient synchronisation of one rank after its micro-batches, and the global gradient norm.
//
// Which group sums what (Mesh): non-expert gradients over dp_ep (every rank holding other data),
// expert gradients (ParamSpec::expert) over dp only (each ep rank holds other experts). With tied
// embeddings on pp > 1 stages the first and last stage add each other's embed.wte gradient.
// ZeRO-1 replaces the dp all-reduce by a reduce-scatter into this rank's optimizer part and an
// all-gather of the updated values.
//
// Buckets: the all-reduce runs over consecutive ranges of the contiguous gradient buffer of about
// bucket_bytes each, so a GPU backend can launch each bucket as soon as backward has produced it
// (overlap). On CPU the Gloo calls block, so the buckets run one after the other after backward;
// the structure is kept for that later overlap and to bound the size of one collective.
//
// Communication passes the buffers' raw pointers: host memory on the CPU backend (Gloo); a CUDA
// backend pairs with an NCCL communicator, which takes device pointers.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "dist/mesh.hpp"
#include "model/model.hpp"

namespace trainctl::train {

// [begin, end) of the flat gradient buffer, all of one kind (expert or not).
struct GradBucket {
  int64_t begin = 0;
  int64_t end = 0;
  bool expert = false;
  bool operator==(const GradBucket&) const = default;
};

// Consecutive parameters (in buffer order) of the same kind grouped until a bucket reaches
// `bucket_bytes` (a single parameter larger than that is a bucket of its own). Covers the whole
// buffer.
std::vector<GradBucket> plan_grad_buckets(const model::ParamTable& table, int64_t bucket_bytes,
                                          size_t element_bytes);

// Which copy of each gradient element this rank counts in the global norm, so the whole job
// counts every parameter element exactly once.
struct NormOwnership {
  int tp_rank = 0, ep_rank = 0, dp_rank = 0;
  // ZeRO-1: each dp rank counts its own part [zero_begin, zero_end) of the reduced gradient;
  // without ZeRO only dp rank 0 counts.
  bool zero = false;
  int64_t zero_begin = 0, zero_end = 0;
};

// The ranges of the flat buffer this rank counts (merged where adjacent): tied copies never,
// replicated (not tp_sharded) parameters only on tp rank 0, non-expert ones only on ep rank 0.
std::vector<model::IndexRange> norm_ranges(const model::ParamTable& table,
                                           const NormOwnership& owner);

class GradSync {
 public:
  // `model` must be built with this rank's ModelParallel; zero: ZeRO-1 (ep must be 1).
  GradSync(const dist::Mesh& mesh, backend::Backend& backend, model::Transformer& model,
           int64_t bucket_bytes, bool zero);

  // Sums the gradients over the data-parallel groups (and the tied embedding over the first and
  // last stage). With ZeRO only this rank's optimizer part of grads() holds the sum afterwards.
  void reduce_gradients();
  // Sum of squares of every gradient element of the job, counted once; identical on every rank
  // (all-reduced over the world). Not finite when any gradient is not.
  double global_sum_squares();
  // ZeRO-1, after the optimizer updated this rank's part of values(): every dp rank gets all parts.
  void gather_parameters();

  const std::vector<GradBucket>& buckets() const { return buckets_; }

 private:
  void exchange_tied_embedding();

  const dist::Mesh& mesh_;
  backend::Backend& be_;
  model::Transformer& model_;
  bool zero_;
  std::vector<GradBucket> buckets_;
  std::vector<model::IndexRange> counted_;
  std::vector<int64_t> zero_bounds_;  // zero_partition over dp
  backend::Allocation scratch_;       // ZeRO's reduced part, the tied embedding's peer gradient
};

}  // namespace trainctl::train
