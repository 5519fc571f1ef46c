// The planner's memory model against the multi-rank engine. Every rank of a layout is built in
// this one process: a Transformer's parameter table and activation arena need only the tp and ep
// groups' size and rank, which a shape-only communicator supplies (its collectives are never
// called while building). The planner's per-rank figure (estimate_rank_memory) must equal the
// engine's ParamStore::bytes() and activation_bytes() exactly for tp2, pp2 (each stage with its
// 1F1B activation slots), dp2 with ZeRO-1 (each dp rank's optimizer part), tp2 x pp2, ep2 and
// ep2 x tp2 MoE, for gpt and llama shapes; estimate_memory must be the largest of them. ZB-H1's
// cases: each slot with W's stash (ModelParallel::split_backward).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "model/model.hpp"
#include "planner/planner.hpp"
#include "shape_only_communicator.hpp"

namespace {

using namespace trainctl;
using recipe::Arch;
using Compute = tensor::DType;
using trainctl::Recompute;

using test_util::ShapeOnlyCommunicator;

struct ModelCase {
  const char* name;
  Arch arch;
  int experts;  // 0: dense; else MoE every second layer, top 2
  Compute compute;
  Recompute recompute;
  int micro_batch;
  int global_batch;
};

recipe::Recipe recipe_for(const ModelCase& k) {
  recipe::Recipe r = recipe::default_recipe(k.arch);
  r.name = k.name;
  r.model.layers = 4;
  r.model.hidden = 64;
  r.model.heads = 4;
  r.model.kv_heads = k.arch == Arch::llama ? 2 : 4;  // llama: grouped-query attention
  r.model.ffn_hidden = 160;
  r.model.vocab = 320;
  r.model.seq_len = 48;
  r.model.moe.experts = k.experts;
  r.model.moe.top_k = 2;
  r.model.moe.every = 2;
  r.model.storage = k.compute;
  r.parallel.recompute = k.recompute;
  r.training.micro_batch = k.micro_batch;
  r.training.global_batch = k.global_batch;
  return r;
}

struct Measured {
  double params = 0, grads = 0, optimizer = 0, activations = 0;
  double total() const { return params + grads + optimizer + activations; }
};

// Builds the engine of global rank `rank` of `layout` as lib/run/context.cpp does (ModelParallel
// from the rank's coordinates; activation slots as the schedule needs: pipeline_slots; the
// backward split for ZB-H1; ZeRO parts = dp).
Measured engine_rank(const recipe::Recipe& r, const planner::Variant& layout, int rank,
                     backend::Backend& cpu) {
  const Coordinates at = coordinates_of(layout, rank);
  ShapeOnlyCommunicator tp("tp", at.tp, layout.tp), ep("ep", at.ep, layout.ep),
      cp("cp", at.cp, layout.cp);
  model::ModelParallel parallel;
  parallel.layout = layout;
  parallel.at = at;
  if (layout.tp > 1) parallel.tp = &tp;
  if (layout.ep > 1) parallel.ep = &ep;
  if (layout.cp > 1) parallel.cp = &cp;
  parallel.stage_layers = r.parallel.pp_layers;
  parallel.virtual_stages = layout.pp_virtual;
  parallel.activation_slots = pipeline_slots(layout.pipeline(r), at.pp);
  parallel.split_backward = splits_backward(layout.pp_schedule);
  model::Transformer engine(r.model, cpu, layout.micro_batch, parallel);
  const model::ParamStore::Bytes bytes = engine.params().bytes();
  return {static_cast<double>(bytes.params), static_cast<double>(bytes.grads),
          static_cast<double>(bytes.optimizer),
          static_cast<double>(engine.activation_bytes().total())};
}

// Every rank of `layout`: the planner's figure for that rank equals the engine's, and
// estimate_memory is the rank with the largest total.
void check_every_rank(const recipe::Recipe& r, const planner::Variant& layout) {
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend();
  const topology::ClusterSpec machine = planner::cpu_machine();
  const planner::MemoryEstimate worst = planner::estimate_memory(r, machine, layout);
  double largest = 0;
  int largest_stage = -1;
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    INFO(r.name << " " << layout.describe() << " rank " << rank);
    const Coordinates at = coordinates_of(layout, rank);
    const Measured engine = engine_rank(r, layout, rank, *cpu);
    const planner::MemoryEstimate predicted = planner::estimate_rank_memory(r, machine, layout, at);
    std::printf(
        "%-28s %-50s rank %d: params %8.0f/%8.0f optimizer %8.0f/%8.0f activations "
        "%8.0f/%8.0f (planner/engine)\n",
        r.name.c_str(), layout.describe().c_str(), rank, predicted.params, engine.params,
        predicted.optimizer, engine.optimizer, predicted.activations, engine.activations);
    CHECK(predicted.params == engine.params);
    CHECK(predicted.grads == engine.grads);
    CHECK(predicted.optimizer == engine.optimizer);
    CHECK(predicted.activations == engine.activations);
    CHECK(predicted.worst_stage == at.pp);
    if (predicted.total() > largest) {
      largest = predicted.total();
      largest_stage = at.pp;
    }
  }
  INFO(r.name << " " << layout.describe());
  CHECK(worst.total() == largest);
  CHECK(worst.worst_stage == largest_stage);
}

const ModelCase kDense[] = {
    {"gpt fp32 none mb2", Arch::gpt, 0, Compute::f32, Recompute::none, 2, 8},
    {"gpt bf16 selective mb1", Arch::gpt, 0, Compute::bf16, Recompute::selective, 1, 8},
    {"llama fp32 full mb2", Arch::llama, 0, Compute::f32, Recompute::full, 2, 8},
    {"llama bf16 none mb1", Arch::llama, 0, Compute::bf16, Recompute::none, 1, 8},
};

const ModelCase kMoe[] = {
    {"moe gpt fp32 none mb2", Arch::gpt, 4, Compute::f32, Recompute::none, 2, 8},
    {"moe llama bf16 selective mb1", Arch::llama, 4, Compute::bf16, Recompute::selective, 1, 8},
    {"moe llama fp32 full mb2", Arch::llama, 8, Compute::f32, Recompute::full, 2, 8},
};

planner::Variant layout(int tp, int pp, int dp, int ep, const ModelCase& k, int zero = 0) {
  return planner::Variant{tp, pp, dp, ep, k.micro_batch, zero, k.recompute};
}

}  // namespace

TEST_CASE("memory model matches the engine on every rank of tp2 (vocab-parallel head)") {
  for (const ModelCase& k : kDense)
    check_every_rank(recipe_for(k), layout(2, 1, 1, 1, k));
}

TEST_CASE("memory model matches the engine on every stage of pp2 with its 1F1B slots") {
  for (const ModelCase& k : kDense) {
    const recipe::Recipe r = recipe_for(k);
    check_every_rank(r, layout(1, 2, 1, 1, k));
    // 1F1B with 8 micro-batches: stage 0 holds two in flight, the last stage one.
    const topology::ClusterSpec machine = planner::cpu_machine();
    CHECK(planner::estimate_rank_memory(r, machine, layout(1, 2, 1, 1, k), {0, 0, 0, 0, 0})
              .in_flight == 2);
    CHECK(planner::estimate_rank_memory(r, machine, layout(1, 2, 1, 1, k), {0, 0, 0, 0, 1})
              .in_flight == 1);
  }
}

TEST_CASE("memory model matches the engine on uneven pipeline stages (parallel.pp_layers)") {
  for (const ModelCase& k : {kDense[0], kDense[3], kMoe[1]}) {
    recipe::Recipe r = recipe_for(k);
    r.parallel.pp_layers = {1, 3};  // the last stage holds most layers and the head
    check_every_rank(r, layout(1, 2, 1, 1, k));
  }
}

// The interleaved schedule: a rank holds its chunks' layers, its slots serve any chunk (each layer
// position holding what that position of every chunk needs: [1, 2, 2, 1] puts a dense layer and
// an MoE layer at rank 0's first position), its slot count is the schedule's, and each slot has a
// tensor for the gradient sent back.
TEST_CASE("memory model matches the engine on interleaved pipelines (two chunks per rank)") {
  for (const ModelCase& k : {kDense[0], kDense[2], kMoe[0], kMoe[1]}) {
    recipe::Recipe r = recipe_for(k);
    r.model.layers = 6;
    for (const std::vector<int>& split : {std::vector<int>{}, std::vector<int>{1, 2, 2, 1}}) {
      r.parallel.pp_layers = split;
      planner::Variant v = layout(1, 2, 1, 1, k);
      v.pp_schedule = PipeSchedule::interleaved;
      v.pp_virtual = 2;
      check_every_rank(r, v);
      v.tp = 2;
      check_every_rank(r, v);
    }
  }
}

// ZB-H1: every stage holds min(pp, M) slots, each also keeping W's stash (the blocks' GEMM output
// gradients; an MoE layer's router and expert ones; with sequence parallelism W gathers its
// inputs again). Recompute none only (the engine refuses the others), dense and MoE, tp, sp,
// ZeRO-1.
TEST_CASE("memory model matches the engine on ZB-H1 pipelines (each slot keeps W's stash)") {
  auto zb = [](planner::Variant v) {
    v.pp_schedule = PipeSchedule::zb_h1;
    return v;
  };
  auto sp = [](planner::Variant v) {
    v.sequence_parallel = true;
    return v;
  };
  for (const ModelCase& k : {kDense[0], kDense[3], kMoe[0]}) {  // recompute none
    const recipe::Recipe r = recipe_for(k);
    check_every_rank(r, zb(layout(1, 2, 1, 1, k)));
    check_every_rank(r, zb(layout(2, 2, 1, 1, k)));
    check_every_rank(r, zb(sp(layout(2, 2, 1, 1, k))));
    check_every_rank(r, zb(layout(1, 2, 2, 1, k, 1)));
    // Every stage holds min(pp, M) = 2 slots, the last one more than 1F1B's 1.
    const topology::ClusterSpec machine = planner::cpu_machine();
    CHECK(planner::estimate_rank_memory(r, machine, zb(layout(1, 2, 1, 1, k)), {0, 0, 0, 0, 1})
              .in_flight == 2);
  }
  check_every_rank(recipe_for(kMoe[0]), zb(layout(1, 2, 1, 2, kMoe[0])));  // ep2
  recipe::Recipe uneven = recipe_for(kDense[3]);
  uneven.parallel.pp_layers = {1, 3};
  check_every_rank(uneven, zb(layout(1, 2, 1, 1, kDense[3])));
}

TEST_CASE("memory model matches the engine on every dp rank's ZeRO-1 part") {
  for (const ModelCase& k : kDense) {
    check_every_rank(recipe_for(k), layout(1, 1, 2, 1, k, 1));
    check_every_rank(recipe_for(k), layout(1, 1, 3, 1, k, 1));  // uneven parts
  }
  // ZeRO-1 with pp: each stage partitions its own table.
  check_every_rank(recipe_for(kDense[1]), layout(1, 2, 2, 1, kDense[1], 1));
}

// ZeRO-2: the gradients are the rank's part, the embedding, final norm and head whole, and two
// slots of the largest block; a model of many blocks keeps far fewer gradient bytes than ZeRO-1.
// ZeRO-3: the values the same way (in the storage type), the gradients as ZeRO-2's, and no ZeRO
// buffer in the gradient sync.
TEST_CASE("memory model matches the engine on every dp rank's ZeRO-2 gradients and ZeRO-3 values") {
  for (const int zero : {2, 3}) {
    for (const ModelCase& k : kDense) {
      check_every_rank(recipe_for(k), layout(1, 1, 2, 1, k, zero));
      check_every_rank(recipe_for(k), layout(1, 1, 3, 1, k, zero));  // uneven parts
    }
    check_every_rank(recipe_for(kDense[1]), layout(1, 2, 2, 1, kDense[1], zero));  // per stage
    check_every_rank(recipe_for(kDense[2]), layout(2, 1, 2, 1, kDense[2], zero));  // tp shards
    check_every_rank(recipe_for(kDense[0]), layout(1, 1, 1, 1, kDense[0], zero));  // one rank
  }
  // ep2 x dp2: each ep rank partitions its own experts.
  for (const int zero : {1, 2})
    check_every_rank(recipe_for(kMoe[0]), layout(1, 1, 2, 2, kMoe[0], zero));
  check_every_rank(recipe_for(kMoe[1]), layout(1, 1, 2, 2, kMoe[1], 3));
  recipe::Recipe deep = recipe_for(kDense[0]);
  deep.model.layers = 16;
  const topology::ClusterSpec machine = planner::cpu_machine();
  const planner::MemoryEstimate one =
      planner::estimate_memory(deep, machine, layout(1, 1, 4, 1, kDense[0], 1));
  const planner::MemoryEstimate two =
      planner::estimate_memory(deep, machine, layout(1, 1, 4, 1, kDense[0], 2));
  const planner::MemoryEstimate three =
      planner::estimate_memory(deep, machine, layout(1, 1, 4, 1, kDense[0], 3));
  CHECK(two.grads < 0.5 * one.grads);
  // The worst dp rank may differ (by a row of its part): the same optimizer state to 1%.
  CHECK(two.optimizer == Approx(one.optimizer).epsilon(0.01));
  // Gloo stages dp copies of one block's share (and of an outer region's), not of the whole part.
  CHECK(two.comm_buffers < one.comm_buffers);
  CHECK(two.total() < one.total());
  CHECK(three.params < 0.5 * two.params);
  CHECK(three.grads == Approx(two.grads).epsilon(0.01));
  CHECK(three.comm_buffers < two.comm_buffers);  // no copy of the part
  CHECK(three.total() < two.total());
}

TEST_CASE("memory model matches the engine on every rank of tp2 x pp2") {
  for (const ModelCase& k : kDense)
    check_every_rank(recipe_for(k), layout(2, 2, 1, 1, k));
  check_every_rank(recipe_for(kMoe[0]), layout(2, 2, 1, 1, kMoe[0]));
}

// Sequence parallel: the residual stream, the norms and their gradients hold N / tp rows; the
// scratch gains the gathered and partial [N, C] buffers. Every rank of tp2 and tp4 (dense and MoE,
// each recompute mode through the cases), with pp2 and with ZeRO-3 over dp2; the activations must
// come out smaller than without.
TEST_CASE("memory model matches the engine on every rank with sequence parallelism") {
  auto sp = [](planner::Variant v) {
    v.sequence_parallel = true;
    return v;
  };
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend();
  for (const ModelCase& k : kDense) {
    const recipe::Recipe r = recipe_for(k);
    check_every_rank(r, sp(layout(2, 1, 1, 1, k)));
    check_every_rank(r, sp(layout(2, 2, 1, 1, k)));
    const Measured with = engine_rank(r, sp(layout(2, 1, 1, 1, k)), 0, *cpu);
    const Measured without = engine_rank(r, layout(2, 1, 1, 1, k), 0, *cpu);
    INFO(r.name);
    CHECK(with.activations < without.activations);
  }
  check_every_rank(recipe_for(kDense[0]), sp(layout(4, 1, 1, 1, kDense[0])));
  check_every_rank(recipe_for(kDense[3]), sp(layout(2, 1, 2, 1, kDense[3], 3)));
  for (const ModelCase& k : kMoe)
    check_every_rank(recipe_for(k), sp(layout(2, 1, 1, 2, k)));
}

// Context parallel: each rank holds seq_len / cp tokens of every sequence (48 / 2 and 48 / 3) and
// the ring's blocks, accumulators and positions; with tp, pp, sequence parallelism, ZeRO-3, ep
// and MoE.
TEST_CASE("memory model matches the engine on every rank with context parallelism") {
  auto with_cp = [](planner::Variant v, int cp, bool sp = false) {
    v.cp = cp;
    v.sequence_parallel = sp;
    return v;
  };
  for (const ModelCase& k : kDense) {
    const recipe::Recipe r = recipe_for(k);
    check_every_rank(r, with_cp(layout(1, 1, 1, 1, k), 2));
    check_every_rank(r, with_cp(layout(1, 1, 1, 1, k), 3));
    check_every_rank(r, with_cp(layout(2, 2, 1, 1, k), 2, true));
  }
  check_every_rank(recipe_for(kDense[3]), with_cp(layout(1, 1, 2, 1, kDense[3], 3), 2));
  // MoE: the route covers the micro-batch (every cp rank's tokens), the expert buffers this
  // rank's, at most N rows per expert (4 experts: capacity 1.25 N, cut to N; 8: 0.625 N).
  for (const ModelCase& k : kMoe) {
    const recipe::Recipe r = recipe_for(k);
    check_every_rank(r, with_cp(layout(1, 1, 1, 1, k), 2));
    check_every_rank(r, with_cp(layout(2, 1, 1, 2, k), 2, true));
  }
  check_every_rank(recipe_for(kMoe[1]), with_cp(layout(1, 2, 1, 1, kMoe[1]), 3));
}

TEST_CASE("memory model matches the engine on every rank of ep2 and ep2 x tp2 MoE layouts") {
  for (const ModelCase& k : kMoe) {
    check_every_rank(recipe_for(k), layout(1, 1, 1, 2, k));
    check_every_rank(recipe_for(k), layout(2, 1, 1, 2, k));
  }
  check_every_rank(recipe_for(kMoe[0]), layout(1, 2, 1, 2, kMoe[0]));
}

TEST_CASE(
    "memory model: collective buffers of ZeRO-1, tied embeddings and the vocab-parallel loss") {
  const recipe::Recipe r = recipe_for(kDense[0]);  // gpt: tied embeddings, fp32
  const topology::ClusterSpec machine = planner::cpu_machine();
  const ModelCase& k = kDense[0];
  const double N = k.micro_batch * r.model.seq_len;
  const double wte = static_cast<double>(r.model.vocab) * r.model.hidden;

  // dp2 without ZeRO: the gradients are all-reduced in place.
  CHECK(planner::estimate_memory(r, machine, layout(1, 1, 2, 1, k)).comm_buffers == 0);
  // ZeRO-1 on a CPU: GradSync's reduced part plus Gloo's staging of every rank's copy of it.
  for (int dp_rank = 0; dp_rank < 2; ++dp_rank) {
    const planner::MemoryEstimate m =
        planner::estimate_rank_memory(r, machine, layout(1, 1, 2, 1, k, 1), {0, 0, 0, dp_rank, 0});
    const double part = m.optimizer / 8;  // fp32: two f32 moments per element
    CHECK(m.comm_buffers == part * 4 + part * 2 * 4);
  }
  // pp2 with tied embeddings: first and last stage keep the peer's wte gradient.
  for (int stage = 0; stage < 2; ++stage) {
    const planner::MemoryEstimate m =
        planner::estimate_rank_memory(r, machine, layout(1, 2, 1, 1, k), {0, 0, 0, 0, stage});
    CHECK(m.comm_buffers == wte * 4);
  }
  // Both (dp2 x pp2, ZeRO-1): the part and the peer gradient are separate buffers.
  for (int stage = 0; stage < 2; ++stage) {
    const planner::MemoryEstimate m =
        planner::estimate_rank_memory(r, machine, layout(1, 2, 2, 1, k, 1), {0, 0, 0, 0, stage});
    const double part = m.optimizer / 8;
    CHECK(m.comm_buffers == part * 4 + wte * 4 + part * 2 * 4);
  }
  // tp2: the last stage's host vectors of the vocab-parallel loss (an upper bound).
  const planner::MemoryEstimate tp =
      planner::estimate_rank_memory(r, machine, layout(2, 1, 1, 1, k), {});
  CHECK(tp.comm_buffers == N * (4 + 8 * (4 + 2) + 4));
}
