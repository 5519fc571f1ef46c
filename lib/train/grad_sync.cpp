#include "train/grad_sync.hpp"

#include <algorithm>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>

#include "train/wait_timer.hpp"

namespace trainctl::train {

namespace {

using model::IndexRange;
using model::ParamRole;
using model::ParamSpec;
using tensor::Tensor;

// The specs in buffer order (the table adds them in that order; sorting makes it a guarantee).
std::vector<const ParamSpec*> in_buffer_order(const model::ParamTable& table) {
  std::vector<const ParamSpec*> specs;
  for (const ParamSpec& spec : table.specs())
    specs.push_back(&spec);
  std::sort(specs.begin(), specs.end(),
            [](const ParamSpec* a, const ParamSpec* b) { return a->offset < b->offset; });
  return specs;
}

// A 1-D view of elements [begin, end) of a flat buffer.
Tensor range_of(const Tensor& whole, int64_t begin, int64_t end) {
  return whole.rows(begin, end - begin);
}

// The peer gradient of the tied embedding uses a tag no pipeline micro-batch reaches.
constexpr uint32_t kTiedEmbeddingTag = 0x40000000u;

}  // namespace

std::vector<GradBucket> plan_grad_buckets(const model::ParamTable& table, int64_t bucket_bytes,
                                          size_t element_bytes) {
  if (bucket_bytes < 1)
    throw std::invalid_argument("gradient bucket size " + std::to_string(bucket_bytes) +
                                " bytes: use a positive size (the default is 25 MiB)");
  std::vector<GradBucket> buckets;
  std::optional<GradBucket> open;
  for (const ParamSpec* spec : in_buffer_order(table)) {
    const int64_t end = spec->offset + spec->shape.numel();
    if (open && (open->expert != spec->expert || spec->tied_copy)) {
      buckets.push_back(*open);
      open.reset();
    }
    if (!open) open = GradBucket{spec->offset, end, spec->expert};
    open->end = end;
    if ((open->end - open->begin) * static_cast<int64_t>(element_bytes) >= bucket_bytes ||
        spec->tied_copy) {
      buckets.push_back(*open);
      open.reset();
    }
  }
  if (open) buckets.push_back(*open);
  return buckets;
}

std::vector<IndexRange> norm_ranges(const model::ParamTable& table, const NormOwnership& owner) {
  std::vector<IndexRange> ranges;
  if (!owner.zero && owner.dp_rank != 0) return ranges;
  for (const ParamSpec* spec : in_buffer_order(table)) {
    if (spec->tied_copy) continue;  // equal to the first stage's embed.wte after the exchange
    if (!spec->tp_sharded && owner.tp_rank != 0) continue;
    if (!spec->expert && owner.ep_rank != 0) continue;
    IndexRange r{spec->offset, spec->offset + spec->shape.numel()};
    if (owner.zero) r = {std::max(r.begin, owner.zero_begin), std::min(r.end, owner.zero_end)};
    model::append_joined(ranges, r);
  }
  return ranges;
}

GradSync::GradSync(const comm::Mesh& mesh, backend::Backend& backend, model::Transformer& model,
                   int64_t bucket_bytes, int zero, bool overlap, ReduceDtype reduce)
    : mesh_(mesh),
      be_(backend),
      model_(model),
      zero_(zero >= 1),
      shard_grads_(zero >= 2),
      reduce_dtype_(reduce == ReduceDtype::bf16 ? tensor::DType::bf16
                                                : model.params().grad_dtype()) {
  const model::ParamStore& params = model.params();
  const size_t grad_bytes = tensor::dtype_size(params.grad_dtype());
  if (reduce == ReduceDtype::bf16 && zero < 2)
    throw std::invalid_argument(
        "a bf16 gradient reduction applies to ZeRO-2 and 3's block "
        "reduce-scatters; ZeRO stage " +
        std::to_string(zero) + " sums in the gradients' own type");
  buckets_ = plan_grad_buckets(params.table(), bucket_bytes, grad_bytes);
  if (zero < 0 || zero > 3)
    throw std::invalid_argument("ZeRO stage " + std::to_string(zero) + ": use 0, 1, 2 or 3");
  if (shard_grads_ != params.grads_sharded() || (zero >= 3) != params.values_sharded())
    throw std::invalid_argument(
        std::string("ZeRO-") + std::to_string(zero) + ": the model keeps its gradients " +
        (params.grads_sharded() ? "sharded" : "whole") + " and its values " +
        (params.values_sharded() ? "sharded" : "whole") +
        ": build it with ModelParallel layout.zero = the trainer's ZeRO stage");
  NormOwnership owner{mesh.tp().rank(), mesh.ep().rank(), mesh.dp_cp().rank(), zero_, 0, 0};
  if (zero_) {
    const int dp = mesh.dp_cp().size(), rank = mesh.dp_cp().rank();
    zero_bounds_ = model::zero_partition(params.table(), dp);
    const int64_t begin = zero_bounds_[static_cast<size_t>(rank)];
    const int64_t end = zero_bounds_[static_cast<size_t>(rank) + 1];
    if (params.optimizer_begin() != begin || params.optimizer_end() != end)
      throw std::invalid_argument(
          "ZeRO-1: the model's optimizer state covers elements [" +
          std::to_string(params.optimizer_begin()) + ", " + std::to_string(params.optimizer_end()) +
          ") but dp rank " + std::to_string(rank) + " of " + std::to_string(dp) + " owns [" +
          std::to_string(begin) + ", " + std::to_string(end) +
          "): build the model with ModelParallel zero_parts = dp and zero_rank = the dp rank");
    owner.zero_begin = begin;
    owner.zero_end = end;
    // With one dp rank nothing is reduced or gathered: no buffers. ZeRO-3 gathers from the
    // store's own part.
    if (end > begin && dp > 1 && !params.values_sharded())
      zero_part_ = be_.allocate(static_cast<size_t>(end - begin) * grad_bytes);
    if (shard_grads_ && dp > 1) {
      // Each slot receives this rank's share of one block: at most the largest such share.
      size_t largest = 1, largest_block = 1;
      for (const model::BlockUnit& unit : params.block_units()) {
        largest = std::max(largest, model::zero_shares(zero_bounds_, unit.begin,
                                                       unit.end)[static_cast<size_t>(rank)]);
        largest_block = std::max(largest_block, static_cast<size_t>(unit.numel()));
      }
      const size_t reduce_bytes = tensor::dtype_size(reduce_dtype_);
      slots_.resize(model::ParamStore::kGradSlots);
      for (SlotReduce& slot : slots_) {
        slot.received = be_.allocate(largest * reduce_bytes);
        if (converts()) slot.sent = be_.allocate(largest_block * reduce_bytes);
      }
      if (converts()) {
        // The outer regions are reduce-scattered one after the other through one pair.
        size_t region = 1, share = 1;
        for (const IndexRange& r : params.outer_regions()) {
          region = std::max(region, static_cast<size_t>(r.size()));
          share = std::max(share, static_cast<size_t>(part_range_of(r.begin, r.end).size()));
        }
        outer_sent_ = be_.allocate(region * reduce_bytes);
        outer_received_ = be_.allocate(share * reduce_bytes);
      }
    }
  }
  counted_ = norm_ranges(params.table(), owner);
  if (zero_ && mesh.ep().size() > 1) {
    // ZeRO with expert parallelism: the non-expert elements of the part, within the part.
    for (const ParamSpec* spec : in_buffer_order(params.table()))
      if (!spec->expert)
        model::append_joined(shared_in_part_,
                             part_range_of(spec->offset, spec->offset + spec->shape.numel()));
  }
  const model::ModelParallel& parallel = model.parallel();
  int64_t tied_elements = 0;
  if (parallel.pp_size() > 1 && model.config().tied_embeddings)
    for (const ParamSpec& spec : params.table().specs())
      if (spec.tied_copy || (spec.role == ParamRole::embedding && parallel.first_stage()))
        tied_elements = std::max(tied_elements, spec.shape.numel());
  if (tied_elements > 0) tied_peer_ = be_.allocate(static_cast<size_t>(tied_elements) * grad_bytes);
  if (overlap) plan_overlap();
  if (zero >= 3)
    param_gather_ =
        std::make_unique<ParamGather>(mesh, be_, model, overlap_ ? dp_reducer_.get() : nullptr);
}

GradSync::~GradSync() = default;

void GradSync::plan_overlap() {
  const comm::Communicator& dp = mesh_.dp_cp();
  const comm::Communicator& dp_ep = mesh_.dp_cp_ep();
  // Without the background twin of a group that has something to reduce, the blocking path.
  if ((dp.size() > 1 && !mesh_.dp_bg()) || (dp_ep.size() > 1 && !mesh_.dp_ep_bg())) return;
  if (mesh_.dp_bg()) dp_reducer_ = std::make_unique<comm::BackgroundReducer>(*mesh_.dp_bg());
  if (mesh_.dp_ep_bg() && mesh_.dp_ep_bg() != mesh_.dp_bg())
    dp_ep_reducer_ = std::make_unique<comm::BackgroundReducer>(*mesh_.dp_ep_bg());
  comm::BackgroundReducer* non_expert = dp_ep_reducer_ ? dp_ep_reducer_.get() : dp_reducer_.get();
  // The ranges the tied-embedding exchange adds to after backward: never started early.
  std::vector<IndexRange> tied;
  const model::ModelParallel& parallel = model_.parallel();
  if (parallel.pp_size() > 1 && model_.config().tied_embeddings)
    for (const ParamSpec& spec : model_.params().table().specs())
      if (spec.tied_copy || (spec.role == ParamRole::embedding && parallel.first_stage()))
        tied.push_back({spec.offset, spec.offset + spec.shape.numel()});
  for (const GradBucket& bucket : buckets_) {
    // ZeRO reduce-scatters every bucket over dp into the parts (the ep sum of the non-expert
    // elements follows on the part: reduce_part_over_ep).
    if (bucket.expert || zero_)
      reducer_of_.push_back(dp.size() > 1 ? dp_reducer_.get() : nullptr);
    else
      reducer_of_.push_back(dp_ep.size() > 1 ? non_expert : nullptr);
    bool waits = false;
    for (const IndexRange& r : tied)
      waits = waits || (r.begin < bucket.end && bucket.begin < r.end);
    after_exchange_.push_back(waits);
  }
  unreported_.assign(buckets_.size(), 0);
  work_.assign(buckets_.size(), nullptr);
  gathers_.assign(buckets_.size(), nullptr);
  overlap_ = dp_reducer_ || dp_ep_reducer_;
}

void GradSync::arm() {
  if (!overlap_ || shard_grads_) return;  // ZeRO-2 reduces per block (block_done), not per bucket
  finish_gather();
  for (size_t b = 0; b < buckets_.size(); ++b)
    unreported_[b] = buckets_[b].end - buckets_[b].begin;
  armed_ = true;
}

void GradSync::grads_ready(const std::vector<IndexRange>& ranges) {
  if (!armed_) return;
  for (const IndexRange& range : ranges) {
    for (size_t b = first_bucket_after(range.begin);
         b < buckets_.size() && buckets_[b].begin < range.end; ++b) {
      const int64_t covered =
          std::min(range.end, buckets_[b].end) - std::max(range.begin, buckets_[b].begin);
      if (covered <= 0) continue;
      unreported_[b] -= covered;
      if (unreported_[b] < 0)
        throw std::logic_error("gradient range [" + std::to_string(range.begin) + ", " +
                               std::to_string(range.end) + ") reported twice in one backward");
      if (unreported_[b] == 0 && !after_exchange_[b] && reducer_of_[b] && !work_[b]) start(b);
    }
  }
}

void GradSync::start(size_t bucket) {
  const GradBucket& b = buckets_[bucket];
  const Tensor part = range_of(model_.params().grads(), b.begin, b.end);
  // The backward ops that wrote this bucket may still run on the device: the worker waits for
  // them (a fence marks what was issued until now), not for the backward issued after.
  std::shared_ptr<backend::Backend::Fence> written = be_.fence();
  auto ready = [written] { written->wait(); };
  if (!zero_) {
    work_[bucket] = reducer_of_[bucket]->start_all_reduce_sum(
        part.data, static_cast<size_t>(part.numel()), part.dtype, std::move(ready));
  } else {
    // Each dp rank receives the sum of the bucket's elements inside its part (often none: a
    // bucket inside one part is a reduce to its owner), at their place in zero_part_.
    void* output = static_cast<char*>(zero_part_.data()) +
                   static_cast<size_t>(zero_offset(b)) * tensor::dtype_size(part.dtype);
    work_[bucket] = reducer_of_[bucket]->start_reduce_scatter_sum_v(
        part.data, output, zero_shares(b), part.dtype, std::move(ready));
  }
  started_.push_back(bucket);
}

// Buckets are sorted and disjoint: the first one ending after `at`.
size_t GradSync::first_bucket_after(int64_t at) const {
  return static_cast<size_t>(
      std::upper_bound(buckets_.begin(), buckets_.end(), at,
                       [](int64_t x, const GradBucket& bucket) { return x < bucket.end; }) -
      buckets_.begin());
}

std::vector<size_t> GradSync::zero_shares(const GradBucket& b) const {
  return model::zero_shares(zero_bounds_, b.begin, b.end);
}

int64_t GradSync::zero_offset(const GradBucket& b) const {
  return part_range_of(b.begin, b.end).begin;
}

// In start order: every rank of a group queued its operations in the same order.
void GradSync::wait_all() {
  std::vector<std::shared_ptr<comm::Work>> works(buckets_.size());
  works.swap(work_);
  std::vector<size_t> order;
  order.swap(started_);
  timed_wait(wait_seconds_, [&] {
    for (size_t bucket : order)
      works[bucket]->wait();
  });
}

void GradSync::exchange_tied_embedding() {
  const model::ModelParallel& parallel = model_.parallel();
  if (parallel.pp_size() < 2 || !model_.config().tied_embeddings) return;
  const model::ParamStore& params = model_.params();
  const ParamSpec* tied = nullptr;
  for (const ParamSpec& spec : params.table().specs())
    if ((parallel.last_stage() && spec.tied_copy) ||
        (parallel.first_stage() && spec.role == ParamRole::embedding && !spec.tied_copy))
      tied = &spec;
  if (!parallel.first_stage() && !parallel.last_stage()) return;
  if (!tied)
    throw std::logic_error("tied embeddings over " + std::to_string(parallel.pp_size()) +
                           " stages: stage " + std::to_string(parallel.pp_rank()) +
                           " has no embed.wte (or its tied copy) in its parameter table");
  const Tensor grad = params.unreduced_grads(tied->offset, tied->offset + tied->shape.numel())
                          .reshaped(tied->shape);
  const Tensor peer = tied_peer_.view(grad.dtype, grad.shape);
  comm::Communicator& pp = mesh_.pp();
  // First stage sends first, last stage receives first: safe even with unbuffered sends.
  if (parallel.first_stage()) {
    pp.send(grad.data, grad.bytes(), parallel.pp_size() - 1, kTiedEmbeddingTag);
    pp.recv(peer.data, peer.bytes(), parallel.pp_size() - 1, kTiedEmbeddingTag);
  } else {
    pp.recv(peer.data, peer.bytes(), 0, kTiedEmbeddingTag);
    pp.send(grad.data, grad.bytes(), 0, kTiedEmbeddingTag);
  }
  // first + last on both stages: a float sum of two terms is the same in either order.
  be_.accumulate(grad, peer);
}

void GradSync::reduce_gradients() {
  gathered_early_ = gathered_in_forward_;
  gathered_in_forward_ = 0;
  finish_gather();  // ZeRO-3 too: no gather may read the part the optimizer is about to write
  if (shard_grads_) {
    started_early_ = block_reduces_;
    block_reduces_ = 0;
    const std::vector<int> running = slot_order_;  // in start order
    for (int slot : running)
      fold_slot(slot);
    exchange_tied_embedding();
    reduce_outer_regions();
    reduce_part_over_ep();
    return;
  }
  exchange_tied_embedding();
  const Tensor grads = model_.params().grads();
  if (overlap_) {
    started_early_ = armed_ ? started_.size() : 0;
    armed_ = false;
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (reducer_of_[b] && !work_[b]) start(b);
    wait_all();
    if (zero_) {
      take_reduced_part();
      reduce_part_over_ep();
    }
    return;
  }
  if (!zero_) {
    // Without overlap each bucket's all-reduce blocks, after backward (the overlap path above
    // starts bucket k while backward still produces the buckets before it).
    for (const GradBucket& bucket : buckets_) {
      comm::Communicator& group = bucket.expert ? mesh_.dp_cp() : mesh_.dp_cp_ep();
      if (group.size() < 2) continue;
      const Tensor part = range_of(grads, bucket.begin, bucket.end);
      group.all_reduce_sum(part.data, static_cast<size_t>(part.numel()), part.dtype);
    }
    return;
  }
  comm::Communicator& dp = mesh_.dp_cp();
  if (dp.size() > 1) {
    const std::vector<size_t> counts = model::zero_shares(zero_bounds_, 0, grads.numel());
    dp.reduce_scatter_sum_v(grads.data, zero_part_.data(), counts, grads.dtype);
    take_reduced_part();
  }
  reduce_part_over_ep();
}

// ZeRO with expert parallelism: the part holds each non-expert element summed over dp; the ep
// ranks of the same dp rank hold the same part of other micro-batches (and other experts), so the
// non-expert elements are summed over ep too, completing the sum over dp_ep. Sum is linear: the
// same as summing over dp_ep first, up to rounding.
void GradSync::reduce_part_over_ep() {
  comm::Communicator& ep = mesh_.ep();
  if (shared_in_part_.empty() || ep.size() < 2) return;
  const Tensor part = model_.params().grad_part();
  for (const IndexRange& r : shared_in_part_) {
    const Tensor t = range_of(part, r.begin, r.end);
    ep.all_reduce_sum(t.data, static_cast<size_t>(t.numel()), t.dtype);
  }
}

void GradSync::take_reduced_part() {
  if (mesh_.dp_cp().size() < 2) return;  // nothing was reduce-scattered: the part is the buffer
  const model::ParamStore& params = model_.params();
  const Tensor mine = range_of(params.grads(), params.optimizer_begin(), params.optimizer_end());
  if (mine.numel() > 0) be_.cast(mine, zero_part_.view(mine.dtype, {mine.numel()}));
}

size_t GradSync::buffer_bytes() const {
  size_t bytes =
      zero_part_.bytes() + tied_peer_.bytes() + outer_sent_.bytes() + outer_received_.bytes();
  for (const SlotReduce& slot : slots_)
    bytes += slot.received.bytes() + slot.sent.bytes();
  return bytes;
}

model::IndexRange GradSync::part_range_of(int64_t begin, int64_t end) const {
  const model::ParamStore& params = model_.params();
  const int64_t first = params.optimizer_begin(), last = params.optimizer_end();
  return {std::clamp(begin, first, last) - first, std::clamp(end, first, last) - first};
}

void GradSync::slot_wanted(int slot) {
  if (slots_.empty()) return;  // one dp rank: block_done folded it already
  if (slots_.at(static_cast<size_t>(slot)).layer >= 0) fold_slot(slot);
}

void GradSync::block_done(int layer, int slot) {
  model::ParamStore& params = model_.params();
  comm::Communicator& dp = mesh_.dp_cp();
  if (dp.size() < 2) {  // the part is the whole buffer: nothing to reduce
    params.fold_block_grads(layer);
    return;
  }
  const model::BlockUnit& unit = params.block_unit(layer);
  SlotReduce& s = slots_.at(static_cast<size_t>(slot));
  Tensor input = params.unreduced_grads(unit.begin, unit.end);
  if (converts()) {  // the block in the reduction type
    const Tensor converted = s.sent.view(reduce_dtype_, {unit.numel()});
    be_.cast(converted, input);
    input = converted;
  }
  std::vector<size_t> shares = model::zero_shares(zero_bounds_, unit.begin, unit.end);
  if (s.layer >= 0)
    throw std::logic_error("ZeRO-2: gradient slot " + std::to_string(slot) +
                           " handed over again before its reduce-scatter was folded");
  s.layer = layer;
  if (overlap_ && dp_reducer_) {
    std::shared_ptr<backend::Backend::Fence> written = be_.fence();
    s.work =
        dp_reducer_->start_reduce_scatter_sum_v(input.data, s.received.data(), std::move(shares),
                                                input.dtype, [written] { written->wait(); });
    slot_order_.push_back(slot);
    ++block_reduces_;
    return;
  }
  dp.reduce_scatter_sum_v(input.data, s.received.data(), shares, input.dtype);
  fold_slot(slot);
}

void GradSync::fold_slot(int slot) {
  SlotReduce& s = slots_.at(static_cast<size_t>(slot));
  if (s.work) {
    const std::shared_ptr<comm::Work> work = std::move(s.work);
    slot_order_.erase(std::find(slot_order_.begin(), slot_order_.end(), slot));
    timed_wait(wait_seconds_, [&] { work->wait(); });
  }
  model::ParamStore& params = model_.params();
  const model::BlockUnit& unit = params.block_unit(s.layer);
  const IndexRange mine = part_range_of(unit.begin, unit.end);
  if (mine.size() > 0)
    be_.accumulate(params.grad_part().rows(mine.begin, mine.size()),
                   s.received.view(reduce_dtype_, {mine.size()}));
  params.release_block_grads(s.layer);
  s.layer = -1;
}

// ZeRO-2: the embedding (before the first block) and the final norm and head (after the last),
// whole for the step, reduce-scattered once into the part, whose elements there are still zero.
void GradSync::reduce_outer_regions() {
  model::ParamStore& params = model_.params();
  const Tensor part = params.grad_part();
  comm::Communicator& dp = mesh_.dp_cp();
  if (dp.size() < 2) {  // the part is the whole buffer
    params.fold_outer_grads();
    return;
  }
  for (const IndexRange& region : params.outer_regions()) {
    if (region.size() <= 0) continue;
    const std::vector<size_t> shares = model::zero_shares(zero_bounds_, region.begin, region.end);
    const Tensor input = params.unreduced_grads(region.begin, region.end);
    const IndexRange mine = part_range_of(region.begin, region.end);
    if (!converts()) {  // straight into the part, whose elements there are still zero
      void* output = static_cast<char*>(part.data) +
                     static_cast<size_t>(mine.begin) * tensor::dtype_size(part.dtype);
      dp.reduce_scatter_sum_v(input.data, output, shares, input.dtype);
      continue;
    }
    const Tensor converted = outer_sent_.view(reduce_dtype_, {region.size()});
    be_.cast(converted, input);
    dp.reduce_scatter_sum_v(converted.data, outer_received_.data(), shares, reduce_dtype_);
    if (mine.size() > 0)
      be_.accumulate(part.rows(mine.begin, mine.size()),
                     outer_received_.view(reduce_dtype_, {mine.size()}));
  }
}

double GradSync::global_sum_squares() {
  const model::ParamStore& params = model_.params();
  const Tensor part = params.grad_part();
  const int64_t first = params.optimizer_begin();
  double partial = 0;
  for (const IndexRange& range : counted_)
    partial += be_.sum_squares(range_of(part, range.begin - first, range.end - first));
  mesh_.world().all_reduce_sum(&partial, 1, tensor::DType::f64);
  return partial;
}

void GradSync::gather_parameters() {
  if (param_gather_) {
    param_gather_->part_updated();
    return;
  }
  if (!zero_ || mesh_.dp_cp().size() < 2) return;
  finish_gather();
  const model::ParamStore& params = model_.params();
  const Tensor values = params.values();
  const size_t item = tensor::dtype_size(values.dtype);
  // The own part goes through zero_part_ (free after the step): the gather's output covers its
  // input.
  const Tensor mine = range_of(values, params.optimizer_begin(), params.optimizer_end());
  const Tensor copy = zero_part_.view(values.dtype, {mine.numel()});
  be_.cast(copy, mine);
  if (!overlap_) {
    std::vector<size_t> bytes = model::zero_shares(zero_bounds_, 0, values.numel());
    for (size_t& count : bytes)
      count *= item;
    mesh_.dp_cp().all_gather_v(copy.data, values.data, bytes);
    return;
  }
  // One fence for every bucket: the optimizer's update and the copy above are what they read.
  std::shared_ptr<backend::Backend::Fence> written = be_.fence();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const GradBucket& bucket = buckets_[b];
    std::vector<size_t> bytes = zero_shares(bucket);
    for (size_t& count : bytes)
      count *= item;
    const char* input =
        static_cast<const char*>(copy.data) + static_cast<size_t>(zero_offset(bucket)) * item;
    char* output = static_cast<char*>(values.data) + static_cast<size_t>(bucket.begin) * item;
    gathers_[b] = reducer_of_[b]->start_all_gather_v(input, output, std::move(bytes),
                                                     [written] { written->wait(); });
  }
  gathering_ = true;
}

void GradSync::params_needed(const std::vector<IndexRange>& ranges) {
  if (!gathering_) return;
  timed_wait(wait_seconds_, [&] {
    for (const IndexRange& range : ranges) {
      for (size_t b = first_bucket_after(range.begin);
           b < buckets_.size() && buckets_[b].begin < range.end; ++b)
        if (gathers_[b]) {
          gathers_[b]->wait();
          gathers_[b].reset();
          ++gathered_in_forward_;
        }
    }
  });
}

void GradSync::finish_gather() {
  if (param_gather_) param_gather_->wait_all();  // ZeRO-3: a prefetch a pass left running
  if (!gathering_) return;
  gathering_ = false;  // a failed gather is reported once; the group is broken after it anyway
  std::vector<std::shared_ptr<comm::Work>> gathers(buckets_.size());
  gathers.swap(gathers_);
  timed_wait(wait_seconds_, [&] {
    for (const std::shared_ptr<comm::Work>& gather : gathers)
      if (gather) gather->wait();
  });
}

}  // namespace trainctl::train
