// What the planner tests share: an 8-GPU H100 node's figures and a Llama 7B-shaped recipe.
#pragma once

#include "recipe/recipe.hpp"
#include "topology/topology.hpp"

namespace planner_fixtures {

inline trainctl::topology::ClusterSpec h100(int nodes) {
  trainctl::topology::ClusterSpec c;
  c.name = "dgx-h100";
  c.source = "test";
  c.gpu.name = "NVIDIA H100 80GB HBM3";
  c.gpu.memory_gib = 80;
  c.gpu.peak_tflops_fp32 = 67;
  c.gpu.peak_tflops_bf16 = 989;
  c.gpu.peak_tflops_fp16 = 989;
  c.nodes = nodes;
  c.gpus_per_node = 8;
  c.nvlink_domain = 8;
  c.nvlink_gbps = 450;
  c.inter_node_gbps = 50;
  c.nvlink_latency_us = 5;
  c.inter_node_latency_us = 10;
  return c;
}

inline trainctl::recipe::Recipe llama_7b() {
  trainctl::recipe::Recipe r = trainctl::recipe::default_recipe(trainctl::recipe::Arch::llama);
  r.name = "llama-7b";
  r.model.layers = 32;
  r.model.hidden = 4096;
  r.model.heads = 32;
  r.model.kv_heads = 32;
  r.model.ffn_hidden = 11008;
  r.model.vocab = 32000;
  r.model.seq_len = 4096;
  r.model.storage = trainctl::tensor::DType::bf16;
  r.training.global_batch = 512;
  r.training.micro_batch = 1;
  return r;
}

}  // namespace planner_fixtures
