// CPU training throughput: a GPT of hidden 768, 12 heads, 4 layers, seq 256 (GPT-2 small's width,
// a third of its depth) on synthetic tokens, trained by the real Trainer on the CPU backend, in
// fp32 and bf16. Prints tokens/s, ms/step, the share of the step spent in Backend::gemm and its
// GFLOP/s against a plain fp32 GEMM of the same shapes measured in the same run (the ceiling this
// machine's OpenBLAS reaches), then the per-op-family breakdown of each precision.
//
//   cpu_train_bench [--steps N] [--warmup N] [--micro-batch B] [--vocab V] [--precision
//   fp32|bf16|both]
//
// Defaults: 5 timed steps after 2 warm-up steps, micro-batch 4, vocab 50257 (GPT-2's; the LM head
// is then about half of all FLOPs), both precisions.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "backend/cpu/op_timing.hpp"
#include "data/sampler.hpp"
#include "data/sources.hpp"
#include "model/model.hpp"
#include "train/trainer.hpp"

namespace {

using namespace trainctl;
using backend::cpu::OpFamily;
using backend::cpu::OpStats;

struct Options {
  int steps = 5;
  int warmup = 2;
  int micro_batch = 4;
  int vocab = 50257;
  std::vector<tensor::DType> precisions{tensor::DType::f32, tensor::DType::bf16};
};

int positive(const std::string& flag, const char* text) {
  const int v = std::atoi(text);
  if (v < 1)
    throw std::invalid_argument(fmt::format("{} needs a positive integer, got '{}'", flag, text));
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", flag));
    const char* value = argv[++i];
    if (flag == "--steps")
      o.steps = positive(flag, value);
    else if (flag == "--warmup")
      o.warmup = positive(flag, value);
    else if (flag == "--micro-batch")
      o.micro_batch = positive(flag, value);
    else if (flag == "--vocab")
      o.vocab = positive(flag, value);
    else if (flag == "--precision") {
      const std::string p = value;
      if (p == "fp32")
        o.precisions = {tensor::DType::f32};
      else if (p == "bf16")
        o.precisions = {tensor::DType::bf16};
      else if (p == "both")
        o.precisions = {tensor::DType::f32, tensor::DType::bf16};
      else
        throw std::invalid_argument(fmt::format("--precision is fp32, bf16 or both, got '{}'", p));
    } else {
      throw std::invalid_argument(fmt::format(
          "unknown flag '{}' (known: --steps --warmup --micro-batch --vocab --precision)", flag));
    }
  }
  return o;
}

model::ModelConfig bench_model(const Options& o, tensor::DType storage) {
  model::ModelConfig c = model::gpt_preset();
  c.layers = 4;
  c.hidden = 768;
  c.heads = c.kv_heads = 12;
  c.ffn_hidden = 4 * 768;
  c.vocab = o.vocab;
  c.seq_len = 256;
  c.storage = storage;
  return c;
}

struct Result {
  std::string precision;
  double ms_per_step = 0, tokens_per_s = 0;
  OpStats stats;
};

Result run_training(const Options& o, tensor::DType storage) {
  const model::ModelConfig cfg = bench_model(o, storage);
  auto be = backend::make_cpu_backend();
  model::Transformer model(cfg, *be, o.micro_batch);
  model.params().initialize(1234);
  const int64_t tokens_needed = int64_t{o.micro_batch} * (cfg.seq_len + 1) * (o.steps + o.warmup);
  data::SyntheticSource source(42, cfg.vocab, tokens_needed * 2);
  data::Sampler sampler(source, cfg.seq_len, 42, false, cfg.vocab);
  train::TrainConfig tc;
  tc.steps = o.warmup + o.steps;
  tc.global_batch = tc.micro_batch = o.micro_batch;
  tc.optimizer.lr = 1e-4;
  tc.schedule.decay = train::DecayKind::constant;
  train::Trainer trainer(tc, model, *be, sampler, nullptr);
  for (int i = 0; i < o.warmup; ++i)
    trainer.step();
  backend::cpu::reset_op_stats(*be);
  backend::cpu::set_op_timing(*be, true);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.steps; ++i)
    trainer.step();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  Result r;
  r.precision = storage == tensor::DType::f32 ? "fp32" : "bf16";
  r.ms_per_step = ms / o.steps;
  r.tokens_per_s = 1000.0 * o.micro_batch * cfg.seq_len / r.ms_per_step;
  r.stats = backend::cpu::op_stats(*be);
  return r;
}

// The fp32 GEMMs of one training step of the dense layers and the head (forward y = x W^T,
// backward dx = dy W and dW += dy^T x), on random data: the achievable GEMM rate on this machine.
double sgemm_ceiling_gflops(const Options& o) {
  const model::ModelConfig cfg = bench_model(o, tensor::DType::f32);
  const int64_t N = int64_t{o.micro_batch} * cfg.seq_len, C = cfg.hidden;
  struct Shape {
    int64_t in, out;
  };
  const std::vector<Shape> linears{
      {C, 3 * C}, {C, C}, {C, cfg.ffn_hidden}, {cfg.ffn_hidden, C}, {C, cfg.vocab}};
  int64_t largest = 0;
  for (const Shape& s : linears)
    largest = std::max({largest, N * s.in, N * s.out, s.in * s.out});
  auto be = backend::make_cpu_backend();
  std::vector<backend::Allocation> buffers;
  std::vector<tensor::Tensor> t;
  for (int i = 0; i < 3; ++i) {
    buffers.push_back(be->allocate(static_cast<size_t>(largest) * sizeof(float)));
    t.push_back(buffers.back().view(tensor::DType::f32, {largest}));
    float* p = t.back().as<float>();
    for (int64_t j = 0; j < largest; ++j)
      p[j] = static_cast<float>((j * 2654435761u + i) % 1000) / 1000.0f - 0.5f;
  }
  // gemm(trans_a, trans_b, m, n, k, beta) on the three buffers.
  auto gemm = [&](bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double beta) {
    backend::GemmArgs g;
    g.a = t[0];
    g.b = t[1];
    g.c = t[2];
    g.trans_a = trans_a;
    g.trans_b = trans_b;
    g.m = m;
    g.n = n;
    g.k = k;
    g.beta = beta;
    be->gemm(g);
  };
  auto pass = [&] {
    for (const Shape& s : linears) {
      gemm(false, true, N, s.out, s.in, 0.0);   // y = x W^T
      gemm(false, false, N, s.in, s.out, 0.0);  // dx = dy W
      gemm(true, false, s.out, s.in, N, 1.0);   // dW += dy^T x
    }
  };
  pass();  // warm-up
  backend::cpu::set_op_timing(*be, true);
  for (int i = 0; i < 2; ++i)
    pass();
  const OpStats s = backend::cpu::op_stats(*be);
  return s.gemm_flops / static_cast<double>(s.ns[static_cast<int>(OpFamily::gemm)]);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const char* blas_threads = std::getenv("OPENBLAS_NUM_THREADS");
    fmt::print(
        "cpu_train_bench: GPT 4 layers, hidden 768, 12 heads, ffn 3072, seq 256, vocab {}, "
        "micro-batch {} ({} tokens/step), {} warm-up + {} timed steps, "
        "OPENBLAS_NUM_THREADS={}\n\n",
        o.vocab, o.micro_batch, o.micro_batch * 256, o.warmup, o.steps,
        blas_threads ? blas_threads : "(unset)");
    std::vector<Result> results;
    for (tensor::DType p : o.precisions)
      results.push_back(run_training(o, p));
    const double ceiling = sgemm_ceiling_gflops(o);
    fmt::print(
        "| precision | tokens/s | ms/step | GEMM ms/step | GEMM share | GEMM GFLOP/s | "
        "sgemm ceiling GFLOP/s |\n|---|---|---|---|---|---|---|\n");
    for (const Result& r : results) {
      const double gemm_ns = static_cast<double>(r.stats.ns[static_cast<int>(OpFamily::gemm)]);
      fmt::print("| {} | {:.0f} | {:.1f} | {:.1f} | {:.1f}% | {:.1f} | {:.1f} |\n", r.precision,
                 r.tokens_per_s, r.ms_per_step, gemm_ns / 1e6 / o.steps,
                 100.0 * gemm_ns / 1e6 / o.steps / r.ms_per_step, r.stats.gemm_flops / gemm_ns,
                 ceiling);
    }
    for (const Result& r : results)
      fmt::print("\n{} per-op breakdown (per step):\n{}", r.precision,
                 backend::cpu::format_op_stats(r.stats, o.steps, "step"));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpu_train_bench: %s\n", e.what());
    return 1;
  }
}
