// The planner's memory model against the engine it models: for single-rank layouts of small gpt,
// llama and MoE models in every precision and recompute mode, the predicted bytes per category
// must equal what lib/model allocates (ParamStore::bytes, Transformer::activation_bytes).
// Multi-rank layouts: planner_multirank_memory_test.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>

#include "backend/backend.hpp"
#include "model/model.hpp"
#include "planner/planner.hpp"

namespace {

using namespace trainctl;

struct Case {
  const char* name;
  recipe::Arch arch;
  int experts;
  tensor::DType compute;
  trainctl::Recompute recompute;
  int micro_batch;
  int global_batch;  // global_batch / micro_batch micro-batches: only one is in flight at pp = 1
};

recipe::Recipe recipe_for(const Case& k) {
  recipe::Recipe r = recipe::default_recipe(k.arch);
  r.name = k.name;
  r.model.layers = 4;
  r.model.hidden = 64;
  r.model.heads = 4;
  r.model.kv_heads = k.arch == recipe::Arch::llama ? 2 : 4;
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

double relative_error(double predicted, double measured) {
  return std::abs(predicted - measured) / measured;
}

}  // namespace

TEST_CASE("memory model reproduces the engine's bytes for single-rank layouts") {
  using recipe::Arch;
  using Compute = tensor::DType;
  using trainctl::Recompute;
  const Case cases[] = {
      {"gpt fp32 none mb1", Arch::gpt, 0, Compute::f32, Recompute::none, 1, 4},
      {"gpt bf16 selective mb2", Arch::gpt, 0, Compute::bf16, Recompute::selective, 2, 8},
      {"gpt fp16 full mb4", Arch::gpt, 0, Compute::f16, Recompute::full, 4, 8},
      {"llama fp32 selective mb3", Arch::llama, 0, Compute::f32, Recompute::selective, 3, 6},
      {"llama bf16 none mb2", Arch::llama, 0, Compute::bf16, Recompute::none, 2, 2},
      {"llama fp16 full mb1", Arch::llama, 0, Compute::f16, Recompute::full, 1, 4},
      {"moe gpt fp32 none mb2", Arch::gpt, 4, Compute::f32, Recompute::none, 2, 4},
      {"moe llama bf16 full mb2", Arch::llama, 8, Compute::bf16, Recompute::full, 2, 4},
      {"moe llama fp16 selective mb1", Arch::llama, 4, Compute::f16, Recompute::selective, 1, 2},
      {"gpt fp64 none mb1", Arch::gpt, 0, Compute::f64, Recompute::none, 1, 1},
  };
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend();
  const topology::ClusterSpec machine = planner::cpu_machine();
  std::printf("%-30s %12s %12s %12s %12s %12s %12s\n", "case", "params", "grads", "optimizer",
              "act.pred", "act.engine", "act.err");
  for (const Case& k : cases) {
    INFO(k.name);
    const recipe::Recipe r = recipe_for(k);
    planner::Variant layout{1, 1, 1, 1, k.micro_batch, 0, k.recompute};
    model::ModelParallel one_rank;
    one_rank.layout = layout;  // the recompute mode
    model::Transformer engine(r.model, *cpu, k.micro_batch, one_rank);
    const planner::MemoryEstimate predicted = planner::estimate_memory(r, machine, layout);
    const model::ParamStore::Bytes measured = engine.params().bytes();
    const double activations = static_cast<double>(engine.activation_bytes().total());
    std::printf("%-30s %12.0f %12.0f %12.0f %12.0f %12.0f %11.2f%%\n", k.name, predicted.params,
                predicted.grads, predicted.optimizer, predicted.activations, activations,
                100 * relative_error(predicted.activations, activations));
    CHECK(predicted.params == static_cast<double>(measured.params));
    CHECK(predicted.grads == static_cast<double>(measured.grads));
    CHECK(predicted.optimizer == static_cast<double>(measured.optimizer));
    CHECK(predicted.activations == activations);
    CHECK(predicted.in_flight == 1);
    CHECK(predicted.overhead == 0);  // a CPU machine has no CUDA context
    CHECK(predicted.comm_buffers == 0);
  }
}

TEST_CASE("memory model: recompute modes order, micro-batch scaling and sharding") {
  recipe::Recipe r = recipe::default_recipe(recipe::Arch::gpt);
  r.model.layers = 8;
  r.model.hidden = 256;
  r.model.heads = 8;
  r.model.kv_heads = 8;
  r.model.ffn_hidden = 1024;
  r.model.vocab = 512;
  r.model.seq_len = 256;
  r.training.global_batch = 64;
  const topology::ClusterSpec machine = planner::cpu_machine();
  auto act = [&](trainctl::Recompute mode, int mb) {
    return planner::estimate_memory(r, machine, {1, 1, 1, 1, mb, 0, mode}).activations_kept;
  };
  CHECK(act(trainctl::Recompute::full, 1) < act(trainctl::Recompute::selective, 1));
  CHECK(act(trainctl::Recompute::selective, 1) < act(trainctl::Recompute::none, 1));
  CHECK(act(trainctl::Recompute::none, 4) ==
        Approx(4 * act(trainctl::Recompute::none, 1)).epsilon(0.01));

  // ZeRO-1 over 8 replicas divides the optimizer state by 8 and leaves params and grads alone.
  // Parts are cut at row boundaries and the largest is reported: at most one row (the longest
  // is an fc2 row of ffn_hidden elements) above an eighth.
  const planner::MemoryEstimate plain = planner::estimate_memory(r, machine, {1, 1, 8, 1, 1, 0});
  const planner::MemoryEstimate zero = planner::estimate_memory(r, machine, {1, 1, 8, 1, 1, 1});
  const double per_element = plain.optimizer / (plain.grads / 4);  // grads are f32
  CHECK(zero.optimizer >= plain.optimizer / 8);
  CHECK(zero.optimizer <= plain.optimizer / 8 + per_element * r.model.ffn_hidden);
  CHECK(zero.params == plain.params);
  CHECK(zero.grads == plain.grads);

  // pp = 4 under 1F1B: the first stage holds 4 micro-batches of 2 layers in flight.
  const planner::MemoryEstimate piped = planner::estimate_memory(r, machine, {1, 4, 1, 1, 1, 0});
  CHECK(piped.worst_stage == 0);
  CHECK(piped.in_flight == 4);
  CHECK(piped.params < plain.params / 2);
  // tp = 4 shards the per-layer matrices (norms and row-parallel biases stay whole).
  const planner::MemoryEstimate split = planner::estimate_memory(r, machine, {4, 1, 1, 1, 1, 0});
  CHECK(split.params < plain.params / 3.5);
  CHECK(split.params > plain.params / 4);
}
