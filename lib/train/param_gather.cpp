#include "train/param_gather.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

#include "train/wait_timer.hpp"

namespace trainctl::train {

namespace {

// Bytes of [begin, end) that each part of `bounds` holds.
std::vector<size_t> share_bytes(const std::vector<int64_t>& bounds, int64_t begin, int64_t end,
                                size_t item) {
  std::vector<size_t> bytes = model::zero_shares(bounds, begin, end);
  for (size_t& b : bytes)
    b *= item;
  return bytes;
}

}  // namespace

ParamGather::ParamGather(const comm::Mesh& mesh, backend::Backend& backend,
                         model::Transformer& model, comm::BackgroundReducer* reducer)
    : mesh_(mesh), be_(backend), model_(model), reducer_(reducer) {
  const model::ParamStore& params = model.params();
  if (!params.values_sharded())
    throw std::invalid_argument(
        "ParamGather: the model keeps its values whole: build it with ModelParallel layout.zero "
        "= 3");
  bounds_ = model::zero_partition(params.table(), mesh.dp_cp().size());
  const int rank = mesh.dp_cp().rank();
  if (params.optimizer_begin() != bounds_[static_cast<size_t>(rank)] ||
      params.optimizer_end() != bounds_[static_cast<size_t>(rank) + 1])
    throw std::invalid_argument(
        "ParamGather: the model's part [" + std::to_string(params.optimizer_begin()) + ", " +
        std::to_string(params.optimizer_end()) + ") is not dp rank " + std::to_string(rank) + "'s");
  work_.resize(model::ParamStore::kValueSlots);
}

ParamGather::~ParamGather() = default;

void ParamGather::wait(int slot) {
  std::shared_ptr<comm::Work> work = std::move(work_.at(static_cast<size_t>(slot)));
  if (work) timed_wait(wait_seconds_, [&] { work->wait(); });
}

void ParamGather::wait_all() {
  for (int slot = 0; slot < model::ParamStore::kValueSlots; ++slot)
    wait(slot);
}

int ParamGather::start(int layer, int keep) {
  model::ParamStore& params = model_.params();
  const int slot = params.claim_value_slot(layer, keep);
  wait(slot);  // a prefetch into it that no pass used (queued before ours anyway)
  ++gathers_;
  const model::BlockUnit& unit = params.block_unit(layer);
  const tensor::Tensor output = params.value_slot(slot);
  const size_t item = tensor::dtype_size(output.dtype);
  const int64_t first = params.optimizer_begin();
  const int64_t begin = std::clamp(unit.begin, first, params.optimizer_end());
  const void* input = static_cast<const char*>(params.value_part().data) +
                      static_cast<size_t>(begin - first) * item;
  std::vector<size_t> bytes = share_bytes(bounds_, unit.begin, unit.end, item);
  if (prefetches()) {
    // The device may still read the slot's previous block, and the optimizer's last update of
    // the part may still be in flight: the worker waits for what was issued until now.
    std::shared_ptr<backend::Backend::Fence> issued = be_.fence();
    work_[static_cast<size_t>(slot)] = reducer_->start_all_gather_v(
        input, output.data, std::move(bytes), [issued] { issued->wait(); });
  } else {
    mesh_.dp_cp().all_gather_v(input, output.data, bytes);
  }
  return slot;
}

void ParamGather::values_wanted(int layer, int next) {
  model::ParamStore& params = model_.params();
  if (mesh_.dp_cp().size() < 2) {  // the part is the whole buffer
    params.load_block_values(layer);
    return;
  }
  int slot = params.value_slot_of(layer);
  if (slot < 0)
    slot = start(layer, -1);
  else if (work_[static_cast<size_t>(slot)])
    ++prefetched_;
  wait(slot);
  if (next >= 0 && prefetches() && params.value_slot_of(next) < 0) start(next, slot);
}

void ParamGather::part_updated() {
  model::ParamStore& params = model_.params();
  wait_all();
  if (mesh_.dp_cp().size() < 2) {
    params.refresh_from_part();
    return;
  }
  params.release_block_values();
  const std::array<model::IndexRange, 2> regions = params.outer_regions();
  const tensor::Tensor part = params.value_part();
  const size_t item = tensor::dtype_size(part.dtype);
  const int64_t first = params.optimizer_begin();
  for (size_t r = 0; r < regions.size(); ++r) {
    const model::IndexRange region = regions[r];
    if (region.size() <= 0) continue;
    const int64_t begin = std::clamp(region.begin, first, params.optimizer_end());
    const void* input =
        static_cast<const char*>(part.data) + static_cast<size_t>(begin - first) * item;
    mesh_.dp_cp().all_gather_v(input, params.outer_values(r).data,
                               share_bytes(bounds_, region.begin, region.end, item));
  }
}

}  // namespace trainctl::train
