// The CUDA backend's memory, elementwise, reduction, optimizer and GEMM ops against the CPU
// backend (tests/gpu/gpu_compare.hpp), on fresh random inputs with poisoned outputs, at odd
// sizes and at misaligned (sliced) offsets, for f32, bf16 and f16.
//
// What "agree" means per op (see lib/backend/cuda/elementwise.cpp, adamw.cpp and gemm.cpp for why):
//   cast, fill, add, accumulate, scale, adamw: identical bits (same fp32 arithmetic, one
//     rounding per stored value, no FMA contraction on either side);
//   sum, sum_squares: within 1e-12 of sum |x| (both accumulate in double, in different orders);
//   gemm, bias_backward: the dtype tolerance of gpu_compare.hpp (different summation orders).
// Determinism: the same op twice on the same inputs gives identical bits.
// The GEMM and bias_backward shapes are the gpu rows of the shared case table
// (tests/unit/backend_op_cases.hpp), which the CPU reference suite iterates too.
#include <cuda_runtime.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "backend_op_cases.hpp"
#include "gpu_compare.hpp"
#include "tensor/rng.hpp"
#include "tensor/stochastic_round.hpp"

using gpu_compare::enqueue_long_work;
using gpu_compare::Harness;
using gpu_compare::kGpuFloatTypes;
using gpu_compare::Twin;
using trainctl::backend::Backend;
using trainctl::backend::GemmArgs;
using trainctl::tensor::DType;
using trainctl::tensor::dtype_name;

namespace {

// Sizes around the 8-element vector step and the grid-stride boundaries.
const int64_t kSizes[] = {1, 7, 8, 33, 4101, 100003};
// Element offsets: 0 takes the vector path, 1 and 3 the scalar path of a sliced tensor.
const int64_t kOffsets[] = {0, 1, 3};

std::string name_of(DType dtype) {
  return std::string(dtype_name(dtype));
}

}  // namespace

TEST_CASE("cuda backend allocates zero-filled memory and copies round-trip") {
  Harness h;
  for (const int64_t n : {int64_t{1}, int64_t{13}, int64_t{1} << 20}) {
    Twin t = h.output(DType::f32, {n});
    for (const double v : h.values(t.gpu))
      REQUIRE(v == 0.0);
    h.fill_random(t);
    GPU_EXPECT_IDENTICAL(h, t, "round trip of " << n << " floats");
  }
  CHECK(h.gpu().name() == "cuda");
  CHECK(h.gpu().capabilities().supports(DType::bf16));
  CHECK_FALSE(h.gpu().capabilities().supports(DType::f64));
}

TEST_CASE("cuda cast matches the CPU bit for bit for every pair of dtypes") {
  Harness h;
  for (const DType from : kGpuFloatTypes) {
    for (const DType to : kGpuFloatTypes) {
      for (const int64_t n : kSizes) {
        for (const int64_t offset : kOffsets) {
          // Wide magnitudes: bf16/f16 overflow, subnormals and rounding ties all occur.
          Twin src = h.random(from, {n}, offset, 1e-8, 7e4);
          Twin dst = h.output(to, {n}, offset == 0 ? 0 : offset + 1);
          h.poison(dst);
          h.cpu().cast(dst.cpu, src.cpu);
          h.gpu().cast(dst.gpu, src.gpu);
          GPU_EXPECT_IDENTICAL(
              h, dst,
              name_of(from) << " -> " << name_of(to) << ", n " << n << ", offset " << offset);
        }
      }
    }
  }
}

TEST_CASE("cuda fill rounds the value as the CPU does") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes) {
    for (const double value : {0.1, -3.7, 1e-30, 1e30, 65519.0}) {
      for (const int64_t offset : kOffsets) {
        Twin t = h.output(dtype, {4101}, offset);
        h.poison(t);
        h.cpu().fill(t.cpu, value);
        h.gpu().fill(t.gpu, value);
        GPU_EXPECT_IDENTICAL(h, t, "fill " << name_of(dtype) << " with " << value);
      }
    }
  }
}

TEST_CASE("cuda add matches the CPU bit for bit for every dtype combination") {
  Harness h;
  for (const DType out_type : kGpuFloatTypes) {
    for (const DType a_type : kGpuFloatTypes) {
      for (const DType b_type : kGpuFloatTypes) {
        for (const int64_t n : {int64_t{7}, int64_t{4101}, int64_t{100003}}) {
          for (const int64_t offset : {int64_t{0}, int64_t{3}}) {
            Twin a = h.random(a_type, {n}, offset);
            Twin b = h.random(b_type, {n});
            Twin out = h.output(out_type, {n}, offset);
            h.poison(out);
            h.cpu().add(out.cpu, a.cpu, b.cpu);
            h.gpu().add(out.gpu, a.gpu, b.gpu);
            GPU_EXPECT_IDENTICAL(h, out,
                                 name_of(out_type)
                                     << " = " << name_of(a_type) << " + " << name_of(b_type)
                                     << ", n " << n << ", offset " << offset);
          }
        }
      }
    }
  }
}

TEST_CASE("cuda add works in place (out is a)") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes) {
    Twin a = h.random(dtype, {100003});
    Twin b = h.random(dtype, {100003});
    h.cpu().add(a.cpu, a.cpu, b.cpu);
    h.gpu().add(a.gpu, a.gpu, b.gpu);
    GPU_EXPECT_IDENTICAL(h, a, "in-place add " << name_of(dtype));
  }
}

TEST_CASE("cuda accumulate matches the CPU bit for bit") {
  Harness h;
  for (const DType dst_type : kGpuFloatTypes) {
    for (const DType src_type : kGpuFloatTypes) {
      for (const int64_t n : kSizes) {
        for (const int64_t offset : kOffsets) {
          Twin dst = h.random(dst_type, {n}, offset);
          Twin src = h.random(src_type, {n}, offset == 0 ? 0 : 2);
          h.cpu().accumulate(dst.cpu, src.cpu);
          h.gpu().accumulate(dst.gpu, src.gpu);
          GPU_EXPECT_IDENTICAL(h, dst,
                               name_of(dst_type) << " += " << name_of(src_type) << ", n " << n
                                                 << ", offset " << offset);
        }
      }
    }
  }
}

TEST_CASE("cuda scale matches the CPU bit for bit") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes) {
    for (const int64_t n : kSizes) {
      for (const int64_t offset : kOffsets) {
        for (const double factor : {0.3, -1.7e3, 1.0 / 65536}) {
          Twin t = h.random(dtype, {n}, offset);
          h.cpu().scale(t.cpu, factor);
          h.gpu().scale(t.gpu, factor);
          GPU_EXPECT_IDENTICAL(
              h, t, name_of(dtype) << " *= " << factor << ", n " << n << ", offset " << offset);
        }
      }
    }
  }
}

TEST_CASE("cuda sum and sum_squares agree with the CPU's f64 sums and repeat exactly") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes) {
    for (const int64_t n : {int64_t{1}, int64_t{33}, int64_t{4101}, int64_t{3000017}}) {
      for (const int64_t offset : {int64_t{0}, int64_t{1}}) {
        Twin x = h.random(dtype, {n}, offset);
        double sum_abs = 0;
        for (const double v : h.values(x.cpu))
          sum_abs += std::fabs(v);
        const double cpu_sum = h.cpu().sum(x.cpu);
        const double gpu_sum = h.gpu().sum(x.gpu);
        const double cpu_squares = h.cpu().sum_squares(x.cpu);
        const double gpu_squares = h.gpu().sum_squares(x.gpu);
        INFO(name_of(dtype) << ", n " << n << ", offset " << offset << ": sum gpu " << gpu_sum
                            << " cpu " << cpu_sum << "; squares gpu " << gpu_squares << " cpu "
                            << cpu_squares << "; sum |x| " << sum_abs);
        CHECK(std::fabs(gpu_sum - cpu_sum) <= 1e-12 * sum_abs);
        CHECK(std::fabs(gpu_squares - cpu_squares) <= 1e-12 * cpu_squares);
        CHECK(h.gpu().sum(x.gpu) == gpu_sum);  // bit-identical repeat
        CHECK(h.gpu().sum_squares(x.gpu) == gpu_squares);
      }
    }
  }
}

TEST_CASE("cuda all_finite finds one inf or NaN anywhere") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes) {
    for (const int64_t n : {int64_t{1}, int64_t{4101}, int64_t{1000003}}) {
      for (const int64_t offset : {int64_t{0}, int64_t{3}}) {
        Twin x = h.random(dtype, {n}, offset);
        INFO(name_of(dtype) << ", n " << n << ", offset " << offset);
        CHECK(h.gpu().all_finite(x.gpu));
        for (const int64_t at : {int64_t{0}, n / 2, n - 1}) {
          for (const double bad : {INFINITY, -INFINITY, NAN}) {
            std::vector<double> values = h.random_values(n);
            values[static_cast<size_t>(at)] = bad;
            h.upload(x, values);
            INFO("non-finite " << bad << " at " << at);
            CHECK_FALSE(h.gpu().all_finite(x.gpu));
            CHECK_FALSE(h.cpu().all_finite(x.cpu));
          }
        }
      }
    }
  }
}

TEST_CASE("cuda adamw matches the CPU bit for bit, with and without master weights") {
  Harness h;
  Backend::AdamW hyper = gpu_compare::adamw_hyper();
  for (const DType dtype : kGpuFloatTypes) {
    for (const bool with_master : {false, true}) {
      for (const int64_t n : kSizes) {
        for (const int64_t offset : {int64_t{0}, int64_t{1}}) {
          Twin param = h.random(dtype, {n}, offset);
          Twin master = h.master_of(param, n, offset, with_master);
          Twin grad = h.random(DType::f32, {n}, offset, 1e-4, 3.0);
          Twin m = h.output(DType::f32, {n}, offset);
          Twin v = h.output(DType::f32, {n}, offset);
          const trainctl::tensor::Tensor no_master;
          for (int64_t step = 1; step <= 3; ++step) {
            hyper.step = step;
            h.fill_random(grad, 1e-4, 3.0);
            h.cpu().adamw(param.cpu, with_master ? master.cpu : no_master, grad.cpu, m.cpu, v.cpu,
                          hyper);
            h.gpu().adamw(param.gpu, with_master ? master.gpu : no_master, grad.gpu, m.gpu, v.gpu,
                          hyper);
          }
          INFO(name_of(dtype) << (with_master ? " with" : " without") << " master, n " << n
                              << ", offset " << offset << ", 3 steps");
          GPU_EXPECT_IDENTICAL(h, param, "param");
          GPU_EXPECT_IDENTICAL(h, m, "m");
          GPU_EXPECT_IDENTICAL(h, v, "v");
          if (with_master) GPU_EXPECT_IDENTICAL(h, master, "master");
        }
      }
    }
  }
}

TEST_CASE("cuda momentum rules (sgd, lion, muon) and apply_update match the CPU bit for bit") {
  Harness h;
  using Rule = Backend::MomentumRule;
  for (const auto& [rule, beta1, nesterov] :
       {std::tuple{Rule::sgd, 0.9, true}, std::tuple{Rule::sgd, 0.9, false},
        std::tuple{Rule::sgd, 0.0, false}, std::tuple{Rule::lion, 0.9, false},
        std::tuple{Rule::muon, 0.95, true}, std::tuple{Rule::muon, 0.95, false}}) {
    for (const DType dtype : kGpuFloatTypes) {
      for (const bool with_master : {false, true}) {
        const int64_t n = 100003;
        Twin param = h.random(dtype, {n}, 1);
        Twin master = h.master_of(param, n, 1, with_master);
        Twin grad = h.random(DType::f32, {n}, 1, 1e-4, 3.0);
        Twin m = h.output(DType::f32, {n}, 1);
        Twin out = h.output(DType::f32, {n}, 1);
        const trainctl::tensor::Tensor none;
        const bool keeps_m = !(rule == Rule::sgd && beta1 == 0);
        // Two ranges, the second without weight decay (a norm or bias).
        const std::vector<Backend::AdamWRange> ranges{{0, 60000, true}, {60000, n, false}};
        const Backend::Momentum hyper{rule, 3e-3, beta1, 0.99, 0.1, 0.37, nesterov};
        for (int step = 0; step < 3; ++step) {
          h.fill_random(grad, 1e-4, 3.0);
          for (const bool gpu : {false, true}) {
            Backend& be = gpu ? h.gpu() : h.cpu();
            auto pick = [&](const Twin& t) { return gpu ? t.gpu : t.cpu; };
            be.momentum_update(pick(param), with_master ? pick(master) : none, pick(grad),
                               keeps_m ? pick(m) : none, rule == Rule::muon ? pick(out) : none,
                               ranges, hyper);
            if (rule == Rule::muon)
              be.apply_update(pick(param), with_master ? pick(master) : none, pick(out), ranges,
                              hyper.lr, hyper.weight_decay);
          }
        }
        INFO("rule " << static_cast<int>(rule) << ", beta1 " << beta1 << ", nesterov " << nesterov
                     << ", " << name_of(dtype) << (with_master ? " with" : " without")
                     << " master, 3 steps");
        GPU_EXPECT_IDENTICAL(h, param, "param");
        if (keeps_m) GPU_EXPECT_IDENTICAL(h, m, "m");
        if (rule == Rule::muon) GPU_EXPECT_IDENTICAL(h, out, "out");
        if (with_master) GPU_EXPECT_IDENTICAL(h, master, "master");
      }
    }
  }
}

TEST_CASE("cuda adamw and momentum rules with bf16 state round as the CPU does, bit for bit") {
  // optimizer.state_dtype bf16: the moments stochastically rounded with the bits of each
  // element's global index (tensor/stochastic_round.hpp). Ranges: a contiguous run, the rows of
  // a column-split matrix (600 of every 1000 global columns, from column 41), and one without
  // weight decay placed far into its parameter.
  Harness h;
  using Rule = Backend::MomentumRule;
  const int64_t n = 100003;
  const uint64_t key =
      trainctl::tensor::rounding_key(5, trainctl::tensor::stream_key("layers.0.mlp.fc1.weight"));
  const std::vector<Backend::AdamWRange> ranges{
      {0, 30000, true, key, 0, 30000, 30000},
      {30000, 90000, true, key, 41, 600, 1000},
      {90000, n, false, key, 200000, n - 90000, n - 90000}};
  const trainctl::tensor::Tensor none;
  for (const DType dtype : kGpuFloatTypes) {
    for (const bool with_master : {false, true}) {
      // -1: adamw; else a momentum rule.
      for (const int rule : {-1, static_cast<int>(Rule::sgd), static_cast<int>(Rule::lion),
                             static_cast<int>(Rule::muon)}) {
        Twin param = h.random(dtype, {n}, 1);
        Twin master = h.master_of(param, n, 1, with_master);
        Twin grad = h.random(DType::f32, {n}, 1, 1e-4, 3.0);
        Twin m = h.output(DType::bf16, {n}, 1);
        Twin v = h.output(DType::bf16, {n}, 1);
        Twin out = h.output(DType::f32, {n}, 1);
        for (int64_t step = 1; step <= 3; ++step) {
          h.fill_random(grad, 1e-4, 3.0);
          for (const bool gpu : {false, true}) {
            Backend& be = gpu ? h.gpu() : h.cpu();
            auto pick = [&](const Twin& t) { return gpu ? t.gpu : t.cpu; };
            const trainctl::tensor::Tensor w = with_master ? pick(master) : none;
            if (rule < 0) {
              be.adamw(pick(param), w, pick(grad), pick(m), pick(v), ranges,
                       Backend::AdamW{1e-3, 0.9, 0.95, 1e-8, 0.1, 0.37, step});
              continue;
            }
            const auto r = static_cast<Rule>(rule);
            const Backend::Momentum hyper{r, 3e-3, 0.9, 0.99, 0.1, 0.37, true, step};
            be.momentum_update(pick(param), w, pick(grad), pick(m),
                               r == Rule::muon ? pick(out) : none, ranges, hyper);
          }
        }
        INFO("rule " << rule << " (-1: adamw), " << name_of(dtype)
                     << (with_master ? " with" : " without") << " master, 3 steps");
        GPU_EXPECT_IDENTICAL(h, param, "param");
        GPU_EXPECT_IDENTICAL(h, m, "m");
        if (rule < 0) GPU_EXPECT_IDENTICAL(h, v, "v");
        if (rule == static_cast<int>(Rule::muon)) GPU_EXPECT_IDENTICAL(h, out, "out");
        if (with_master) GPU_EXPECT_IDENTICAL(h, master, "master");
      }
    }
  }
}

TEST_CASE("cuda elementwise and adamw grid-stride loops iterate and cover every element") {
  // The kernels launch at most 8 blocks of 256 threads per SM and stride beyond: on an H100 (132
  // SMs) one grid covers 270,336 threads, 2.16M elements when each thread takes 8. 6.5M
  // elements, aligned (vectorised: 3 passes, a tail) and offset by one (scalar: 24 passes), make
  // every loop go round several times; a kernel that stopped after one pass leaves the poison or
  // the old values behind.
  Harness h;
  const int64_t n = 3 * (int64_t{1} << 21) + 262147;
  Backend::AdamW hyper = gpu_compare::adamw_hyper();
  hyper.step = 1;
  for (const int64_t offset : {int64_t{0}, int64_t{1}}) {
    INFO("n " << n << ", offset " << offset);
    Twin a = h.random(DType::bf16, {n}, offset);
    Twin b = h.random(DType::f32, {n}, offset);
    Twin out = h.output(DType::f32, {n}, offset);
    h.poison(out);
    h.cpu().add(out.cpu, a.cpu, b.cpu);
    h.gpu().add(out.gpu, a.gpu, b.gpu);
    GPU_EXPECT_IDENTICAL(h, out, "add");
    h.cpu().accumulate(out.cpu, a.cpu);
    h.gpu().accumulate(out.gpu, a.gpu);
    GPU_EXPECT_IDENTICAL(h, out, "accumulate");
    h.cpu().scale(out.cpu, -0.37);
    h.gpu().scale(out.gpu, -0.37);
    GPU_EXPECT_IDENTICAL(h, out, "scale");
    Twin cast = h.output(DType::bf16, {n}, offset);
    h.poison(cast);
    h.cpu().cast(cast.cpu, out.cpu);
    h.gpu().cast(cast.gpu, out.gpu);
    GPU_EXPECT_IDENTICAL(h, cast, "cast");

    Twin param = h.random(DType::bf16, {n}, offset);
    Twin master = h.master_of(param, n, offset, true);
    Twin grad = h.random(DType::f32, {n}, offset, 1e-4, 3.0);
    Twin m = h.output(DType::f32, {n}, offset);
    Twin v = h.output(DType::f32, {n}, offset);
    h.cpu().adamw(param.cpu, master.cpu, grad.cpu, m.cpu, v.cpu, hyper);
    h.gpu().adamw(param.gpu, master.gpu, grad.gpu, m.gpu, v.gpu, hyper);
    GPU_EXPECT_IDENTICAL(h, param, "adamw param");
    GPU_EXPECT_IDENTICAL(h, master, "adamw master");
    GPU_EXPECT_IDENTICAL(h, m, "adamw m");
    GPU_EXPECT_IDENTICAL(h, v, "adamw v");
  }
}

namespace {

struct GemmCase {
  int64_t m = 1, n = 1, k = 1;
  bool trans_a = false, trans_b = false;
  int64_t batch = 1;
  DType ab = DType::f32;
  DType c = DType::f32;
  bool bias = false;
  DType bias_dtype = DType::f32;
  double alpha = 1.0, beta = 0.0;
  int64_t offset = 0;  // elements: misaligns a, b, c and bias when not 0

  std::string describe() const {
    return "m " + std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k) +
           (trans_a ? " A^T" : "") + (trans_b ? " B^T" : "") + " batch " + std::to_string(batch) +
           " " + name_of(ab) + "->" + name_of(c) + (bias ? " bias " + name_of(bias_dtype) : "") +
           " alpha " + std::to_string(alpha) + " beta " + std::to_string(beta) + " offset " +
           std::to_string(offset);
  }
};

// Runs the case on both backends; returns the output twin (compared by the caller).
Twin run_gemm(Harness& h, const GemmCase& g) {
  // Batch strides a few elements longer than one matrix, so strides are honoured, not assumed.
  const int64_t pad = g.batch > 1 ? 5 : 0;
  const int64_t stride_a = g.m * g.k + pad, stride_b = g.k * g.n + pad, stride_c = g.m * g.n + pad;
  Twin a = h.random(g.ab, {(g.batch - 1) * stride_a + g.m * g.k}, g.offset);
  Twin b = h.random(g.ab, {(g.batch - 1) * stride_b + g.k * g.n}, g.offset);
  Twin c = g.beta != 0 ? h.random(g.c, {(g.batch - 1) * stride_c + g.m * g.n}, g.offset)
                       : h.output(g.c, {(g.batch - 1) * stride_c + g.m * g.n}, g.offset);
  if (g.beta == 0) h.poison(c);  // the padding stays poisoned on the GPU: compared below
  Twin bias;
  if (g.bias) bias = h.random(g.bias_dtype, {g.n}, g.offset);
  for (int side = 0; side < 2; ++side) {
    const bool gpu = side == 1;
    GemmArgs args;
    args.a = gpu ? a.gpu : a.cpu;
    args.b = gpu ? b.gpu : b.cpu;
    args.c = gpu ? c.gpu : c.cpu;
    if (g.bias) args.bias = gpu ? bias.gpu : bias.cpu;
    args.trans_a = g.trans_a;
    args.trans_b = g.trans_b;
    args.m = g.m;
    args.n = g.n;
    args.k = g.k;
    args.alpha = g.alpha;
    args.beta = g.beta;
    args.batch = g.batch;
    args.stride_a = stride_a;
    args.stride_b = stride_b;
    args.stride_c = stride_c;
    (gpu ? h.gpu() : h.cpu()).gemm(args);
  }
  return c;
}

// Compares only the batch matrices of c (the padding between them is never written).
void expect_gemm_close(Harness& h, const GemmCase& g, const Twin& c) {
  const int64_t stride_c = g.m * g.n + (g.batch > 1 ? 5 : 0);
  const std::vector<double> gpu_all = h.values(c.gpu);
  const std::vector<double> cpu_all = h.values(c.cpu);
  std::vector<double> gpu_values, cpu_values;
  for (int64_t p = 0; p < g.batch; ++p) {
    for (int64_t i = 0; i < g.m * g.n; ++i) {
      gpu_values.push_back(gpu_all[static_cast<size_t>(p * stride_c + i)]);
      cpu_values.push_back(cpu_all[static_cast<size_t>(p * stride_c + i)]);
    }
  }
  const auto result = Harness::compare_values(gpu_values, cpu_values, g.c);
  INFO(g.describe() << ": " << result.report << " [seed " << h.seed() << "]");
  CHECK(result.ok);
  // The padding between batch matrices was poisoned (NaN) and must be untouched: a GEMM that
  // wrote past a matrix, or used the wrong stride, changes it.
  if (g.batch > 1 && g.beta == 0) {
    int64_t written = 0;
    for (int64_t p = 0; p + 1 < g.batch; ++p)
      for (int64_t i = p * stride_c + g.m * g.n; i < (p + 1) * stride_c; ++i)
        if (!std::isnan(gpu_all[static_cast<size_t>(i)])) ++written;
    INFO(g.describe() << ": padding elements written");
    CHECK(written == 0);
  }
}

}  // namespace

TEST_CASE("cuda gemm matches the CPU for every transpose, dtype and size") {
  Harness h;
  for (const DType ab : kGpuFloatTypes) {
    for (const op_cases::GemmShape& shape : op_cases::rows(op_cases::kGemmShapes, op_cases::kGpu)) {
      for (int trans = 0; trans < 4; ++trans) {
        GemmCase g;
        g.m = shape.m;
        g.n = shape.n;
        g.k = shape.k;
        g.trans_a = (trans & 1) != 0;
        g.trans_b = (trans & 2) != 0;
        g.ab = ab;
        g.c = ab;
        expect_gemm_close(h, g, run_gemm(h, g));
      }
    }
  }
}

TEST_CASE("cuda gemm accumulates 16-bit products into f32 with beta 1 (weight gradients)") {
  Harness h;
  for (const DType ab : kGpuFloatTypes) {
    for (const double alpha : {1.0, 0.25}) {
      for (const op_cases::GemmAccumulateCase& row :
           op_cases::rows(op_cases::kGemmAccumulate, op_cases::kGpu)) {
        GemmCase g;
        g.m = row.m;
        g.n = row.n;
        g.k = row.k;
        g.trans_a = row.trans_a;
        g.trans_b = row.trans_b;
        g.ab = ab;
        g.c = DType::f32;
        g.alpha = alpha;
        g.beta = 1.0;
        expect_gemm_close(h, g, run_gemm(h, g));
      }
    }
  }
}

TEST_CASE("cuda gemm adds the bias to every row, in the dtype of c or of a") {
  Harness h;
  for (const DType ab : kGpuFloatTypes) {
    for (const DType c : {ab, DType::f32}) {
      for (const DType bias : {c, ab}) {
        for (const int64_t offset : {int64_t{0}, int64_t{1}}) {
          GemmCase g;
          g.m = 67;
          g.n = 96;
          g.k = 200;
          g.trans_b = true;  // y = x W^T + b
          g.ab = ab;
          g.c = c;
          g.bias = true;
          g.bias_dtype = bias;
          g.offset = offset;
          expect_gemm_close(h, g, run_gemm(h, g));
          g.beta = 1.0;  // bias on top of an accumulation
          expect_gemm_close(h, g, run_gemm(h, g));
        }
      }
    }
  }
}

TEST_CASE("cuda gemm runs batches at the given strides") {
  Harness h;
  for (const DType ab : kGpuFloatTypes) {
    for (int trans = 0; trans < 4; ++trans) {
      GemmCase g;
      g.m = 64;
      g.n = 48;
      g.k = 80;
      g.batch = 6;
      g.trans_a = (trans & 1) != 0;
      g.trans_b = (trans & 2) != 0;
      g.ab = ab;
      g.c = ab;
      g.bias = trans == 3;
      g.bias_dtype = ab;
      expect_gemm_close(h, g, run_gemm(h, g));
    }
  }
}

TEST_CASE("cuda gemm takes misaligned (sliced) operands") {
  Harness h;
  for (const DType ab : kGpuFloatTypes) {
    for (const int64_t offset : {int64_t{1}, int64_t{3}}) {
      GemmCase g;
      g.m = 33;
      g.n = 17;
      g.k = 65;
      g.ab = ab;
      g.c = ab;
      g.offset = offset;
      expect_gemm_close(h, g, run_gemm(h, g));
    }
  }
}

TEST_CASE("cuda gemm repeats bit for bit") {
  Harness h;
  for (const DType ab : kGpuFloatTypes) {
    const int64_t m = 512, n = 768, k = 1024;
    Twin a = h.random(ab, {m * k});
    Twin b = h.random(ab, {n * k});
    Twin bias = h.random(ab, {n});
    Twin out1 = h.output(ab, {m * n});
    Twin out2 = h.output(ab, {m * n});
    h.poison(out1);
    h.poison(out2);
    GemmArgs args;
    args.a = a.gpu;
    args.b = b.gpu;
    args.bias = bias.gpu;
    args.trans_b = true;
    args.m = m;
    args.n = n;
    args.k = k;
    args.c = out1.gpu;
    h.gpu().gemm(args);
    args.c = out2.gpu;
    h.gpu().gemm(args);
    INFO(name_of(ab));
    CHECK(h.bytes(out1.gpu) == h.bytes(out2.gpu));
    CHECK(h.gpu().all_finite(out1.gpu));  // written everywhere: no poison left
  }
}

TEST_CASE("cuda gemm repeats bit for bit at split-K shapes, also on a fresh backend") {
  // A weight gradient of GPT-2's MLP: dW[768, 3072] += dY^T X over k = 16384 tokens, bf16
  // products accumulated into f32 (beta 1). A long k is where cuBLASLt picks split-K algorithms,
  // whose partial sums must still be reduced in a fixed order in deterministic mode: three runs
  // and a run on a second backend (its own plans and workspace) give the same bits.
  Harness h;
  const int64_t m = 768, n = 3072, k = 16384;
  Twin dy = h.random(DType::bf16, {k * m});
  Twin x = h.random(DType::bf16, {k * n});
  Twin start = h.random(DType::f32, {m * n});
  const std::vector<unsigned char> start_bytes = h.bytes(start.gpu);
  std::unique_ptr<Backend> fresh;
#ifndef GPU_COMPARE_SELF_TEST
  fresh = trainctl::backend::make_cuda_backend(0, true);
#else
  fresh = trainctl::backend::make_cpu_backend();
#endif
  std::vector<std::vector<unsigned char>> results;
  for (int run = 0; run < 4; ++run) {
    Twin c = h.output(DType::f32, {m * n});
    h.gpu().copy_from_host(c.gpu, start_bytes.data());
    GemmArgs args;
    args.a = dy.gpu;
    args.b = x.gpu;
    args.c = c.gpu;
    args.trans_a = true;  // dY is [k, m]
    args.m = m;
    args.n = n;
    args.k = k;
    args.beta = 1.0;
    Backend& runner = run < 3 ? h.gpu() : *fresh;
    runner.gemm(args);
    // Read back through the backend that ran it: its copy waits for its own stream.
    std::vector<unsigned char> bytes(c.gpu.bytes());
    runner.copy_to_host(bytes.data(), c.gpu);
    results.push_back(std::move(bytes));
  }
  for (int run = 1; run < 4; ++run) {
    INFO("run " << run << (run == 3 ? " (fresh backend)" : ""));
    CHECK(results[static_cast<size_t>(run)] == results[0]);
  }
  CHECK(results[0] != start_bytes);  // it did accumulate
}

TEST_CASE("cuda bias_backward accumulates column sums like the CPU, repeatably") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes) {
    for (const op_cases::BiasBackwardShape& shape :
         op_cases::rows(op_cases::kBiasBackward, op_cases::kGpu)) {
      for (const int64_t offset : {int64_t{0}, int64_t{1}}) {
        const int64_t rows = shape.rows, cols = shape.cols;
        Twin dout = h.random(dtype, {rows, cols}, offset);
        Twin dbias = h.random(DType::f32, {cols}, offset);  // += onto existing values
        Twin dbias_again = h.output(DType::f32, {cols});
        h.gpu().copy_from_host(dbias_again.gpu, h.bytes(dbias.gpu).data());
        h.cpu().bias_backward(dbias.cpu, dout.cpu);
        h.gpu().bias_backward(dbias.gpu, dout.gpu);
        // f32 tolerance on f32 sums of 16-bit inputs too: dbias is f32 (G) in every case.
        GPU_EXPECT_CLOSE(h, dbias,
                         name_of(dtype)
                             << " rows " << rows << " cols " << cols << " offset " << offset);
        h.gpu().bias_backward(dbias_again.gpu, dout.gpu);
        CHECK(h.bytes(dbias_again.gpu) == h.bytes(dbias.gpu));
      }
    }
  }
}

TEST_CASE("cuda ops reject host tensors and dtypes they do not compute on") {
  Harness h;
  Twin x = h.random(DType::f32, {16});
  CHECK_THROWS_AS(h.gpu().scale(x.cpu, 2.0), std::invalid_argument);
  Twin wide = h.output(DType::f32, {16});
  trainctl::tensor::Tensor as_f64 = wide.gpu;
  as_f64.dtype = DType::f64;
  as_f64.shape = {8};
  CHECK_THROWS_WITH(h.gpu().sum(as_f64), Catch::Contains("f64"));
  GemmArgs args;
  args.a = x.gpu;
  args.b = x.gpu;
  args.c = x.gpu;
  args.m = 4;
  args.n = 4;
  args.k = 5;  // a has 16 elements, needs 20
  CHECK_THROWS_WITH(h.gpu().gemm(args), Catch::Contains("needs 20"));
}

TEST_CASE("cuda stream() is the compute stream and fence() waited on another thread covers it") {
  Harness h;
  Backend& gpu = h.gpu();
  REQUIRE(gpu.stream() != nullptr);
  const int64_t n = int64_t{64} << 20;
  trainctl::backend::Allocation memory = gpu.allocate(static_cast<size_t>(n) * sizeof(float));
  const trainctl::tensor::Tensor t = memory.view(DType::f32, {n});
  enqueue_long_work(gpu, t, 3.0);
  auto fence = gpu.fence();
  std::string failure;
  std::thread waiter([&] {
    try {
      fence->wait();
    } catch (const std::exception& error) {
      failure = error.what();
    }
  });
  waiter.join();
  CHECK(failure.empty());
  // A fence that did not wait (the base class's passed fence) would find ~26 ms of work still
  // queued here.
  CHECK(cudaStreamQuery(static_cast<cudaStream_t>(gpu.stream())) == cudaSuccess);
  fence->wait();  // waited twice: returns at once
  CHECK(gpu.sum(t) == 3.0 * static_cast<double>(n));
}

TEST_CASE("cuda fence can be waited on and destroyed by another thread than the one that made it") {
  Harness h;
  Backend& gpu = h.gpu();
  const int64_t n = int64_t{64} << 20;
  trainctl::backend::Allocation memory = gpu.allocate(static_cast<size_t>(n) * sizeof(float));
  const trainctl::tensor::Tensor t = memory.view(DType::f32, {n});
  enqueue_long_work(gpu, t, 5.0);
  std::string failure;
  std::thread owner([fence = gpu.fence(), &failure]() mutable {
    try {
      fence->wait();
      fence->wait();
      fence.reset();
    } catch (const std::exception& error) {
      failure = error.what();
    }
  });
  owner.join();
  CHECK(failure.empty());
  CHECK(cudaStreamQuery(static_cast<cudaStream_t>(gpu.stream())) == cudaSuccess);
  // A fence on an idle stream is passed at once.
  gpu.fence()->wait();
  CHECK(gpu.sum(t) == 5.0 * static_cast<double>(n));
}
