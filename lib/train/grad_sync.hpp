// Gradient synchronisation of one rank after its micro-batches, and the global gradient norm.
//
// Which group sums what (Mesh): non-expert gradients over dp_ep (every rank holding other data),
// expert gradients (ParamSpec::expert) over dp only (each ep rank holds other experts). With tied
// embeddings on pp > 1 stages the first and last stage add each other's embed.wte gradient.
// ZeRO-1 replaces the dp all-reduce by a reduce-scatter into this rank's optimizer part and an
// all-gather of the updated values. With ep > 1 the parts are cut over dp as always (each ep
// rank's table holds its own experts, in the same shape): every element is reduce-scattered over
// dp, then the part's non-expert elements are all-reduced over ep (together: over dp_ep). The
// non-expert optimizer state is the same on the ep ranks of a dp rank (replicated over ep, as
// the values are), the expert state is each ep rank's own.
//
// Buckets: the all-reduce runs over consecutive ranges of the contiguous gradient buffer of about
// bucket_bytes each. Backward runs last layer first, so buckets complete from the end of the
// buffer towards its start.
//
// Overlap (constructed with overlap on): the trainer arms the sync before the step's last
// backward on this stage and forwards the model's grads-ready reports (Transformer::
// set_grads_ready_hook); each bucket's reduction starts on a BackgroundReducer (the Mesh's dp_bg
// or dp_ep_bg, a second context of the same members) as soon as all of it was reported, in
// completion order, which is the same on every rank of the group. reduce_gradients() then starts
// the buckets not started yet and waits for all. The sums are those of the blocking path (same
// buckets, same Gloo algorithm): bit-identical results. Buckets holding the tied embedding (pp > 1)
// wait for the stage exchange after backward.
// ZeRO-1 overlaps too: each bucket is reduce-scattered on its own (reduce_scatter_sum_v, each dp
// rank receiving the bucket's elements inside its part, into a buffer of its part) and the part is
// copied into grads() after the waits. Gloo's reduce-scatter adds each element's terms in rank
// order however the buffer is cut, so this equals the blocking path's one reduce-scatter of the
// whole buffer bit for bit. After the optimizer, gather_parameters() starts an all_gather_v per
// bucket of the updated values and returns: the next forward waits for each bucket just before
// reading it (params_needed, from the model's params-needed hook), so the gather overlaps the
// forward of the layers before. Whatever else reads values() calls finish_gather() first, and
// reduce_gradients() does (the optimizer must not write the part while a gather copies it).
// Between a bucket's start and its wait nothing on the training thread reads or writes that range:
// backward only writes ranges not yet reported, the tied exchange only unstarted buckets (and its
// own peer buffer), the norm runs after the waits.
//
// ZeRO-2 (ParamStore's sharded gradients): no whole gradient buffer exists. A block's gradients
// are reduce-scattered over dp as soon as its backward ends, in every micro-batch's backward (the
// model hands the filled slot over through model::BlockGradSink): each dp rank receives the sum of
// the block's elements inside its part and adds it to its part (grad_part()). With overlap the
// reduce-scatter runs on the background group while the next block's backward writes the other
// slot; slot_wanted waits for it before the slot is written again. The embedding, final norm and
// head (kept whole for the step) are reduce-scattered into the part by reduce_gradients, after the
// tied embedding's stage exchange. The sums are not bit-identical to ZeRO-1's (each micro-batch
// is summed over dp before the micro-batches are added up), only equal to rounding.
//
// Communication passes the buffers' raw pointers: host memory on the CPU backend (Gloo); a CUDA
// backend pairs with NCCL communicators, which take device pointers. The backend may still be
// writing a bucket when it is reported complete (the GPU runs behind the host), so start() takes a
// Backend::fence() on the training thread and the reducer's worker waits on it before the bucket's
// all-reduce: it waits for the ops that wrote the bucket, not for the backward issued after.
// The blocking collectives need no fence: the Mesh's NCCL groups order themselves after the
// backend's stream (MeshOptions::cuda_stream).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "comm/background_reducer.hpp"
#include "comm/mesh.hpp"
#include "model/model.hpp"
#include "train/config.hpp"
#include "train/param_gather.hpp"

namespace trainctl::train {

// [begin, end) of the flat gradient buffer, all of one kind (expert or not).
struct GradBucket {
  int64_t begin = 0;
  int64_t end = 0;
  bool expert = false;
  bool operator==(const GradBucket&) const = default;
};

// Consecutive parameters (in buffer order) of the same kind grouped until a bucket reaches
// `bucket_bytes` (a single parameter larger than that is a bucket of its own). A tied copy of the
// embedding is always a bucket of its own: it waits for the stage exchange, the rest need not.
// Covers the whole buffer.
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

class GradSync : public model::BlockGradSink {
 public:
  // `model` must be built with this rank's ModelParallel; zero: the ZeRO stage, 0 to 3.
  // overlap: reduce buckets during backward (see the top of this file); it
  // needs the Mesh's background groups (MeshOptions::background_groups) for each data-parallel
  // group of more than one rank, and is off without them (overlaps() says which).
  // reduce: ZeRO-2 and 3 only, the type the block gradients and the outer regions are summed in
  // over dp (bf16: cast from the gradients' type before the reduce-scatter, the received sums
  // added into the part).
  GradSync(const comm::Mesh& mesh, backend::Backend& backend, model::Transformer& model,
           int64_t bucket_bytes, int zero, bool overlap = false,
           ReduceDtype reduce = ReduceDtype::fp32);
  ~GradSync() override;

  // ZeRO-2 (model::BlockGradSink): the model's block backward hands its slot over here.
  void slot_wanted(int slot) override;
  void block_done(int layer, int slot) override;

  bool overlaps() const { return overlap_; }
  // Overlap: before the step's last backward on this stage. Resets which ranges were reported.
  void arm();
  // Overlap: the model's report that `ranges` of grads() are final; starts every bucket that is
  // complete now. Ignored when not armed.
  void grads_ready(const std::vector<model::IndexRange>& ranges);

  // Sums the gradients over the data-parallel groups (and the tied embedding over the first and
  // last stage). With ZeRO only this rank's optimizer part of grads() holds the sum afterwards.
  // With overlap: starts the buckets not started yet, waits for all, disarms.
  void reduce_gradients();
  // Sum of squares of every gradient element of the job, counted once; identical on every rank
  // (all-reduced over the world). Not finite when any gradient is not.
  double global_sum_squares();
  // ZeRO-1 and 2, after the optimizer updated this rank's part of values(): every dp rank gets all
  // parts. With overlap it only starts the gathers (see the top of this file). ZeRO-3: the block
  // slots are released and the outer regions gathered (ParamGather::part_updated).
  void gather_parameters();
  // ZeRO-3: the source of the model's block values (null for other stages).
  ParamGather* param_gather() { return param_gather_.get(); }
  // Overlap: waits for the gathers of the buckets touching `ranges` of values() (the model's
  // params-needed reports). Nothing to do when no gather is running.
  void params_needed(const std::vector<model::IndexRange>& ranges);
  // Waits for every gather still running: values() then holds every dp rank's part (ZeRO-3: no
  // block gather writes a value slot any more).
  void finish_gather();
  bool gathering() const { return gathering_; }

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  // Seconds the calling thread spent waiting for background reductions and (ZeRO-3) gathers (the
  // exposed part of their time), summed since construction.
  double wait_seconds() const {
    return wait_seconds_ + (param_gather_ ? param_gather_->wait_seconds() : 0.0);
  }
  // The buffers it holds for its collectives: the ZeRO part it reduces into and gathers from, the
  // tied embedding's peer gradient, ZeRO-2's per-slot received shares.
  size_t buffer_bytes() const;
  // Buckets the last reduce_gradients() found already started by grads_ready (overlap at work);
  // ZeRO-2: the block reduce-scatters its backward started in the background.
  size_t started_during_backward() const { return started_early_; }
  // ZeRO-1: buckets of the previous step's gather that this step's forward waited for itself
  // (params_needed) rather than finish_gather; set by reduce_gradients().
  size_t gathered_during_forward() const { return gathered_early_; }

 private:
  void exchange_tied_embedding();
  void plan_overlap();
  void start(size_t bucket);
  void wait_all();
  // ZeRO-1: this rank's part of grads() <- the reduced part in zero_part_.
  void take_reduced_part();
  // ZeRO-2: the reduced share of the block in `slot` added to the part; the slot released.
  void fold_slot(int slot);
  void reduce_outer_regions();
  void reduce_part_over_ep();
  model::IndexRange part_range_of(int64_t begin, int64_t end) const;  // within grad_part()
  size_t first_bucket_after(int64_t at) const;  // the first bucket ending after element `at`
  // ZeRO-1: how many elements of `bucket` each dp rank's part holds, and where the bucket's
  // share of this rank's part starts within the part.
  std::vector<size_t> zero_shares(const GradBucket& bucket) const;
  int64_t zero_offset(const GradBucket& bucket) const;

  const comm::Mesh& mesh_;
  backend::Backend& be_;
  model::Transformer& model_;
  bool zero_;         // ZeRO-1 to 3: the optimizer state is partitioned over dp
  bool shard_grads_;  // ZeRO-2 and 3
  // ZeRO-2, per gradient slot: the block whose reduce-scatter reads it (-1: none), the running
  // operation (null when blocking), where this rank's share of the sum arrives, and with a
  // reduction type other than the gradients' the block's copy in that type.
  struct SlotReduce {
    int layer = -1;
    std::shared_ptr<comm::Work> work;
    backend::Allocation received, sent;
  };
  tensor::DType reduce_dtype_;  // ZeRO-2 and 3: of the block and outer reduce-scatters
  bool converts() const { return reduce_dtype_ != model_.params().grad_dtype(); }
  // ZeRO-2 and 3 converting: an outer region in the reduction type and this rank's share of it.
  backend::Allocation outer_sent_, outer_received_;
  std::vector<SlotReduce> slots_;
  std::vector<int> slot_order_;  // slots with a running reduce-scatter, in start order
  // ZeRO with ep > 1: the non-expert ranges of the part (offsets within it), summed over ep.
  std::vector<model::IndexRange> shared_in_part_;
  size_t block_reduces_ = 0;  // started in the background since the last reduce_gradients
  bool overlap_ = false;
  std::vector<GradBucket> buckets_;
  std::vector<model::IndexRange> counted_;
  std::vector<int64_t> zero_bounds_;  // zero_partition over dp
  // ZeRO-1: this rank's reduced part (also the gather's copy of its updated values). Apart from
  // the tied embedding's peer gradient, which arrives while background buckets write this one.
  backend::Allocation zero_part_;
  backend::Allocation tied_peer_;

  // Overlap state, per bucket: its reducer (null: a one-rank group, nothing to reduce), whether
  // it waits for the tied exchange, elements not yet reported, the running operation.
  std::unique_ptr<comm::BackgroundReducer> dp_reducer_, dp_ep_reducer_;
  std::vector<comm::BackgroundReducer*> reducer_of_;
  std::vector<bool> after_exchange_;
  std::vector<int64_t> unreported_;
  std::vector<std::shared_ptr<comm::Work>> work_;
  std::vector<size_t> started_;                       // bucket indices in start order
  std::vector<std::shared_ptr<comm::Work>> gathers_;  // ZeRO-1 overlap: per bucket, running
  bool gathering_ = false;
  size_t gathered_in_forward_ = 0, gathered_early_ = 0;
  bool armed_ = false;
  size_t started_early_ = 0;
  double wait_seconds_ = 0;
  // ZeRO-3 (declared last: destroyed first, while the reducer its gathers run on still exists).
  std::unique_ptr<ParamGather> param_gather_;
};

}  // namespace trainctl::train
