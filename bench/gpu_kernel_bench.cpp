// Per-op GPU speed at GPT-2 124M shapes (micro-batch B x seq 1024 tokens, hidden 768, 12 heads of
// 64, ffn 3072, vocab 50257, 124M parameters), bf16 storage as in training (G and A f32): each op
// of the CUDA backend timed with CUDA events (median of 7 groups after warm-up), and quoted against
// ceilings measured in the same run: memory-bound ops as GB/s over the device-to-device copy
// bandwidth (bytes = the fewest the op must move: every input read once, every output written
// once), GEMMs and attention as TFLOP/s over the bf16 GEMM rate of cuBLASLt at size^3.
//
//   gpu_kernel_bench [--micro-batch B] [--device D] [--nondeterministic] [--gemm-size S]
//                    [--filter TEXT]
//
// Inputs are random (never zeros). Ops whose data is smaller than 256 MB rotate through several
// input sets, so repeats do not run out of the 60 MB L2. Exit status 77 when there is no GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpu_bench_util.hpp"

namespace {

using namespace trainctl;
using backend::Allocation;
using tensor::DType;
using tensor::Tensor;

struct Options {
  int micro_batch = 16;
  int device = 0;
  bool deterministic = true;
  int64_t gemm_size = 8192;
  std::string filter;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--nondeterministic") {
      o.deterministic = false;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", flag));
    const std::string value = argv[++i];
    auto number = [&] {
      const int v = std::atoi(value.c_str());
      if (v < 1 && flag != "--device")
        throw std::invalid_argument(
            fmt::format("{} needs a positive integer, got '{}'", flag, value));
      return v;
    };
    if (flag == "--micro-batch")
      o.micro_batch = number();
    else if (flag == "--device")
      o.device = std::max(0, number());
    else if (flag == "--gemm-size")
      o.gemm_size = number();
    else if (flag == "--filter")
      o.filter = value;
    else
      throw std::invalid_argument(fmt::format(
          "unknown flag '{}' (known: --micro-batch --device --nondeterministic --gemm-size "
          "--filter)",
          flag));
  }
  return o;
}

// GPT-2 124M.
constexpr int64_t kSeq = 1024, kHidden = 768, kHeads = 12, kHeadDim = 64, kFfn = 3072,
                  kVocab = 50257;
constexpr int64_t kParams = 124'439'808;

// One benchmark case: `setup(set)` allocates and fills one input set and returns the work on it;
// bytes and flops are per call.
struct Case {
  std::string family, name;
  double bytes = 0, flops = 0;
  std::function<std::function<void()>(int set)> setup;
};

class Bench {
 public:
  Bench(backend::cuda::CudaBackend& be, const gpu_bench::Ceilings& ceilings)
      : be_(be), ceilings_(ceilings) {}

  // A random device tensor that lives until the current case ends.
  Tensor tensor(DType dtype, tensor::Shape shape, int64_t id_limit = 0) {
    allocations_.push_back(
        be_.allocate(static_cast<size_t>(shape.numel()) * tensor::dtype_size(dtype)));
    Tensor t = allocations_.back().view(dtype, shape);
    gpu_bench::fill_random(be_, t, ++seed_, id_limit);
    return t;
  }

  void run(const Case& c) {
    constexpr double kRotateBelow = 256e6;
    const int sets = c.bytes >= kRotateBelow
                         ? 1
                         : std::min(4, static_cast<int>(kRotateBelow / std::max(c.bytes, 1.0)) + 1);
    std::vector<std::function<void()>> work;
    for (int s = 0; s < sets; ++s)
      work.push_back(c.setup(s));
    const double ms = gpu_bench::median_ms(
        gpu_bench::stream_of(be_), [&](int call) { work[static_cast<size_t>(call % sets)](); });
    const double s = ms * 1e-3;
    std::string rate, share;
    if (c.flops > 0) {
      rate = fmt::format("{:.1f} TFLOP/s", c.flops / s / 1e12);
      share = fmt::format("{:.1f}% of GEMM", 100.0 * c.flops / s / ceilings_.gemm_flops);
    } else {
      rate = fmt::format("{:.0f} GB/s", c.bytes / s / 1e9);
      share = fmt::format("{:.1f}% of copy", 100.0 * c.bytes / s / ceilings_.copy_bytes_per_s);
    }
    fmt::print("| {} | {} | {:.3f} | {:.1f} | {} | {} |\n", c.family, c.name, ms, c.bytes / 1e6,
               rate, share);
    std::fflush(stdout);
    work.clear();
    allocations_.clear();
  }

 private:
  backend::cuda::CudaBackend& be_;
  gpu_bench::Ceilings ceilings_;
  std::vector<Allocation> allocations_;
  uint64_t seed_ = 100;
};

// Runs every case whose "family op" contains `filter` (all when empty), each as soon as it is
// declared, so the setups' references to this frame stay valid.
void run_cases(Bench& b, backend::Backend& be, int64_t B, const std::string& filter) {
  const int64_t N = B * kSeq, C = kHidden, F = kFfn, V = kVocab, P = kParams;
  const double nc = double(N) * C, nf = double(N) * F, nv = double(N) * V;
  constexpr DType S = DType::bf16, G = DType::f32, A = DType::f32;
  auto add = [&](std::string family, std::string name, double bytes, double flops,
                 std::function<std::function<void()>(int)> setup) {
    Case c{std::move(family), std::move(name), bytes, flops, std::move(setup)};
    if (filter.empty() || (c.family + " " + c.name).find(filter) != std::string::npos) b.run(c);
  };

  // ---- elementwise, reductions, optimizer over the whole parameter buffer or [N, C] ----
  add("cast", fmt::format("f32 -> bf16 [{}]", P), 6.0 * P, 0, [&, P](int) {
    Tensor dst = b.tensor(S, {P}), src = b.tensor(DType::f32, {P});
    return [&be, dst, src] { be.cast(dst, src); };
  });
  add("elementwise", fmt::format("add bf16 [{}, {}]", N, C), 6.0 * nc, 0, [&, N, C](int) {
    Tensor out = b.tensor(S, {N, C}), x = b.tensor(S, {N, C}), y = b.tensor(S, {N, C});
    return [&be, out, x, y] { be.add(out, x, y); };
  });
  add("elementwise", fmt::format("accumulate f32 += bf16 [{}]", P), 10.0 * P, 0, [&, P](int) {
    Tensor dst = b.tensor(G, {P}), src = b.tensor(S, {P});
    return [&be, dst, src] { be.accumulate(dst, src); };
  });
  add("elementwise", fmt::format("scale f32 [{}]", P), 8.0 * P, 0, [&, P](int) {
    Tensor dst = b.tensor(G, {P});
    // Alternating factors keep the values bounded over thousands of calls.
    return [&be, dst, flip = false]() mutable {
      be.scale(dst, flip ? 0.5 : 2.0);
      flip = !flip;
    };
  });
  add("reduction", fmt::format("sum_squares f32 [{}]", P), 4.0 * P, 0, [&, P](int) {
    Tensor src = b.tensor(G, {P});
    return [&be, src] { (void)be.sum_squares(src); };
  });
  add("reduction", fmt::format("all_finite f32 [{}]", P), 4.0 * P, 0, [&, P](int) {
    Tensor src = b.tensor(G, {P});
    return [&be, src] { (void)be.all_finite(src); };
  });
  add("reduction", fmt::format("bias_backward [{}, {}]", N, 3 * C), 2.0 * N * 3 * C, 0,
      [&, N, C](int) {
        Tensor dbias = b.tensor(G, {3 * C}), dout = b.tensor(S, {N, 3 * C});
        return [&be, dbias, dout] { be.bias_backward(dbias, dout); };
      });
  // Reads master, grad, m, v (f32); writes master, m, v (f32) and the bf16 param.
  add("adamw", fmt::format("bf16 param + f32 master [{}]", P), 30.0 * P, 0, [&, P](int) {
    Tensor param = b.tensor(S, {P}), master = b.tensor(DType::f32, {P}), grad = b.tensor(G, {P}),
           m = b.tensor(DType::f32, {P}), v = b.tensor(DType::f32, {P});
    be.fill(v, 1e-4);  // a second moment must be non-negative
    return [&be, param, master, grad, m, v, step = int64_t{0}]() mutable {
      be.adamw(param, master, grad, m, v, {1e-4, 0.9, 0.95, 1e-8, 0.1, 1.0, ++step});
    };
  });

  // ---- norms over [N, C] ----
  add("layernorm", fmt::format("forward [{}, {}]", N, C), 4.0 * nc + 8.0 * N, 0, [&, N, C](int) {
    Tensor out = b.tensor(S, {N, C}), mean = b.tensor(A, {N}), rstd = b.tensor(A, {N}),
           x = b.tensor(S, {N, C}), w = b.tensor(S, {C}), bias = b.tensor(S, {C});
    return [&be, out, mean, rstd, x, w, bias] {
      be.layernorm_forward(out, mean, rstd, x, w, bias, 1e-5);
    };
  });
  add("layernorm", fmt::format("backward [{}, {}]", N, C), 6.0 * nc + 8.0 * N, 0, [&, N, C](int) {
    Tensor out = b.tensor(S, {N, C}), mean = b.tensor(A, {N}), rstd = b.tensor(A, {N}),
           x = b.tensor(S, {N, C}), w = b.tensor(S, {C}), bias = b.tensor(S, {C}),
           dx = b.tensor(S, {N, C}), dw = b.tensor(G, {C}), db = b.tensor(G, {C}),
           dout = b.tensor(S, {N, C});
    be.layernorm_forward(out, mean, rstd, x, w, bias, 1e-5);
    return [&be, dx, dw, db, dout, x, w, mean, rstd] {
      be.layernorm_backward(dx, dw, db, dout, x, w, mean, rstd);
    };
  });
  add("rmsnorm", fmt::format("forward [{}, {}]", N, C), 4.0 * nc + 4.0 * N, 0, [&, N, C](int) {
    Tensor out = b.tensor(S, {N, C}), rstd = b.tensor(A, {N}), x = b.tensor(S, {N, C}),
           w = b.tensor(S, {C});
    return [&be, out, rstd, x, w] { be.rmsnorm_forward(out, rstd, x, w, 1e-5); };
  });
  add("rmsnorm", fmt::format("backward [{}, {}]", N, C), 6.0 * nc + 4.0 * N, 0, [&, N, C](int) {
    Tensor out = b.tensor(S, {N, C}), rstd = b.tensor(A, {N}), x = b.tensor(S, {N, C}),
           w = b.tensor(S, {C}), dx = b.tensor(S, {N, C}), dw = b.tensor(G, {C}),
           dout = b.tensor(S, {N, C});
    be.rmsnorm_forward(out, rstd, x, w, 1e-5);
    return [&be, dx, dw, dout, x, w, rstd] { be.rmsnorm_backward(dx, dw, dout, x, w, rstd); };
  });

  // ---- activations ----
  add("gelu", fmt::format("forward [{}, {}]", N, F), 4.0 * nf, 0, [&, N, F](int) {
    Tensor out = b.tensor(S, {N, F}), x = b.tensor(S, {N, F});
    return [&be, out, x] { be.gelu_forward(out, x); };
  });
  add("gelu", fmt::format("backward [{}, {}]", N, F), 6.0 * nf, 0, [&, N, F](int) {
    Tensor dx = b.tensor(S, {N, F}), dout = b.tensor(S, {N, F}), x = b.tensor(S, {N, F});
    return [&be, dx, dout, x] { be.gelu_backward(dx, dout, x); };
  });
  add("swiglu", fmt::format("forward [{}, 2x{}]", N, F), 6.0 * nf, 0, [&, N, F](int) {
    Tensor out = b.tensor(S, {N, F}), gate_up = b.tensor(S, {N, 2 * F});
    return [&be, out, gate_up] { be.swiglu_forward(out, gate_up); };
  });
  add("swiglu", fmt::format("backward [{}, 2x{}]", N, F), 10.0 * nf, 0, [&, N, F](int) {
    Tensor dgate_up = b.tensor(S, {N, 2 * F}), dout = b.tensor(S, {N, F}),
           gate_up = b.tensor(S, {N, 2 * F});
    return [&be, dgate_up, dout, gate_up] { be.swiglu_backward(dgate_up, dout, gate_up); };
  });
  add("rope", fmt::format("[{}, {}x{}]", N, kHeads, kHeadDim), 4.0 * nc, 0, [&, N, C](int) {
    Tensor out = b.tensor(S, {N, C}), x = b.tensor(S, {N, C});
    return [&be, out, x] { be.rope(out, x, kSeq, kHeads, kHeadDim, 10000.0, false); };
  });

  // ---- attention (causal: half of the T x T scores) ----
  const backend::AttentionShape shape{B, kSeq, kHeads, kHeads, kHeadDim};
  const double attention_fwd_flops = 4.0 * B * kHeads * double(kSeq) * kSeq * kHeadDim / 2;
  add("attention", fmt::format("forward B{} T{} H{} D{}", B, kSeq, kHeads, kHeadDim), 10.0 * nc,
      attention_fwd_flops, [&, N, C, shape](int) {
        Tensor out = b.tensor(S, {N, C}), lse = b.tensor(A, {B, kHeads, kSeq}),
               qkv = b.tensor(S, {N, 3 * C});
        return [&be, out, lse, qkv, shape] { be.attention_forward(out, lse, qkv, shape); };
      });
  // Backward: S = QK^T and dP = dO V^T recomputed/new, then dV, dQ, dK: 5 products to the
  // forward's 2, so 2.5x its FLOPs (the FlashAttention-2 paper's count).
  add("attention", fmt::format("backward B{} T{} H{} D{}", B, kSeq, kHeads, kHeadDim), 20.0 * nc,
      2.5 * attention_fwd_flops, [&, N, C, shape](int) {
        Tensor out = b.tensor(S, {N, C}), lse = b.tensor(A, {B, kHeads, kSeq}),
               qkv = b.tensor(S, {N, 3 * C}), dqkv = b.tensor(S, {N, 3 * C}),
               dout = b.tensor(S, {N, C});
        be.attention_forward(out, lse, qkv, shape);
        return [&be, dqkv, dout, qkv, out, lse, shape] {
          be.attention_backward(dqkv, dout, qkv, out, lse, shape);
        };
      });

  // ---- loss over [N, V] logits ----
  add("cross-entropy", fmt::format("forward [{}, {}]", N, V), 2.0 * nv + 12.0 * N, 0,
      [&, N, V](int) {
        Tensor losses = b.tensor(A, {N}), lse = b.tensor(A, {N}), logits = b.tensor(S, {N, V}),
               targets = b.tensor(DType::i32, {N}, V);
        return [&be, losses, lse, logits, targets] {
          be.cross_entropy_forward(losses, lse, logits, targets);
        };
      });
  add("cross-entropy", fmt::format("backward [{}, {}]", N, V), 4.0 * nv + 8.0 * N, 0,
      [&, N, V](int) {
        Tensor losses = b.tensor(A, {N}), lse = b.tensor(A, {N}), logits = b.tensor(S, {N, V}),
               targets = b.tensor(DType::i32, {N}, V), dlogits = b.tensor(S, {N, V});
        be.cross_entropy_forward(losses, lse, logits, targets);
        return [&be, dlogits, logits, lse, targets] {
          be.cross_entropy_backward(dlogits, logits, lse, targets, 1.0 / 16384);
        };
      });

  // ---- embedding ----
  add("embedding", fmt::format("forward [{}] -> [{}, {}]", N, N, C), 4.0 * nc, 0,
      [&, N, C, V](int) {
        Tensor out = b.tensor(S, {N, C}), tokens = b.tensor(DType::i32, {N}, V),
               wte = b.tensor(S, {V, C}), wpe = b.tensor(S, {kSeq, C});
        return [&be, out, tokens, wte, wpe] { be.embedding_forward(out, tokens, wte, wpe, kSeq); };
      });
  // The fewest bytes: dout once, each touched wte gradient row read and written (at most N
  // rows), wpe's gradient read and written.
  add("embedding", fmt::format("backward [{}, {}] -> wte [{}, {}]", N, C, V, C),
      2.0 * nc + 8.0 * double(std::min(N, V)) * C + 8.0 * kSeq * C, 0, [&, N, C, V](int) {
        Tensor dwte = b.tensor(G, {V, C}), dwpe = b.tensor(G, {kSeq, C}),
               dout = b.tensor(S, {N, C}), tokens = b.tensor(DType::i32, {N}, V);
        return [&be, dwte, dwpe, dout, tokens] {
          be.embedding_backward(dwte, dwpe, dout, tokens, kSeq);
        };
      });

  // ---- the GEMMs of one training step: per linear y = x W^T, dx = dy W, dW += dy^T x ----
  struct Linear {
    const char* name;
    int64_t in, out;
  };
  for (const Linear& l :
       {Linear{"qkv", C, 3 * C}, Linear{"attn proj", C, C}, Linear{"fc", C, 4 * C},
        Linear{"fc proj", 4 * C, C}, Linear{"lm head", C, V}}) {
    const double flops = 2.0 * double(N) * l.in * l.out;
    const int64_t in = l.in, out = l.out;
    add("gemm", fmt::format("{} fwd y=xW^T {}x{}x{}", l.name, N, out, in), 0, flops,
        [&, N, in, out](int) {
          backend::GemmArgs g;
          g.a = b.tensor(S, {N, in});
          g.b = b.tensor(S, {out, in});
          g.c = b.tensor(S, {N, out});
          g.trans_b = true;
          g.m = N, g.n = out, g.k = in;
          return [&be, g] { be.gemm(g); };
        });
    add("gemm", fmt::format("{} bwd dx=dyW {}x{}x{}", l.name, N, in, out), 0, flops,
        [&, N, in, out](int) {
          backend::GemmArgs g;
          g.a = b.tensor(S, {N, out});
          g.b = b.tensor(S, {out, in});
          g.c = b.tensor(S, {N, in});
          g.m = N, g.n = in, g.k = out;
          return [&be, g] { be.gemm(g); };
        });
    add("gemm", fmt::format("{} bwd dW+=dy^Tx {}x{}x{} (f32 C)", l.name, out, in, N), 0, flops,
        [&, N, in, out](int) {
          backend::GemmArgs g;
          g.a = b.tensor(S, {N, out});
          g.b = b.tensor(S, {N, in});
          g.c = b.tensor(G, {out, in});
          g.trans_a = true;
          g.m = out, g.n = in, g.k = N;
          g.beta = 1.0;
          // Keeps dW bounded over thousands of accumulating calls.
          g.alpha = 1e-6;
          return [&be, g] { be.gemm(g); };
        });
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (gpu_bench::no_gpu("gpu_kernel_bench", o.device)) return 77;
    backend::cuda::CudaBackend be({o.device, o.deterministic});
    const std::string gpu = gpu_bench::device_name(o.device);
    const gpu_bench::Ceilings ceilings = gpu_bench::measure_ceilings(be, o.gemm_size);
    fmt::print(
        "gpu_kernel_bench on {}: GPT-2 124M shapes, micro-batch {} x seq {} = {} tokens, bf16 "
        "storage, {} mode\nceilings measured now: device-to-device copy {:.0f} GB/s (read + "
        "write), bf16 GEMM {}^3 {:.0f} TFLOP/s, fp8 GEMM (e4m3 x e4m3 -> bf16, quantization "
        "included) {:.0f} TFLOP/s\n\n",
        gpu, o.micro_batch, kSeq, o.micro_batch * kSeq,
        o.deterministic ? "deterministic" : "non-deterministic", ceilings.copy_bytes_per_s / 1e9,
        ceilings.gemm_size, ceilings.gemm_flops / 1e12, ceilings.fp8_gemm_flops / 1e12);
    fmt::print("| family | op | ms | MB moved | rate | of ceiling |\n|---|---|---|---|---|---|\n");
    Bench bench(be, ceilings);
    run_cases(bench, be, o.micro_batch, o.filter);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_kernel_bench: %s\n", e.what());
    return 1;
  }
}
