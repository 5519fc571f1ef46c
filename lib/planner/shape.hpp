// Internal to lib/planner: the numbers of a recipe's model the memory and time models share --
// parameter counts by part (as lib/model/params.cpp builds_param_table lays them out), byte sizes
// by precision (as lib/model and lib/backend choose dtypes), and forward FLOPs per token (as
// Transformer::forward_flops_per_token counts them).
#pragma once

#include <string>

#include <cstdint>

#include "layout/pipeline.hpp"
#include "recipe/recipe.hpp"

namespace trainctl::planner {

// Element sizes of one precision setting: storage S (params, activations), stats A (norm and
// softmax statistics, f32 unless fp64), grads G and optimizer moments (f32 unless fp64), and the
// f32 master copy kept only for bf16/fp16.
struct Sizes {
  double storage = 4, stats = 4, grad = 4, moment = 4, master = 0;
};
Sizes sizes_of(tensor::DType compute);

struct ModelShape {
  int64_t C = 0, T = 0, V = 0, H = 0, KV = 0, D = 0, W = 0;  // W: qkv rows (H + 2 KV) * D
  int64_t F = 0, F1 = 0;                                     // dense MLP: ffn, fc1 rows
  int64_t E = 0, K = 0, EF = 0, EF1 = 0;                     // experts, top_k, expert ffn/fc1 rows
  int layers = 0, moe_layers = 0;
  bool bias = false, norm_bias = false, rope = false, tied = false, learned_positions = false;
  double capacity_factor = 0;

  // Parameter counts (elements).
  int64_t embedding = 0;        // wte (+ wpe)
  int64_t wpe = 0;              // learned positions: replicated under tp
  int64_t attention_block = 0;  // two norms, qkv, proj (per layer)
  int64_t dense_mlp = 0;        // per dense layer
  int64_t moe_shared = 0;       // router (per MoE layer)
  int64_t moe_experts = 0;      // all experts of one MoE layer (fc1 + fc2, biases)
  int64_t final_norm = 0;
  int64_t head = 0;  // untied lm_head (0 when tied)
  int64_t total() const;

  // Forward FLOPs per token (matmuls, attention non-causal 4*T*H*D, MoE: top_k experts).
  double attention_flops = 0;   // per layer: qkv, proj, scores and values
  double dense_mlp_flops = 0;   // per dense layer
  double moe_flops = 0;         // per MoE layer: router + top_k experts
  double moe_router_flops = 0;  // of which the router: 2 C E
  // The parts of the above that are linear layers (fp8-eligible): qkv and proj; the experts.
  double attention_linear_flops = 0;
  double moe_expert_flops = 0;
  double head_flops = 0;  // 2 C V
  double forward_flops_per_token() const;
  // Slots per expert for `tokens` routed tokens (lib/model Moe::capacity).
  int64_t capacity(int64_t tokens) const;
};
ModelShape shape_of(const recipe::Recipe& recipe);

// model::stage_ranges for the planner: the first layer and the layer count of pipeline stage
// `stage` of `pp` (recipe.parallel.pp_layers when it has one entry per stage, else as even as
// possible with the earlier stages taking the remainder).
struct StageLayers {
  int first = 0, count = 0;
};
StageLayers stage_layers(const recipe::Recipe& recipe, int stage, int pp);

// The action lists of a pipeline and each stage's activation slots (plan_slots): the search
// scores many layouts with the same pipeline shape, so they are built once per shape (per
// thread). The reference stays valid until the next call.
struct ScheduleOfShape {
  std::vector<std::vector<PipeAction>> lists;
  std::vector<int> slots;
};
const ScheduleOfShape& schedule_of(const PipelineShape& shape);
// The activation slots of stage `stage` (schedule_of(shape).slots[stage]) without building the
// lists where the schedule has a closed form (pipeline.hpp): 1F1B min(P - s, M), ZB-H1 min(P, M)
// on every stage (a slot held from the forward to the W). The memory model asks for every
// variant, most of which are never simulated; planner_zb_h1_test holds ZB-H1's to plan_slots.
// The shape must run (PipelineShape::problem empty).
int schedule_slots(const PipelineShape& shape, int stage);

// A duration for people: "12.3 us", "4.5 ms", "1.23 s".
std::string seconds(double s);

}  // namespace trainctl::planner
