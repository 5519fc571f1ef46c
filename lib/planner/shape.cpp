#include "planner/shape.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace trainctl::planner {

Sizes sizes_of(tensor::DType compute) {
  switch (compute) {
    case tensor::DType::f64:
      return {8, 8, 8, 8, 0};
    case tensor::DType::bf16:
    case tensor::DType::f16:
      return {2, 4, 4, 4, 4};
    default:  // f32 (the recipe offers no other compute type)
      break;
  }
  return {4, 4, 4, 4, 0};
}

ModelShape shape_of(const recipe::Recipe& r) {
  const recipe::ModelConfig& m = r.model;
  ModelShape s;
  s.C = m.hidden;
  s.T = m.seq_len;
  s.V = m.vocab;
  s.H = m.heads;
  s.KV = m.kv_heads;
  s.D = m.hidden / m.heads;
  s.W = (s.H + 2 * s.KV) * s.D;
  const bool swiglu = m.activation == recipe::Activation::swiglu;
  s.F = m.ffn_hidden;
  s.F1 = swiglu ? 2 * s.F : s.F;
  s.E = r.model.moe.experts;
  s.K = r.model.moe.top_k;
  s.EF = r.model.moe.expert_ffn_hidden > 0 ? r.model.moe.expert_ffn_hidden : m.ffn_hidden;
  s.EF1 = swiglu ? 2 * s.EF : s.EF;
  s.layers = m.layers;
  for (int i = 0; i < m.layers; ++i)
    s.moe_layers += r.model.is_moe_layer(i) ? 1 : 0;
  s.bias = m.bias;
  s.norm_bias = m.bias && m.norm == recipe::Norm::layernorm;
  s.rope = m.position == recipe::Position::rope;
  s.learned_positions = !s.rope;
  s.tied = m.tied_embeddings;
  s.capacity_factor = r.model.moe.capacity_factor;

  const int64_t C = s.C, b = s.bias ? 1 : 0;
  const int64_t norm = C * (s.norm_bias ? 2 : 1);
  s.wpe = s.learned_positions ? s.T * C : 0;
  s.embedding = s.V * C + s.wpe;
  s.attention_block = 2 * norm + s.W * C + b * s.W + C * s.H * s.D + b * C;
  s.dense_mlp = s.F1 * C + b * s.F1 + C * s.F + b * C;
  s.moe_shared = s.E * C;
  s.moe_experts = s.E * (s.EF1 * C + b * s.EF1 + C * s.EF + b * C);
  s.final_norm = norm;
  s.head = s.tied ? 0 : s.V * C;

  s.attention_linear_flops = 2.0 * C * s.W + 2.0 * s.H * s.D * C;
  s.attention_flops = s.attention_linear_flops + 4.0 * s.T * s.H * s.D;
  s.dense_mlp_flops = 2.0 * C * s.F1 + 2.0 * s.F * C;
  s.moe_expert_flops = s.K * (2.0 * C * s.EF1 + 2.0 * s.EF * C);
  s.moe_router_flops = 2.0 * C * s.E;
  s.moe_flops = s.moe_router_flops + s.moe_expert_flops;
  s.head_flops = 2.0 * C * s.V;
  return s;
}

int64_t ModelShape::total() const {
  const int dense_layers = layers - moe_layers;
  return embedding + layers * attention_block + dense_layers * dense_mlp +
         moe_layers * (moe_shared + moe_experts) + final_norm + head;
}

double ModelShape::forward_flops_per_token() const {
  const int dense_layers = layers - moe_layers;
  return layers * attention_flops + dense_layers * dense_mlp_flops + moe_layers * moe_flops +
         head_flops;
}

int64_t ModelShape::capacity(int64_t tokens) const {
  if (capacity_factor <= 0) return tokens;
  const double slots = capacity_factor * static_cast<double>(tokens * K) /
                       static_cast<double>(std::max<int64_t>(E, 1));
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(slots)));
}

const ScheduleOfShape& schedule_of(const PipelineShape& shape) {
  using Key = std::tuple<int, int, PipeSchedule, int>;
  thread_local std::map<Key, ScheduleOfShape> cache;
  const Key key{shape.stages, shape.micro_batches, shape.schedule, shape.virtual_stages};
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= 256) cache.clear();
    ScheduleOfShape built;
    built.lists = pipeline_lists(shape);
    for (int s = 0; s < shape.stages; ++s)
      built.slots.push_back(shape.schedule == PipeSchedule::interleaved
                                ? plan_slots(built.lists[static_cast<size_t>(s)]).slots
                                : schedule_slots(shape, s));  // the closed forms
    it = cache.emplace(key, std::move(built)).first;
  }
  return it->second;
}

int schedule_slots(const PipelineShape& shape, int stage) {
  if (shape.schedule == PipeSchedule::one_f_one_b) return pipeline_slots(shape, stage);
  if (shape.schedule == PipeSchedule::zb_h1) return std::min(shape.stages, shape.micro_batches);
  return schedule_of(shape).slots[static_cast<size_t>(stage)];
}

StageLayers stage_layers(const recipe::Recipe& r, int stage, int pp) {
  const std::vector<int>& given = r.parallel.pp_layers;
  const bool use_given = static_cast<int>(given.size()) == pp;
  auto count = [&](int s) {
    return use_given ? given[static_cast<size_t>(s)]
                     : r.model.layers / pp + (s < r.model.layers % pp ? 1 : 0);
  };
  StageLayers st;
  for (int s = 0; s < stage; ++s)
    st.first += count(s);
  st.count = count(stage);
  return st;
}

}  // namespace trainctl::planner
