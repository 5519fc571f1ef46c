// GPU training throughput: the real Trainer (forward, backward, grad-norm clip, AdamW on fp32
// master weights) on the CUDA backend, bf16 storage, synthetic tokens. Prints tokens/s, ms/step
// and MFU against (a) the datasheet dense bf16 peak of the GPU and (b) the bf16 GEMM rate of
// cuBLASLt measured in the same run, with model FLOPs = 3 x forward_flops_per_token per token
// (forward + backward; recompute is off, so no extra forward is counted or done).
//
//   gpu_train_bench [--model gpt2|llama1b] [--steps N] [--warmup N] [--micro-batch B]
//                   [--device D] [--nondeterministic] [--gemm-size S] [--fp8 hybrid|e4m3]
//
// gpt2: GPT-2 124M (llm.c's settings: 12 layers, hidden 768, 12 heads, seq 1024, vocab 50257, tied
// head), default micro-batch 16. llama1b: 16 layers, hidden 2048, 16 heads (8 kv), ffn 5632, seq
// 2048, vocab 32000, untied (about 1.1B parameters), default micro-batch 4. Defaults: 3 warm-up and
// 10 timed steps. Exit status 77 when there is no GPU.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "data/sampler.hpp"
#include "data/sources.hpp"
#include "gpu_bench_util.hpp"
#include "model/model.hpp"
#include "train/trainer.hpp"

namespace {

using namespace trainctl;

struct Options {
  std::string model = "gpt2";
  int steps = 10;
  int warmup = 3;
  int micro_batch = 0;  // 0: the model's default
  int device = 0;
  bool deterministic = true;
  int64_t gemm_size = 8192;
  model::Fp8Mode fp8 = model::Fp8Mode::none;  // --fp8 hybrid|e4m3: the blocks' linear layers
};

std::string_view fp8_name(model::Fp8Mode mode) {
  switch (mode) {
    case model::Fp8Mode::e4m3:
      return "e4m3";
    case model::Fp8Mode::hybrid:
      return "hybrid";
    default:
      return "none";
  }
}

int non_negative(const std::string& flag, const char* text) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < 0)
    throw std::invalid_argument(
        fmt::format("{} needs a non-negative integer, got '{}'", flag, text));
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--nondeterministic") {
      o.deterministic = false;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", flag));
    const char* value = argv[++i];
    if (flag == "--model") {
      o.model = value;
      if (o.model != "gpt2" && o.model != "llama1b")
        throw std::invalid_argument(fmt::format("--model is gpt2 or llama1b, got '{}'", o.model));
    } else if (flag == "--steps") {
      o.steps = std::max(1, non_negative(flag, value));
    } else if (flag == "--warmup") {
      o.warmup = non_negative(flag, value);
    } else if (flag == "--micro-batch") {
      o.micro_batch = non_negative(flag, value);
    } else if (flag == "--device") {
      o.device = non_negative(flag, value);
    } else if (flag == "--fp8") {
      const std::string mode = value;
      if (mode == "hybrid") {
        o.fp8 = model::Fp8Mode::hybrid;
      } else if (mode == "e4m3") {
        o.fp8 = model::Fp8Mode::e4m3;
      } else if (mode == "none") {
        o.fp8 = model::Fp8Mode::none;
      } else {
        throw std::invalid_argument(fmt::format("--fp8 is hybrid, e4m3 or none, got '{}'", mode));
      }
    } else if (flag == "--gemm-size") {
      o.gemm_size = std::max(256, non_negative(flag, value));
    } else {
      throw std::invalid_argument(
          fmt::format("unknown flag '{}' (known: --model --steps --warmup --micro-batch --device "
                      "--nondeterministic --gemm-size --fp8)",
                      flag));
    }
  }
  if (o.micro_batch == 0) o.micro_batch = o.model == "gpt2" ? 16 : 4;
  return o;
}

model::ModelConfig bench_model(const std::string& name, model::Fp8Mode fp8) {
  model::ModelConfig c;
  if (name == "gpt2") {
    c = model::gpt_preset();
    c.layers = 12;
    c.hidden = 768;
    c.heads = c.kv_heads = 12;
    c.ffn_hidden = 4 * 768;
    c.vocab = 50257;
    c.seq_len = 1024;
  } else {
    c = model::llama_preset();
    c.layers = 16;
    c.hidden = 2048;
    c.heads = 16;
    c.kv_heads = 8;
    c.ffn_hidden = 5632;
    c.vocab = 32000;
    c.seq_len = 2048;
  }
  c.storage = tensor::DType::bf16;
  c.fp8 = fp8;
  c.check();
  return c;
}

struct Result {
  double ms_per_step = 0, tokens_per_s = 0, model_flops_per_s = 0, last_loss = 0;
  double params = 0;
};

Result run_training(const Options& o, backend::cuda::CudaBackend& be) {
  const model::ModelConfig cfg = bench_model(o.model, o.fp8);
  model::Transformer model(cfg, be, o.micro_batch);
  model.params().initialize(1234);
  const int total_steps = o.warmup + o.steps;
  const int64_t tokens_needed = int64_t{o.micro_batch} * (cfg.seq_len + 1) * total_steps;
  data::SyntheticSource source(42, cfg.vocab, tokens_needed * 2);
  data::Sampler sampler(source, cfg.seq_len, 42, false, cfg.vocab);
  train::TrainConfig tc;
  tc.steps = total_steps;
  tc.global_batch = tc.micro_batch = o.micro_batch;
  tc.optimizer.lr = 1e-4;
  tc.schedule.decay = train::DecayKind::constant;
  train::Trainer trainer(tc, model, be, sampler, nullptr);
  for (int i = 0; i < o.warmup; ++i)
    trainer.step();
  const cudaStream_t stream = gpu_bench::stream_of(be);
  cudaEvent_t start = nullptr, stop = nullptr;
  gpu_bench::check(cudaEventCreate(&start), "cudaEventCreate");
  gpu_bench::check(cudaEventCreate(&stop), "cudaEventCreate");
  gpu_bench::check(cudaEventRecord(start, stream), "cudaEventRecord");
  Result r;
  for (int i = 0; i < o.steps; ++i)
    r.last_loss = trainer.step().loss;
  gpu_bench::check(cudaEventRecord(stop, stream), "cudaEventRecord");
  gpu_bench::check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  gpu_bench::check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  const double tokens_per_step = double(o.micro_batch) * cfg.seq_len;
  r.ms_per_step = ms / o.steps;
  r.tokens_per_s = 1000.0 * tokens_per_step / r.ms_per_step;
  r.model_flops_per_s = 3.0 * model.forward_flops_per_token() * r.tokens_per_s;
  r.params = static_cast<double>(model.params().table().numel());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (gpu_bench::no_gpu("gpu_train_bench", o.device)) return 77;
    backend::cuda::CudaBackend be({o.device, o.deterministic});
    const std::string gpu = gpu_bench::device_name(o.device);
    const model::ModelConfig cfg = bench_model(o.model, o.fp8);
    fmt::print(
        "gpu_train_bench: {} on {}: {}; bf16 storage, fp8 GEMMs {}, fp32 master weights and "
        "AdamW; micro-batch {} ({} tokens/step), {} warm-up + {} timed steps, {} mode\n",
        o.model, gpu, model::describe(cfg), fp8_name(o.fp8), o.micro_batch,
        o.micro_batch * cfg.seq_len, o.warmup, o.steps,
        o.deterministic ? "deterministic" : "non-deterministic");
    const Result r = run_training(o, be);
    const double gemm = gpu_bench::measure_gemm_flops(be, o.gemm_size);
    const double fp8_gemm = gpu_bench::measure_gemm_flops(be, o.gemm_size, true);
    const double peak = gpu_bench::datasheet_bf16_flops(gpu);
    fmt::print(
        "\n| impl | model | fp8 | params | micro-batch x seq | tokens/s | ms/step | model TFLOP/s "
        "| MFU "
        "(datasheet {}) | MFU (measured GEMM {:.0f} TFLOP/s) | MFU (measured fp8 GEMM {:.0f} "
        "TFLOP/s) | last loss |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        peak > 0 ? fmt::format("{:.0f} TFLOP/s", peak / 1e12) : std::string("unknown"), gemm / 1e12,
        fp8_gemm / 1e12);
    fmt::print(
        "| trainctl | {} | {} | {:.1f}M | {} x {} | {:.0f} | {:.2f} | {:.1f} | {} | {:.1f}% | "
        "{:.1f}% | {:.4f} |\n",
        o.model, fp8_name(o.fp8), r.params / 1e6, o.micro_batch, cfg.seq_len, r.tokens_per_s,
        r.ms_per_step, r.model_flops_per_s / 1e12,
        peak > 0 ? fmt::format("{:.1f}%", 100.0 * r.model_flops_per_s / peak) : std::string("n/a"),
        100.0 * r.model_flops_per_s / gemm, 100.0 * r.model_flops_per_s / fp8_gemm, r.last_loss);
    fmt::print(
        "(GEMM ceilings: {0}x{0}x{0} through Backend::gemm on random data: bf16, and e4m3 x e4m3 "
        "-> bf16 with the per-call quantization included)\n",
        o.gemm_size);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_train_bench: %s\n", e.what());
    return 1;
  }
}
