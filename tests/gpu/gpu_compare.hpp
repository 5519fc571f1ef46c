// The cross-backend op harness of tests/gpu: run one Backend op on the CPU backend (the numerical
// reference) and on the CUDA backend with the same inputs, then compare.
//
//   gpu_compare::Harness h;                                  // CPU + CUDA backends, fixed seed
//   auto x = h.random(DType::bf16, {7, 33});                 // same fresh values on both sides
//   auto y = h.output(DType::bf16, {7, 33});                 // zeroed on both sides
//   h.poison(y);                                             // GPU side: 0xFF bytes (NaN)
//   h.cpu().gelu_forward(y.cpu, x.cpu);
//   h.gpu().gelu_forward(y.gpu, x.gpu);
//   GPU_EXPECT_CLOSE(h, y, "gelu out");                      // dtype tolerance, worst element
//
// Rules it enforces so a test cannot pass by accident:
//   - Inputs are fresh random values from one generator seeded once (kDefaultSeed, or
//     TRAINCTL_GPU_TEST_SEED), never zeros: each value has magnitude in [min_abs, max_abs] and a
//     random sign. Both sides receive the same bits (values are rounded to the dtype on the host
//     once, then copied to both backends).
//   - Output buffers are poisoned on the GPU before the op: every float dtype gets 0xFF bytes,
//     which is NaN in f32/f64/bf16/f16, and integer dtypes get 0xA5 bytes. An element the GPU
//     never wrote therefore shows up as NaN (or as a wild integer) and fails the comparison.
//   - A NaN or infinity on one side only is always a failure.
//   - `offset` (elements) places a tensor that many elements past the start of its allocation,
//     so offsets of 1, 3, ... give misaligned (sliced) tensors that take the kernels' scalar
//     paths.
//
// Tolerance (relative, per dtype of the compared tensor): f64 1e-12, f32 1e-5, f16 1e-3,
// bf16 1e-2; i32/u16 exact. Two checks, both must hold:
//   norm:        max_i |gpu_i - cpu_i| / max_i |cpu_i| <= rtol
//   elementwise: |gpu_i - cpu_i| <= rtol * |cpu_i| + atol for every i, with atol (the absolute
//                floor, for elements that cancel to near zero) = rtol * mean_i |cpu_i| unless
//                the test gives one.
// GPU_EXPECT_IDENTICAL demands the same bits (ops whose result is fully specified: casts,
// elementwise arithmetic rounded once, AdamW) and repeat-determinism checks.
//
// Header-only; needs the CUDA backend (make_cuda_backend) and the CPU backend. The GPU must
// exist: tests/gpu's main() skips the whole binary (exit 77) before any test runs without one.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "tensor/tensor.hpp"

namespace gpu_compare {

using trainctl::backend::Allocation;
using trainctl::backend::Backend;
using trainctl::tensor::DType;
using trainctl::tensor::Shape;
using trainctl::tensor::Tensor;

inline constexpr uint64_t kDefaultSeed = 0x5eed'7a11'c7d1'0001ull;

// The three floating dtypes the CUDA backend computes in (f64 is CPU-only).
inline constexpr DType kGpuFloatTypes[] = {DType::f32, DType::bf16, DType::f16};

inline double default_rtol(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-5;
    case DType::f16:
      return 1e-3;
    case DType::bf16:
      return 1e-2;
    default:
      return 0.0;  // integers: exact
  }
}

inline bool is_integer(DType dtype) {
  return dtype == DType::i32 || dtype == DType::u16;
}

// One logical tensor living twice: on the CPU backend and on the GPU backend, same dtype and
// shape, each `offset` elements into its own allocation.
struct Twin {
  Allocation cpu_memory;
  Allocation gpu_memory;
  Tensor cpu;
  Tensor gpu;
  int64_t numel() const { return cpu.numel(); }
  DType dtype() const { return cpu.dtype; }
};

struct Comparison {
  bool ok = true;
  std::string report;  // one line: the measure, and the worst element when something failed
};

struct Tolerance {
  double rtol = -1;  // < 0: default_rtol(dtype)
  double atol = -1;  // < 0: rtol * mean |cpu|
};

class Harness {
 public:
  explicit Harness(bool deterministic = true) : rng_(seed_from_environment()) {
    cpu_ = trainctl::backend::make_cpu_backend();
#ifdef GPU_COMPARE_SELF_TEST
    // Checks the tests themselves without a GPU: the "GPU" is a second CPU backend.
    (void)deterministic;
    gpu_ = trainctl::backend::make_cpu_backend();
#else
    gpu_ = trainctl::backend::make_cuda_backend(0, deterministic);
#endif
  }

  Backend& cpu() {
    return *cpu_;
  }
  Backend& gpu() {
    return *gpu_;
  }
  uint64_t seed() const {
    return seed_;
  }
  std::mt19937_64& rng() {
    return rng_;
  }

  // Zero-filled on both sides (the Backend allocate contract).
  Twin output(DType dtype, Shape shape, int64_t offset = 0) {
    Twin twin;
    const size_t element = trainctl::tensor::dtype_size(dtype);
    const size_t bytes = static_cast<size_t>(shape.numel() + offset) * element;
    twin.cpu_memory = cpu_->allocate(bytes);
    twin.gpu_memory = gpu_->allocate(bytes);
    const size_t byte_offset = static_cast<size_t>(offset) * element;
    twin.cpu = twin.cpu_memory.view(dtype, shape, byte_offset);
    twin.gpu = twin.gpu_memory.view(dtype, shape, byte_offset);
    return twin;
  }

  // An optimizer's f32 master weights of `param` ([n] at `offset`): param's values cast to f32
  // on both sides when `cast`, else zero-filled (an optimizer call then gets no master).
  Twin master_of(const Twin& param, int64_t n, int64_t offset, bool cast) {
    Twin master = output(DType::f32, {n}, offset);
    if (cast) {
      cpu_->cast(master.cpu, param.cpu);
      gpu_->cast(master.gpu, param.gpu);
    }
    return master;
  }

  // Fresh random values (magnitude in [min_abs, max_abs], random sign), the same on both sides.
  Twin random(DType dtype, Shape shape, int64_t offset = 0, double min_abs = 0.05,
              double max_abs = 1.0) {
    Twin twin = output(dtype, shape, offset);
    fill_random(twin, min_abs, max_abs);
    return twin;
  }

  std::vector<double> random_values(int64_t count, double min_abs = 0.05, double max_abs = 1.0) {
    std::uniform_real_distribution<double> magnitude(min_abs, max_abs);
    std::vector<double> values(static_cast<size_t>(count));
    for (double& v : values) {
      v = magnitude(rng_);
      if (rng_() & 1u) v = -v;
    }
    return values;
  }

  void fill_random(const Twin& twin, double min_abs = 0.05, double max_abs = 1.0) {
    upload(twin, random_values(twin.numel(), min_abs, max_abs));
  }

  // Writes values (rounded once to the dtype on the host) into both sides: the same bits.
  void upload(const Twin& twin, const std::vector<double>& values) {
    REQUIRE(static_cast<int64_t>(values.size()) == twin.numel());
    trainctl::tensor::OwnedTensor staging(twin.dtype(), twin.cpu.shape);
    for (int64_t i = 0; i < twin.numel(); ++i)
      trainctl::tensor::set_element(staging.view(), i, values[static_cast<size_t>(i)]);
    cpu_->copy_from_host(twin.cpu, staging.view().data);
    gpu_->copy_from_host(twin.gpu, staging.view().data);
  }

  void upload_i32(const Twin& twin, const std::vector<int32_t>& values) {
    REQUIRE(twin.dtype() == DType::i32);
    REQUIRE(static_cast<int64_t>(values.size()) == twin.numel());
    cpu_->copy_from_host(twin.cpu, values.data());
    gpu_->copy_from_host(twin.gpu, values.data());
  }

  // Overwrites the GPU side with poison: 0xFF bytes for float dtypes (NaN), 0xA5 for integers.
  void poison(const Twin& twin) {
    std::vector<unsigned char> bytes(twin.gpu.bytes(), is_integer(twin.dtype()) ? 0xA5 : 0xFF);
    gpu_->copy_from_host(twin.gpu, bytes.data());
  }

  // The same on the CPU side, for ops whose untouched elements must stay as they were: poison
  // both sides, run the op, and compare (an element both sides leave alone stays NaN on both,
  // which compares equal only under GPU_EXPECT_IDENTICAL).
  void poison_both(const Twin& twin) {
    poison(twin);
    std::vector<unsigned char> bytes(twin.cpu.bytes(), is_integer(twin.dtype()) ? 0xA5 : 0xFF);
    cpu_->copy_from_host(twin.cpu, bytes.data());
  }

  // The tensor's values as doubles, read back from whichever backend owns it.
  std::vector<double> values(const Tensor& t) {
    Backend& owner = t.device == trainctl::tensor::Device::cpu ? *cpu_ : *gpu_;
    trainctl::tensor::OwnedTensor host(t.dtype, t.shape);
    owner.copy_to_host(host.view().data, t);
    std::vector<double> out(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i)
      out[static_cast<size_t>(i)] = element(host.view(), i);
    return out;
  }

  std::vector<unsigned char> bytes(const Tensor& t) {
    Backend& owner = t.device == trainctl::tensor::Device::cpu ? *cpu_ : *gpu_;
    std::vector<unsigned char> out(t.bytes());
    owner.copy_to_host(out.data(), t);
    return out;
  }

  Comparison compare(const Twin& twin, Tolerance tolerance = {}) {
    return compare_values(values(twin.gpu), values(twin.cpu), twin.dtype(), tolerance);
  }

  Comparison identical(const Twin& twin) {
    const auto gpu_bytes = bytes(twin.gpu);
    const auto cpu_bytes = bytes(twin.cpu);
    Comparison result;
    const size_t size = trainctl::tensor::dtype_size(twin.dtype());
    for (size_t i = 0; i < gpu_bytes.size(); i += size) {
      if (std::memcmp(&gpu_bytes[i], &cpu_bytes[i], size) != 0) {
        const auto gv = values(twin.gpu);
        const auto cv = values(twin.cpu);
        size_t differing = 0;
        for (size_t j = 0; j < gv.size(); ++j)
          differing += std::memcmp(&gpu_bytes[j * size], &cpu_bytes[j * size], size) != 0 ? 1u : 0u;
        std::ostringstream text;
        text.precision(10);
        text << differing << " of " << gv.size() << " elements differ in their bits; first at "
             << i / size << ": gpu " << gv[i / size] << ", cpu " << cv[i / size] << " ("
             << trainctl::tensor::dtype_name(twin.dtype()) << ")";
        result.ok = false;
        result.report = text.str();
        return result;
      }
    }
    result.report = "identical bits (" + std::to_string(gpu_bytes.size() / size) + " elements)";
    return result;
  }

  static Comparison compare_values(const std::vector<double>& gpu, const std::vector<double>& cpu,
                                   DType dtype, Tolerance tolerance = {}) {
    Comparison result;
    std::ostringstream text;
    text.precision(6);
    if (gpu.size() != cpu.size()) {
      result.ok = false;
      text << "size mismatch: gpu " << gpu.size() << ", cpu " << cpu.size();
      result.report = text.str();
      return result;
    }
    const double rtol = tolerance.rtol >= 0 ? tolerance.rtol : default_rtol(dtype);
    double max_ref = 0, sum_ref = 0, max_diff = 0;
    size_t non_finite_mismatch = gpu.size();
    for (size_t i = 0; i < gpu.size(); ++i) {
      const bool gf = std::isfinite(gpu[i]), cf = std::isfinite(cpu[i]);
      if (gf != cf && non_finite_mismatch == gpu.size()) non_finite_mismatch = i;
      if (!cf) continue;
      max_ref = std::max(max_ref, std::fabs(cpu[i]));
      sum_ref += std::fabs(cpu[i]);
    }
    const double atol =
        tolerance.atol >= 0
            ? tolerance.atol
            : rtol * (cpu.empty() ? 0.0 : sum_ref / static_cast<double>(cpu.size()));
    size_t worst = 0, failures = 0, first_failure = gpu.size();
    double worst_excess = -1;
    for (size_t i = 0; i < gpu.size(); ++i) {
      if (!std::isfinite(gpu[i]) || !std::isfinite(cpu[i])) continue;
      const double diff = std::fabs(gpu[i] - cpu[i]);
      max_diff = std::max(max_diff, diff);
      const double allowed = rtol * std::fabs(cpu[i]) + atol;
      const double excess = allowed > 0 ? diff / allowed : (diff > 0 ? INFINITY : 0);
      if (excess > worst_excess) {
        worst_excess = excess;
        worst = i;
      }
      if (diff > allowed) {
        ++failures;
        if (first_failure == gpu.size()) first_failure = i;
      }
    }
    const double norm_error = max_ref > 0 ? max_diff / max_ref : max_diff;
    const char* name = trainctl::tensor::dtype_name(dtype).data();
    if (non_finite_mismatch != gpu.size()) {
      result.ok = false;
      text << "element " << non_finite_mismatch << " is " << gpu[non_finite_mismatch]
           << " on the GPU but " << cpu[non_finite_mismatch]
           << " on the CPU (unwritten output or overflow)";
    } else {
      result.ok = failures == 0 && norm_error <= rtol;
      text << name << ": max|gpu-cpu|/max|cpu| = " << norm_error << " (rtol " << rtol
           << "), elementwise failures " << failures << " of " << gpu.size() << " (atol " << atol
           << ")";
      if (!gpu.empty()) {
        const size_t shown = failures > 0 ? first_failure : worst;
        text << "; " << (failures > 0 ? "first failing" : "worst") << " element " << shown
             << ": gpu " << gpu[shown] << ", cpu " << cpu[shown];
        if (failures > 0 && worst != shown)
          text << "; worst element " << worst << ": gpu " << gpu[worst] << ", cpu " << cpu[worst];
      }
    }
    result.report = text.str();
    return result;
  }

 private:
  static double element(const Tensor& host, int64_t i) {
    if (host.dtype == DType::i32) return host.as<int32_t>()[i];
    if (host.dtype == DType::u16) return host.as<uint16_t>()[i];
    return trainctl::tensor::get_element(host, i);
  }

  uint64_t seed_from_environment() {
    seed_ = kDefaultSeed;
    if (const char* text = std::getenv("TRAINCTL_GPU_TEST_SEED"); text != nullptr && *text)
      seed_ = std::strtoull(text, nullptr, 0);
    return seed_;
  }

  uint64_t seed_ = kDefaultSeed;
  std::mt19937_64 rng_;
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Backend> gpu_;
};

// The AdamW settings of the optimizer tests (step still to set); grad_scale is not 1 so the
// un-scaling is exercised.
inline Backend::AdamW adamw_hyper() {
  Backend::AdamW hyper{};
  hyper.lr = 3e-3;
  hyper.beta1 = 0.9;
  hyper.beta2 = 0.95;
  hyper.eps = 1e-8;
  hyper.weight_decay = 0.1;
  hyper.grad_scale = 0.37;
  return hyper;
}

// Hand-off tests (fence, NCCL's producer stream): enqueues fill 1, 200 passes of scale(1) and fill
// `value` on the backend's stream and returns at once. Over 64M floats that keeps an H200 busy for
// tens of milliseconds, during which the buffer does not hold `value` yet.
inline void enqueue_long_work(Backend& backend, const Tensor& t, double value) {
  backend.fill(t, 1.0);
  for (int pass = 0; pass < 200; ++pass)
    backend.scale(t, 1.0);
  backend.fill(t, value);
}

}  // namespace gpu_compare

// Catch2 checks with the comparison's report attached (and the seed, to reproduce a failure).
#define GPU_EXPECT_CLOSE_TOL(harness, twin, what, tolerance)                                      \
  do {                                                                                            \
    const ::gpu_compare::Comparison gpu_compare_result_ = (harness).compare((twin), (tolerance)); \
    INFO(what << ": " << gpu_compare_result_.report << " [seed " << (harness).seed() << "]");     \
    CHECK(gpu_compare_result_.ok);                                                                \
  } while (0)

#define GPU_EXPECT_CLOSE(harness, twin, what) \
  GPU_EXPECT_CLOSE_TOL(harness, twin, what, ::gpu_compare::Tolerance{})

#define GPU_EXPECT_IDENTICAL(harness, twin, what)                                             \
  do {                                                                                        \
    const ::gpu_compare::Comparison gpu_compare_result_ = (harness).identical((twin));        \
    INFO(what << ": " << gpu_compare_result_.report << " [seed " << (harness).seed() << "]"); \
    CHECK(gpu_compare_result_.ok);                                                            \
  } while (0)
