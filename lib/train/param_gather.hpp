// ZeRO-3's parameter gathers: each block's values are all-gathered over dp from the ranks' parts
// into a value slot of the model's ParamStore just before the block's forward and again before its
// backward (model::BlockValueSource), and the outer regions (embedding, final norm, head, kept
// whole for the step) after each optimizer step.
//
// Prefetch (constructed with a background reducer): when the model asks for block i it names the
// block it needs next in the same pass (i+1 in forward, i-1 in backward); the gather of that block
// starts on the reducer into the other slot and runs while block i computes, so the next
// values_wanted only waits for what is left of it. A block whose slot still holds its values is
// not gathered again: the last blocks of a forward are reused by the backward that follows.
// Without a reducer every gather blocks, on the training thread's dp group.
//
// Each dp rank contributes the elements of the block inside its part (zero_partition over dp, cut
// at row boundaries): all_gather_v packs them in rank order, which is the block's own order, so the
// gather writes the slot directly. With ep > 1 each ep rank gathers its own table's block over dp
// (the parts are cut in each ep rank's table, as for ZeRO-1 and 2). The values gathered are the
// storage type (bf16 runs gather bf16, FSDP2's param_dtype); the gradients are reduced in their
// own type (f32 for 16-bit storage: FSDP2's reduce_dtype fp32).
//
// The reducer is the gradient sync's (one worker per group: the block reduce-scatters of ZeRO-2
// and these gathers queue on it in the order the training thread starts them, the same on every
// rank of the group). A gather into a slot takes a Backend::fence first: the device may still be
// reading the block that held the slot before.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "comm/background_reducer.hpp"
#include "comm/mesh.hpp"
#include "model/model.hpp"

namespace trainctl::train {

class ParamGather : public model::BlockValueSource {
 public:
  // `model` must keep sharded values (ModelParallel layout.zero = 3) partitioned over mesh.dp_cp().
  // reducer: a background reducer of the dp group (null: blocking gathers); it must outlive this.
  ParamGather(const comm::Mesh& mesh, backend::Backend& backend, model::Transformer& model,
              comm::BackgroundReducer* reducer);
  ~ParamGather() override;
  ParamGather(const ParamGather&) = delete;
  ParamGather& operator=(const ParamGather&) = delete;

  void values_wanted(int layer, int next) override;
  // After the optimizer wrote this rank's part: every slot released, the outer regions gathered.
  void part_updated();
  // Waits for every gather still running (before anything writes the part).
  void wait_all();

  bool prefetches() const { return reducer_ != nullptr && mesh_.dp_cp().size() > 1; }
  // Seconds the training thread waited for background gathers (exposed), since construction.
  double wait_seconds() const { return wait_seconds_; }
  // Gathers started (blocking or in the background) and those values_wanted found already
  // started by a prefetch, since construction.
  size_t gathers() const { return gathers_; }
  size_t prefetched() const { return prefetched_; }

 private:
  int start(int layer, int keep);  // claims a slot for `layer` and starts its gather
  void wait(int slot);

  const comm::Mesh& mesh_;
  backend::Backend& be_;
  model::Transformer& model_;
  comm::BackgroundReducer* reducer_;
  std::vector<int64_t> bounds_;                    // zero_partition over dp
  std::vector<std::shared_ptr<comm::Work>> work_;  // per value slot: its running gather
  double wait_seconds_ = 0;
  size_t gathers_ = 0, prefetched_ = 0;
};

}  // namespace trainctl::train
