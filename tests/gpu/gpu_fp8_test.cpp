// The CUDA backend's fp8 GEMMs, GELU epilogue and multi-tensor AdamW against the CPU backend
// (tests/gpu/gpu_compare.hpp).
//
// What "agree" means:
//   fp8 GEMM: both backends quantize to the same fp8 values (same scales, same rounding: the
//     scale and quantize kernels are checked bit for bit against the host below), so only the
//     summation order differs: bf16 output 1e-2 relative, f32 output 1e-5 of the largest |C|.
//     Shapes are chosen to take the fp8 tensor-core path (m, n, k multiples of 16) and the
//     emulated path (not multiples of 16, or e5m2 x e5m2); gemm_paths() proves which ran.
//   GELU epilogue: c and pre_gelu within the dtype tolerance of the CPU's gemm + gelu_forward.
//   AdamW: identical bits (the same fp32 operations), ranges with and without decay, gaps
//     between ranges left untouched.
// Determinism: each GPU op twice on the same inputs gives identical bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gpu_compare.hpp"
#include "tensor/dtype.hpp"

#ifndef GPU_COMPARE_SELF_TEST
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.hpp"
#include "kernels/check.cuh"
#include "kernels/fp8.cuh"
#endif

using gpu_compare::Harness;
using gpu_compare::Tolerance;
using gpu_compare::Twin;
using trainctl::backend::Backend;
using trainctl::backend::Epilogue;
using trainctl::backend::GemmArgs;
using trainctl::tensor::DType;
using trainctl::tensor::dtype_name;

namespace {

// Which GEMM of a linear layer y = x W^T (x [N, in], W [out, in]).
enum class Form { forward, dx, dw };

struct Fp8Case {
  Form form = Form::forward;
  int64_t N = 0, in = 0, out = 0;
  DType fmt_a = DType::e4m3, fmt_b = DType::e4m3;
  bool bias = false;
  bool tensor_cores = false;  // the path this case must take

  std::string describe() const {
    const char* names[] = {"forward x W^T", "dX = dY W", "dW += dY^T X"};
    return std::string(names[static_cast<int>(form)]) + " N " + std::to_string(N) + " in " +
           std::to_string(in) + " out " + std::to_string(out) + " " +
           std::string(dtype_name(fmt_a)) + " x " + std::string(dtype_name(fmt_b)) +
           (bias ? " bias" : "") + (tensor_cores ? " (fp8 tensor cores)" : " (emulated)");
  }
};

// The GemmArgs of a case (operands taken from one side); c gets m*n elements.
struct Fp8Operands {
  Twin a, b, c, bias;
  GemmArgs args(bool gpu) const {
    GemmArgs g;
    g.a = gpu ? a.gpu : a.cpu;
    g.b = gpu ? b.gpu : b.cpu;
    g.c = gpu ? c.gpu : c.cpu;
    if (!bias.cpu.empty()) g.bias = gpu ? bias.gpu : bias.cpu;
    return g;
  }
};

GemmArgs shape_args(const Fp8Case& f, GemmArgs g) {
  switch (f.form) {
    case Form::forward:  // a = x [N, in], b = W [out, in]^T
      g.m = f.N, g.n = f.out, g.k = f.in, g.trans_b = true;
      break;
    case Form::dx:  // a = dY [N, out], b = W [out, in]
      g.m = f.N, g.n = f.in, g.k = f.out;
      break;
    case Form::dw:  // a = dY [N, out]^T, b = x [N, in]; f32 dW accumulates
      g.m = f.out, g.n = f.in, g.k = f.N, g.trans_a = true, g.beta = 1.0;
      break;
  }
  g.fp8_a = f.fmt_a;
  g.fp8_b = f.fmt_b;
  return g;
}

Fp8Operands make_operands(Harness& h, const Fp8Case& f) {
  Fp8Operands o;
  const GemmArgs s = shape_args(f, {});
  o.a = h.random(DType::bf16, {s.m * s.k});
  o.b = h.random(DType::bf16, {s.k * s.n});
  // The dW form accumulates into an f32 gradient that already holds something.
  o.c = f.form == Form::dw ? h.random(DType::f32, {s.m * s.n}) : h.output(DType::bf16, {s.m * s.n});
  if (f.form != Form::dw) h.poison(o.c);
  if (f.bias) o.bias = h.random(DType::bf16, {s.n});
  return o;
}

#ifndef GPU_COMPARE_SELF_TEST
trainctl::backend::cuda::CudaBackend::GemmPaths paths_of(Backend& gpu) {
  return dynamic_cast<trainctl::backend::cuda::CudaBackend&>(gpu).gemm_paths();
}
#endif

void expect_fp8_close(Harness& h, const Fp8Case& f, const Twin& c) {
  Tolerance tolerance;
  if (c.dtype() == DType::f32) {
    double largest = 0;
    for (const double value : h.values(c.cpu))
      largest = std::max(largest, std::fabs(value));
    tolerance.rtol = 1e-5;
    tolerance.atol = 1e-5 * largest;
  } else {
    tolerance.rtol = 1e-2;
  }
  const auto result = h.compare(c, tolerance);
  INFO(f.describe() << ": " << result.report << " [seed " << h.seed() << "]");
  CHECK(result.ok);
}

// A non-finite scale or operand poisons the whole product: every element of c is NaN, on the
// GPU and on the CPU reference alike.
void expect_all_nan(Harness& h, const Twin& c) {
  size_t gpu_nan = 0, cpu_nan = 0;
  for (const double value : h.values(c.gpu))
    gpu_nan += std::isnan(value) ? 1u : 0u;
  for (const double value : h.values(c.cpu))
    cpu_nan += std::isnan(value) ? 1u : 0u;
  CHECK(gpu_nan == static_cast<size_t>(c.numel()));
  CHECK(cpu_nan == static_cast<size_t>(c.numel()));
}

std::vector<Fp8Case> fp8_cases() {
  std::vector<Fp8Case> cases;
  const std::pair<DType, DType> formats[] = {{DType::e4m3, DType::e4m3},
                                             {DType::e5m2, DType::e4m3}};
  for (const auto& [fa, fb] : formats) {
    for (const Form form : {Form::forward, Form::dx, Form::dw}) {
      const bool bias = form == Form::forward;
      cases.push_back({form, 256, 192, 128, fa, fb, bias, true});
      cases.push_back({form, 1024, 768, 512, fa, fb, bias, true});
      // MoE-style expert block with a row count that is not a multiple of 16.
      cases.push_back({form, 100, 48, 40, fa, fb, bias, false});
      cases.push_back({form, 37, 64, 32, fa, fb, bias, false});
    }
  }
  // e5m2 x e5m2 has no fp8 kernel on Hopper: emulated even at a friendly shape.
  cases.push_back({Form::forward, 128, 64, 32, DType::e5m2, DType::e5m2, true, false});
  return cases;
}

}  // namespace

TEST_CASE("cuda fp8 gemm matches the CPU for the forward, dX and dW forms on both paths") {
  Harness h;
  for (const Fp8Case& f : fp8_cases()) {
    Fp8Operands o = make_operands(h, f);
#ifndef GPU_COMPARE_SELF_TEST
    const auto before = paths_of(h.gpu());
#endif
    h.cpu().gemm(shape_args(f, o.args(false)));
    h.gpu().gemm(shape_args(f, o.args(true)));
#ifndef GPU_COMPARE_SELF_TEST
    const auto after = paths_of(h.gpu());
    INFO(f.describe());
    CHECK(after.fp8_tensor_core - before.fp8_tensor_core == (f.tensor_cores ? 1 : 0));
    CHECK(after.fp8_emulated - before.fp8_emulated == (f.tensor_cores ? 0 : 1));
#endif
    expect_fp8_close(h, f, o.c);
  }
}

TEST_CASE("cuda fp8 gemm repeats bit for bit on both paths") {
  Harness h;
  for (const Fp8Case& f :
       {Fp8Case{Form::dx, 512, 256, 384, DType::e5m2, DType::e4m3, false, true},
        Fp8Case{Form::dw, 512, 256, 384, DType::e4m3, DType::e4m3, false, true},
        Fp8Case{Form::dx, 100, 56, 40, DType::e5m2, DType::e4m3, false, false}}) {
    Fp8Operands o = make_operands(h, f);
    const Twin start = h.output(o.c.dtype(), {o.c.numel()});
    h.gpu().cast(start.gpu, o.c.gpu);
    h.gpu().gemm(shape_args(f, o.args(true)));
    const auto first = h.bytes(o.c.gpu);
    h.gpu().cast(o.c.gpu, start.gpu);
    h.gpu().gemm(shape_args(f, o.args(true)));
    INFO(f.describe());
    CHECK(h.bytes(o.c.gpu) == first);
    CHECK(h.gpu().all_finite(o.c.gpu));
  }
}

// One variation of an fp8 GEMM the cases above keep fixed: the input dtype, each operand's
// magnitude (so the A and B scales differ and a swap shows), which operands are marked fp8, alpha,
// and offsets that misalign a, b and c one at a time.
struct Fp8Variant {
  std::string what;
  Fp8Case shape;
  DType input = DType::bf16;
  double a_max = 1.0, b_max = 1.0;
  bool mark_a = true, mark_b = true;
  double alpha = 1.0;
  int64_t offset_a = 0, offset_b = 0, offset_c = 0;
};

TEST_CASE(
    "cuda fp8 gemm: tails, f32 inputs, one marked operand, alpha, unequal scales, misalignment") {
  Harness h;
  const Fp8Case friendly{Form::forward, 256, 192, 128, DType::e4m3, DType::e4m3, true, true};
  const Fp8Case dw{Form::dw, 256, 192, 128, DType::e4m3, DType::e4m3, false, true};
  const Fp8Case tails{Form::forward, 33, 47, 29, DType::e4m3, DType::e4m3, true, false};
  const Fp8Case dw_tails{Form::dw, 71, 45, 19, DType::e5m2, DType::e4m3, false, false};
  const Fp8Variant variants[] = {
      {"tails in every dimension", tails},
      {"dW with tails", dw_tails},
      {"f32 inputs", friendly, DType::f32},
      {"f32 inputs, dW", dw, DType::f32},
      {"only a marked", friendly, DType::bf16, 1.0, 1.0, true, false},
      {"only b marked", friendly, DType::bf16, 1.0, 1.0, false, true},
      {"alpha 0.375", friendly, DType::bf16, 1.0, 1.0, true, true, 0.375},
      {"alpha 0.375, dW", dw, DType::bf16, 1.0, 1.0, true, true, 0.375},
      {"a 300x larger than b", friendly, DType::bf16, 300.0, 1.0},
      {"b 300x larger than a", friendly, DType::bf16, 1.0, 300.0},
      {"a misaligned", friendly, DType::bf16, 1.0, 1.0, true, true, 1.0, 1, 0, 0},
      {"b misaligned", friendly, DType::bf16, 1.0, 1.0, true, true, 1.0, 0, 3, 0},
      {"c misaligned", friendly, DType::bf16, 1.0, 1.0, true, true, 1.0, 0, 0, 5},
  };
  for (const Fp8Variant& v : variants) {
    const Fp8Case& f = v.shape;
    const GemmArgs s = shape_args(f, {});
    Fp8Operands o;
    o.a = h.random(v.input, {s.m * s.k}, v.offset_a, 0.05 * v.a_max, v.a_max);
    o.b = h.random(v.input, {s.k * s.n}, v.offset_b, 0.05 * v.b_max, v.b_max);
    o.c = f.form == Form::dw ? h.random(DType::f32, {s.m * s.n}, v.offset_c)
                             : h.output(v.input, {s.m * s.n}, v.offset_c);
    if (f.form != Form::dw) h.poison(o.c);
    if (f.bias) o.bias = h.random(v.input, {s.n});
    for (const bool gpu : {false, true}) {
      GemmArgs g = shape_args(f, o.args(gpu));
      if (!v.mark_a) g.fp8_a.reset();
      if (!v.mark_b) g.fp8_b.reset();
      g.alpha = v.alpha;
      (gpu ? h.gpu() : h.cpu()).gemm(g);
    }
    INFO(v.what);
    expect_fp8_close(h, f, o.c);
  }
}

TEST_CASE("cuda fp8 gemm: a NaN or inf in an operand makes every output NaN") {
  Harness h;
  for (const bool tensor_cores : {true, false}) {
    for (const bool in_a : {true, false}) {
      for (const double bad : {std::nan(""), static_cast<double>(INFINITY)}) {
        const Fp8Case f{
            Form::forward, tensor_cores ? 64 : 60, 64, 32, DType::e4m3, DType::e4m3, false,
            tensor_cores};
        Fp8Operands o = make_operands(h, f);
        const Twin& operand = in_a ? o.a : o.b;
        std::vector<double> values = h.values(operand.cpu);
        values[values.size() / 3] = bad;
        h.upload(operand, values);
        h.cpu().fill(o.c.cpu, 0.0);  // not the harness's NaN poison: NaN must be written
        h.gpu().fill(o.c.gpu, 0.0);
        h.cpu().gemm(shape_args(f, o.args(false)));
        h.gpu().gemm(shape_args(f, o.args(true)));
        INFO(f.describe() << ", " << bad << " in " << (in_a ? "a" : "b"));
        expect_all_nan(h, o.c);
      }
    }
  }
}

#ifndef GPU_COMPARE_SELF_TEST
namespace {

// Device memory for one kernel-level test; frees itself.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) { TRAINCTL_CUDA_CHECK(cudaMalloc(&data_, bytes)); }
  ~DeviceBytes() { (void)cudaFree(data_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
};

}  // namespace

TEST_CASE("cuda fp8 scales and quantized values equal the host's bit for bit") {
  namespace kernels = trainctl::kernels;
  namespace tensor = trainctl::tensor;
  std::mt19937_64 rng(0xf8);
  const float inf = std::numeric_limits<float>::infinity();
  // Magnitude ranges: ordinary, huge (scale clamps at 2^-126 only beyond f32), tiny (subnormal
  // f32 inputs, scale clamped at 2^126), exactly the format's max, all zero.
  struct Range {
    float low, high;
  };
  const Range ranges[] = {{0.05f, 1.0f},    {1e3f, 3e4f},     {1e30f, 3e38f},
                          {1e-40f, 1e-38f}, {448.0f, 448.0f}, {0.0f, 0.0f}};
  for (const DType format : {DType::e4m3, DType::e5m2}) {
    for (const Range& range : ranges) {
      for (const int64_t n : {int64_t{1}, int64_t{33}, int64_t{5000}, int64_t{300001}}) {
        std::uniform_real_distribution<float> magnitude(range.low, range.high);
        std::vector<float> x(static_cast<size_t>(n));
        float amax = 0;
        for (float& v : x) {
          v = magnitude(rng) * ((rng() & 1u) ? -1.0f : 1.0f);
          amax = std::max(amax, std::fabs(v));
        }
        const float p = trainctl::backend::fp8_scale(format, amax);
        const auto fmt =
            format == DType::e4m3 ? kernels::Fp8Format::e4m3 : kernels::Fp8Format::e5m2;
        DeviceBytes src(x.size() * sizeof(float));
        DeviceBytes scale(2 * sizeof(float));
        const size_t scratch_bytes = kernels::fp8_amax_scratch_bytes(n);
        DeviceBytes scratch(scratch_bytes);
        DeviceBytes quantized(x.size());
        TRAINCTL_CUDA_CHECK(
            cudaMemcpy(src.get(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
        TRAINCTL_CUDA_CHECK(kernels::launch_fp8_scale(src.get(), kernels::Storage::f32, n, fmt,
                                                      static_cast<float*>(scale.get()),
                                                      scratch.get(), scratch_bytes, nullptr));
        TRAINCTL_CUDA_CHECK(kernels::launch_fp8_quantize(
            static_cast<uint8_t*>(quantized.get()), src.get(), kernels::Storage::f32, 1, n, false,
            fmt, static_cast<const float*>(scale.get()), nullptr));
        float device_scale[2] = {0, 0};
        std::vector<uint8_t> q(x.size());
        TRAINCTL_CUDA_CHECK(
            cudaMemcpy(device_scale, scale.get(), sizeof(device_scale), cudaMemcpyDeviceToHost));
        TRAINCTL_CUDA_CHECK(
            cudaMemcpy(q.data(), quantized.get(), q.size(), cudaMemcpyDeviceToHost));
        INFO(dtype_name(format) << " amax " << amax << " n " << n);
        CHECK(device_scale[0] == p);
        CHECK(device_scale[1] == 1.0f / p);
        size_t differing = 0;
        for (size_t i = 0; i < x.size(); ++i) {
          const uint8_t host = format == DType::e4m3 ? tensor::to_e4m3(x[i] * p).bits
                                                     : tensor::to_e5m2(x[i] * p).bits;
          differing += host != q[i] ? 1u : 0u;
        }
        CHECK(differing == 0);
      }
    }
    // A non-finite element: the scale is NaN.
    for (const float bad : {std::nanf(""), inf, -inf}) {
      std::vector<float> x(1000, 0.5f);
      x[517] = bad;
      DeviceBytes src(x.size() * sizeof(float));
      DeviceBytes scale(2 * sizeof(float));
      const size_t scratch_bytes = kernels::fp8_amax_scratch_bytes(1000);
      DeviceBytes scratch(scratch_bytes);
      TRAINCTL_CUDA_CHECK(
          cudaMemcpy(src.get(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
      TRAINCTL_CUDA_CHECK(kernels::launch_fp8_scale(
          src.get(), kernels::Storage::f32, 1000,
          format == DType::e4m3 ? kernels::Fp8Format::e4m3 : kernels::Fp8Format::e5m2,
          static_cast<float*>(scale.get()), scratch.get(), scratch_bytes, nullptr));
      float device_scale[2] = {0, 0};
      TRAINCTL_CUDA_CHECK(
          cudaMemcpy(device_scale, scale.get(), sizeof(device_scale), cudaMemcpyDeviceToHost));
      INFO(dtype_name(format) << " with " << bad);
      CHECK(std::isnan(device_scale[0]));
      CHECK(std::isnan(device_scale[1]));
    }
  }
}

TEST_CASE("cuda fp8 scale from a given amax equals the host's fp8_scale bit for bit") {
  namespace kernels = trainctl::kernels;
  const float inf = std::numeric_limits<float>::infinity();
  // Ordinary, the formats' largest values and their neighbours, clamped ends of the scale range,
  // subnormal, zero of both signs, negative (outside the contract, but the CPU's answer is still
  // defined: the scale must match it), and the non-finite ones (p NaN).
  const float amaxes[] = {1.0f,     0.37f,
                          448.0f,   std::nextafter(448.0f, inf),
                          57344.0f, std::nextafter(57344.0f, 0.0f),
                          3e38f,    1e-30f,
                          1e-40f,   0.0f,
                          -0.0f,    -5.0f,
                          inf,      std::nanf("")};
  DeviceBytes amax(sizeof(float));
  DeviceBytes scale(2 * sizeof(float));
  for (const DType format : {DType::e4m3, DType::e5m2}) {
    for (const float value : amaxes) {
      const float poison[2] = {-1.0f, -1.0f};
      TRAINCTL_CUDA_CHECK(cudaMemcpy(amax.get(), &value, sizeof(float), cudaMemcpyHostToDevice));
      TRAINCTL_CUDA_CHECK(cudaMemcpy(scale.get(), poison, sizeof(poison), cudaMemcpyHostToDevice));
      TRAINCTL_CUDA_CHECK(kernels::launch_fp8_scale_from_amax(
          static_cast<const float*>(amax.get()),
          format == DType::e4m3 ? kernels::Fp8Format::e4m3 : kernels::Fp8Format::e5m2,
          static_cast<float*>(scale.get()), nullptr));
      float device_scale[2] = {0, 0};
      TRAINCTL_CUDA_CHECK(
          cudaMemcpy(device_scale, scale.get(), sizeof(device_scale), cudaMemcpyDeviceToHost));
      const float p = trainctl::backend::fp8_scale(format, value);
      INFO(dtype_name(format) << " amax " << value);
      if (std::isnan(p)) {
        CHECK(std::isnan(device_scale[0]));
        CHECK(std::isnan(device_scale[1]));
      } else {
        CHECK(device_scale[0] == p);
        CHECK(device_scale[1] == 1.0f / p);
      }
    }
  }
  // Bad arguments are refused before any launch.
  float* null = nullptr;
  CHECK(kernels::launch_fp8_scale_from_amax(null, kernels::Fp8Format::e4m3,
                                            static_cast<float*>(scale.get()),
                                            nullptr) == cudaErrorInvalidValue);
  CHECK(kernels::launch_fp8_amax(amax.get(), kernels::Storage::f32, 1, null, scale.get(),
                                 kernels::fp8_amax_scratch_bytes(1),
                                 nullptr) == cudaErrorInvalidValue);
  CHECK(kernels::launch_fp8_amax(amax.get(), kernels::Storage::f32, 1,
                                 static_cast<float*>(scale.get()), scale.get(), 4,
                                 nullptr) == cudaErrorInvalidValue);
}

TEST_CASE("cuda fp8 transposing quantize writes the transpose") {
  namespace kernels = trainctl::kernels;
  namespace tensor = trainctl::tensor;
  // src [cols, rows] -> out [rows, cols], at sizes around the 32 x 32 tile.
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 1}, {31, 33}, {64, 96}, {100, 40}, {513, 77}}) {
    std::vector<float> x(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<float>(static_cast<int64_t>(i % 401) - 200) / 16.0f;
    DeviceBytes src(x.size() * sizeof(float));
    DeviceBytes out(x.size());
    DeviceBytes scale(2 * sizeof(float));
    const float scales[2] = {1.0f, 1.0f};
    TRAINCTL_CUDA_CHECK(
        cudaMemcpy(src.get(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    TRAINCTL_CUDA_CHECK(cudaMemcpy(scale.get(), scales, sizeof(scales), cudaMemcpyHostToDevice));
    TRAINCTL_CUDA_CHECK(kernels::launch_fp8_quantize(
        static_cast<uint8_t*>(out.get()), src.get(), kernels::Storage::f32, rows, cols, true,
        kernels::Fp8Format::e4m3, static_cast<const float*>(scale.get()), nullptr));
    std::vector<uint8_t> q(x.size());
    TRAINCTL_CUDA_CHECK(cudaMemcpy(q.data(), out.get(), q.size(), cudaMemcpyDeviceToHost));
    size_t differing = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        differing += q[static_cast<size_t>(r * cols + c)] !=
                             tensor::to_e4m3(x[static_cast<size_t>(c * rows + r)]).bits
                         ? 1u
                         : 0u;
    INFO("rows " << rows << " cols " << cols);
    CHECK(differing == 0);
  }
}
#endif

TEST_CASE("cuda amax equals the CPU's bit for bit") {
  Harness h;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const int64_t n : {int64_t{1}, int64_t{17}, int64_t{4097}, (int64_t{1} << 20) + 3}) {
      // Wide magnitudes, so a wrong element (or a missed block) changes the result.
      Twin x = h.random(dtype, {n}, 0, 1e-3, 300.0);
      Twin out = h.output(DType::f32, {1});
      h.poison(out);
      h.cpu().amax(out.cpu, x.cpu);
      h.gpu().amax(out.gpu, x.gpu);
      INFO(dtype_name(dtype) << " n " << n);
      GPU_EXPECT_IDENTICAL(h, out, "amax");
      CHECK(h.values(out.cpu)[0] > 0);
    }
  }
}

TEST_CASE("cuda amax is +inf when any element is NaN or infinite") {
  Harness h;
  const double inf = std::numeric_limits<double>::infinity();
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const int64_t n : {int64_t{1}, int64_t{4097}, (int64_t{1} << 20) + 3}) {
      for (const double bad : {std::nan(""), inf, -inf}) {
        // First, somewhere inside, last: different threads and blocks of the first pass.
        for (const int64_t at : {int64_t{0}, n / 3, n - 1}) {
          Twin x = h.random(dtype, {n});
          std::vector<double> values = h.values(x.cpu);
          values[static_cast<size_t>(at)] = bad;
          h.upload(x, values);
          Twin out = h.output(DType::f32, {1});
          h.poison(out);
          h.cpu().amax(out.cpu, x.cpu);
          h.gpu().amax(out.gpu, x.gpu);
          INFO(dtype_name(dtype) << " n " << n << ", " << bad << " at " << at);
          CHECK(h.values(out.gpu)[0] == inf);
          CHECK(h.values(out.cpu)[0] == inf);
        }
      }
    }
  }
}

namespace {

// Which operands of a GEMM get a given amax.
enum class Given { a, b, both };

const char* given_name(Given given) {
  return given == Given::a ? "amax_a" : (given == Given::b ? "amax_b" : "amax_a and amax_b");
}

// Magnitudes spread over seven decades (10^U(-7, 0), random sign): scaling by a given amax then
// moves some of them across the fp8 formats' subnormal ranges, so the given amax shows in the
// result (the harness's [0.05, 1] values would quantize to the same values under any power-of-two
// scale that keeps them normal).
void fill_log_uniform(Harness& h, const Twin& twin) {
  std::uniform_real_distribution<double> exponent(-7.0, 0.0);
  std::vector<double> values(static_cast<size_t>(twin.numel()));
  for (double& v : values)
    v = std::pow(10.0, exponent(h.rng())) * ((h.rng()() & 1u) ? -1.0 : 1.0);
  h.upload(twin, values);
}

// A [1] f32 amax equal to `factor` times the operand's own (the CPU's amax), on both sides.
Twin scaled_amax(Harness& h, const Twin& operand, double factor) {
  Twin own = h.output(DType::f32, {1});
  h.cpu().amax(own.cpu, operand.cpu);
  Twin given = h.output(DType::f32, {1});
  h.upload(given, {static_cast<double>(static_cast<float>(h.values(own.cpu)[0] * factor))});
  return given;
}

}  // namespace

// The operand's scale comes from the given amax: 4x and 1000x larger than its own (coarser
// quantization, subnormal fp8 values at 1000x), and 4x smaller (its largest elements saturate,
// which the contract defines: larger values saturate).
TEST_CASE("cuda fp8 gemm with a given amax matches the CPU on both paths") {
  Harness h;
  const Fp8Case cases[] = {
      {Form::forward, 256, 192, 128, DType::e4m3, DType::e4m3, true, true},
      {Form::dw, 256, 192, 128, DType::e5m2, DType::e4m3, false, true},
      {Form::forward, 100, 48, 40, DType::e4m3, DType::e4m3, true, false},
      {Form::dx, 37, 64, 32, DType::e5m2, DType::e4m3, false, false},
  };
  for (const Fp8Case& f : cases) {
    for (const Given given : {Given::a, Given::b, Given::both}) {
      for (const double factor : {4.0, 1000.0, 0.25}) {
        Fp8Operands o = make_operands(h, f);
        fill_log_uniform(h, o.a);
        fill_log_uniform(h, o.b);
        const Twin start = h.output(o.c.dtype(), {o.c.numel()});
        h.gpu().cast(start.gpu, o.c.gpu);
        const bool with_a = given != Given::b, with_b = given != Given::a;
        const Twin amax_a = with_a ? scaled_amax(h, o.a, factor) : Twin{};
        const Twin amax_b = with_b ? scaled_amax(h, o.b, factor) : Twin{};
        const auto with_amax = [&](GemmArgs g, bool gpu) {
          if (with_a) g.amax_a = gpu ? amax_a.gpu : amax_a.cpu;
          if (with_b) g.amax_b = gpu ? amax_b.gpu : amax_b.cpu;
          return g;
        };
        // The GPU's result from the operands' own amax, as a witness that the given one counted.
        h.gpu().gemm(shape_args(f, o.args(true)));
        const auto own_result = h.bytes(o.c.gpu);
        h.gpu().cast(o.c.gpu, start.gpu);
        if (f.form != Form::dw) h.poison(o.c);
#ifndef GPU_COMPARE_SELF_TEST
        const auto before = paths_of(h.gpu());
#endif
        h.cpu().gemm(with_amax(shape_args(f, o.args(false)), false));
        h.gpu().gemm(with_amax(shape_args(f, o.args(true)), true));
        INFO(f.describe() << ", " << given_name(given) << " " << factor << "x the operand's own");
#ifndef GPU_COMPARE_SELF_TEST
        const auto after = paths_of(h.gpu());
        CHECK(after.fp8_tensor_core - before.fp8_tensor_core == (f.tensor_cores ? 1 : 0));
        CHECK(after.fp8_emulated - before.fp8_emulated == (f.tensor_cores ? 0 : 1));
        CHECK(after.fp8_given_amax - before.fp8_given_amax == (with_a ? 1 : 0) + (with_b ? 1 : 0));
#endif
        expect_fp8_close(h, f, o.c);
        // 4x moves no e5m2 value into its subnormals (they start 2^-30 below its largest value),
        // so the result may not change; 1000x and 0.25x (saturation) must change it.
        if (factor != 4.0) CHECK(h.bytes(o.c.gpu) != own_result);
      }
    }
  }
}

TEST_CASE("cuda fp8 gemm with a given amax of +inf or NaN makes every output NaN") {
  Harness h;
  for (const bool tensor_cores : {true, false}) {
    for (const Given given : {Given::a, Given::b}) {
      for (const double bad : {static_cast<double>(INFINITY), std::nan("")}) {
        const Fp8Case f{
            Form::forward, tensor_cores ? 64 : 60, 64, 32, DType::e4m3, DType::e4m3, false,
            tensor_cores};
        Fp8Operands o = make_operands(h, f);
        h.gpu().fill(o.c.gpu, 0.0);  // not the harness's NaN poison: NaN must be written
        Twin amax = h.output(DType::f32, {1});
        h.upload(amax, {bad});
        for (const bool gpu : {false, true}) {
          GemmArgs g = shape_args(f, o.args(gpu));
          (given == Given::a ? g.amax_a : g.amax_b) = gpu ? amax.gpu : amax.cpu;
          (gpu ? h.gpu() : h.cpu()).gemm(g);
        }
        INFO(f.describe() << ", " << given_name(given) << " = " << bad);
        expect_all_nan(h, o.c);
      }
    }
  }
}

TEST_CASE("cuda gemm with the GELU epilogue matches the CPU's gemm + gelu_forward") {
  Harness h;
  struct GeluCase {
    int64_t m, n, k;
    DType dtype;
    bool bias;
    bool fused;           // the path it must take
    bool either = false;  // cuBLASLt may lack f32 GELU_AUX_BIAS: either path, printed
  };
  const GeluCase cases[] = {
      {256, 768, 128, DType::bf16, true, true},     {64, 256, 96, DType::bf16, false, true},
      {128, 512, 64, DType::f32, true, true, true}, {100, 100, 40, DType::bf16, true, false},
      {33, 52, 17, DType::f32, false, false},
  };
  for (const GeluCase& gc : cases) {
    Twin a = h.random(gc.dtype, {gc.m * gc.k}, 0, 0.05, 2.0);
    Twin b = h.random(gc.dtype, {gc.n * gc.k}, 0, 0.05, 2.0);
    Twin c = h.output(gc.dtype, {gc.m * gc.n});
    Twin pre = h.output(gc.dtype, {gc.m * gc.n});
    Twin bias;
    if (gc.bias) bias = h.random(gc.dtype, {gc.n});
    h.poison(c);
    h.poison(pre);
#ifndef GPU_COMPARE_SELF_TEST
    const auto before = paths_of(h.gpu());
#endif
    for (const bool gpu : {false, true}) {
      GemmArgs g;
      g.a = gpu ? a.gpu : a.cpu;
      g.b = gpu ? b.gpu : b.cpu;
      g.c = gpu ? c.gpu : c.cpu;
      g.pre_gelu = gpu ? pre.gpu : pre.cpu;
      if (gc.bias) g.bias = gpu ? bias.gpu : bias.cpu;
      g.m = gc.m, g.n = gc.n, g.k = gc.k, g.trans_b = true;
      g.epilogue = Epilogue::gelu;
      (gpu ? h.gpu() : h.cpu()).gemm(g);
    }
    INFO("m " << gc.m << " n " << gc.n << " k " << gc.k << " " << dtype_name(gc.dtype)
              << (gc.bias ? " bias" : ""));
#ifndef GPU_COMPARE_SELF_TEST
    const auto after = paths_of(h.gpu());
    const bool took_fused = after.gelu_fused - before.gelu_fused == 1;
    CHECK(after.gelu_fused - before.gelu_fused + after.gelu_unfused - before.gelu_unfused == 1);
    if (gc.either)
      WARN("GELU epilogue, " << dtype_name(gc.dtype) << (gc.bias ? " with bias" : "")
                             << ": cuBLASLt took the " << (took_fused ? "fused" : "unfused")
                             << " path (docs/cuda.md, GELU epilogue)");
    else
      CHECK(took_fused == gc.fused);
#endif
    GPU_EXPECT_CLOSE(h, pre, "pre_gelu");
    GPU_EXPECT_CLOSE(h, c, "c");
  }
}

TEST_CASE("cuda multi-tensor adamw matches the CPU bit for bit over many ranges") {
  Harness h;
  Backend::AdamW hyper = gpu_compare::adamw_hyper();
  // A few ranges with gaps (never touched) and odd starts (scalar path), and 250 small ranges
  // (several launches of the kernel's range table).
  std::vector<Backend::AdamWRange> few = {
      {0, 1000, true},    {1000, 1003, false}, {1003, 5000, true},   {5003, 9001, false},
      {9001, 9002, true}, {9010, 20000, true}, {20000, 20001, false}};
  std::vector<Backend::AdamWRange> many;
  for (int64_t i = 0; i < 250; ++i)
    many.push_back({i * 80 + (i % 3), i * 80 + 77, i % 4 != 0});
  struct Setup {
    DType param;
    bool master;
  };
  for (const Setup setup : {Setup{DType::bf16, true}, Setup{DType::f32, false},
                            Setup{DType::f16, true}, Setup{DType::bf16, false}}) {
    for (const auto* ranges : {&few, &many}) {
      const int64_t n = 20001;
      Twin param = h.random(setup.param, {n});
      Twin master = h.master_of(param, n, 0, setup.master);
      Twin grad = h.random(DType::f32, {n}, 0, 1e-4, 3.0);
      Twin m = h.output(DType::f32, {n});
      Twin v = h.output(DType::f32, {n});
      const trainctl::tensor::Tensor none;
      for (int64_t step = 1; step <= 3; ++step) {
        hyper.step = step;
        h.fill_random(grad, 1e-4, 3.0);
        h.cpu().adamw(param.cpu, setup.master ? master.cpu : none, grad.cpu, m.cpu, v.cpu, *ranges,
                      hyper);
        h.gpu().adamw(param.gpu, setup.master ? master.gpu : none, grad.gpu, m.gpu, v.gpu, *ranges,
                      hyper);
      }
      INFO(dtype_name(setup.param) << (setup.master ? " with" : " without") << " master, "
                                   << ranges->size() << " ranges, 3 steps");
      GPU_EXPECT_IDENTICAL(h, param, "param");
      GPU_EXPECT_IDENTICAL(h, m, "m");
      GPU_EXPECT_IDENTICAL(h, v, "v");
      if (setup.master) GPU_EXPECT_IDENTICAL(h, master, "master");
    }
  }
}

TEST_CASE("cuda multi-tensor adamw repeats bit for bit and rejects bad ranges") {
  Harness h;
  Backend::AdamW hyper{1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0, 1};
  const int64_t n = 4099;
  const std::vector<Backend::AdamWRange> ranges = {{0, 2000, true}, {2000, 4099, false}};
  Twin param0 = h.random(DType::bf16, {n});
  Twin grad = h.random(DType::f32, {n});
  std::vector<std::vector<unsigned char>> results;
  for (int run = 0; run < 2; ++run) {
    Twin param = h.output(DType::bf16, {n});
    Twin master = h.output(DType::f32, {n});
    Twin m = h.output(DType::f32, {n});
    Twin v = h.output(DType::f32, {n});
    h.gpu().cast(param.gpu, param0.gpu);
    h.gpu().cast(master.gpu, param0.gpu);
    h.gpu().adamw(param.gpu, master.gpu, grad.gpu, m.gpu, v.gpu, ranges, hyper);
    results.push_back(h.bytes(master.gpu));
  }
  CHECK(results[0] == results[1]);
  Twin m = h.output(DType::f32, {n});
  Twin v = h.output(DType::f32, {n});
  const std::vector<Backend::AdamWRange> overlapping = {{0, 100, true}, {50, 200, true}};
  const std::vector<Backend::AdamWRange> outside = {{0, n + 1, true}};
  const trainctl::tensor::Tensor none;
  CHECK_THROWS_WITH(h.gpu().adamw(grad.gpu, none, grad.gpu, m.gpu, v.gpu, overlapping, hyper),
                    Catch::Contains("range 1"));
  CHECK_THROWS_WITH(h.gpu().adamw(grad.gpu, none, grad.gpu, m.gpu, v.gpu, outside, hyper),
                    Catch::Contains("range 0"));
}
