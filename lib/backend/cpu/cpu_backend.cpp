// CpuBackend: argument checks, scratch, memory, elementwise ops and reductions.
#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/fast_math.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string_view>

namespace trainctl::backend {

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<cpu::CpuBackend>();
}

namespace cpu {

// ---- checks -------------------------------------------------------------------------------------

const ArgCheck kArgs{"cpu backend", Device::cpu, "is not in host memory"};

void fail(std::string_view op, const std::string& message) {
  kArgs.fail(op, message);
}

void fail_unsupported_dtype(std::string_view op, std::string_view name, DType dtype) {
  fail(op, fmt::format("{} has dtype {}, expected one of f64, f32, bf16, f16", name,
                       tensor::dtype_name(dtype)));
}

void expect_present(std::string_view op, std::string_view name, const Tensor& t) {
  kArgs.present(op, name, t);
}

void expect_dtype(std::string_view op, std::string_view name, const Tensor& t, DType expected) {
  kArgs.dtype(op, name, t, expected);
}

void expect_numel(std::string_view op, std::string_view name, const Tensor& t, int64_t expected) {
  kArgs.numel(op, name, t, expected);
}

int64_t rows_of(std::string_view op, std::string_view name, const Tensor& t, int64_t width) {
  return kArgs.rows(op, name, t, width);
}

void* ScratchPool::raw(size_t slot, size_t bytes) {
  tensor::Buffer& buffer = buffers_.at(slot);
  if (buffer.bytes() < bytes) buffer = tensor::Buffer(bytes + bytes / 2);  // grow by 1.5x
  return buffer.data();
}

// ---- construction, backend description and memory ----------------------------------------------

CpuBackend::CpuBackend() {
  const char* timing = std::getenv("TRAINCTL_OP_TIMING");
  print_timing_ = timing && std::string_view(timing) != "" && std::string_view(timing) != "0";
  timer_.enabled = print_timing_;
}

CpuBackend::~CpuBackend() {
  if (print_timing_)
    fmt::print(stderr, "cpu backend op timing (TRAINCTL_OP_TIMING):\n{}",
               format_op_stats(timer_.stats));
}

Capabilities CpuBackend::capabilities() const {
  Capabilities caps;
  caps.f64 = caps.f32 = caps.bf16 = caps.f16 = true;
  caps.fp8 = true;  // fp8 GEMM operands, quantized exactly as on Hopper and multiplied in f32
  return caps;
}

Allocation CpuBackend::allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded ? rounded : 64);
  return Allocation(this, p, bytes);
}

void CpuBackend::deallocate(void* data) {
  std::free(data);
}

void CpuBackend::copy_to_host(void* dst, const Tensor& src) {
  expect_present("copy_to_host", "src", src);
  std::memcpy(dst, src.data, src.bytes());
}

void CpuBackend::copy_from_host(const Tensor& dst, const void* src) {
  expect_present("copy_from_host", "dst", dst);
  std::memcpy(dst.data, src, dst.bytes());
}

// ---- elementwise
// ---------------------------------------------------------------------------------

namespace {

// fp8 values pass through float (set_element rounds once from float to the fp8 format); every
// other pair converts in the destination's compute type.
void cast_fp8(const Tensor& dst, const Tensor& src) {
  for (int64_t i = 0, count = src.numel(); i < count; ++i)
    tensor::set_element(dst, i, tensor::get_element(src, i));
}

bool is_fp8(DType d) {
  return d == DType::e4m3 || d == DType::e5m2;
}

}  // namespace

void CpuBackend::cast(const Tensor& dst, const Tensor& src) {
  const ScopedOp timed(timer_, OpFamily::elementwise);
  expect_numel("cast", "dst", dst, src.numel());
  if (!tensor::is_floating(dst.dtype) || !tensor::is_floating(src.dtype))
    fail("cast", fmt::format("only floating dtypes convert (dst {}, src {})",
                             tensor::dtype_name(dst.dtype), tensor::dtype_name(src.dtype)));
  if (is_fp8(dst.dtype) || is_fp8(src.dtype)) return cast_fp8(dst, src);
  dispatch_float(dst.dtype, "cast", "dst", [&]<class D>(Tag<D>) {
    dispatch_float(src.dtype, "cast", "src", [&]<class S>(Tag<S>) {
      const S* s = src.as<S>();
      D* d = dst.as<D>();
      for (int64_t i = 0, count = src.numel(); i < count; ++i)
        d[i] = tensor::store<D>(static_cast<compute_t<D>>(tensor::load(s[i])));
    });
  });
}

void CpuBackend::fill(const Tensor& dst, double value) {
  const ScopedOp timed(timer_, OpFamily::elementwise);
  expect_present("fill", "dst", dst);
  dispatch_float(dst.dtype, "fill", "dst", [&]<class D>(Tag<D>) {
    const D v = tensor::store<D>(static_cast<compute_t<D>>(value));
    D* d = dst.as<D>();
    for (int64_t i = 0, count = dst.numel(); i < count; ++i)
      d[i] = v;
  });
}

void CpuBackend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  const ScopedOp timed(timer_, OpFamily::elementwise);
  expect_numel("add", "a", a, out.numel());
  expect_numel("add", "b", b, out.numel());
  dispatch_float(out.dtype, "add", "out", [&]<class O>(Tag<O>) {
    dispatch_float(a.dtype, "add", "a", [&]<class SA>(Tag<SA>) {
      dispatch_float(b.dtype, "add", "b", [&]<class SB>(Tag<SB>) {
        using C = compute_t<O>;
        const SA* pa = a.as<SA>();
        const SB* pb = b.as<SB>();
        O* po = out.as<O>();
        for (int64_t i = 0, count = out.numel(); i < count; ++i)
          po[i] = tensor::store<O>(static_cast<C>(tensor::load(pa[i])) +
                                   static_cast<C>(tensor::load(pb[i])));
      });
    });
  });
}

void CpuBackend::accumulate(const Tensor& dst, const Tensor& src) {
  const ScopedOp timed(timer_, OpFamily::elementwise);
  expect_numel("accumulate", "src", src, dst.numel());
  dispatch_float(dst.dtype, "accumulate", "dst", [&]<class D>(Tag<D>) {
    dispatch_float(src.dtype, "accumulate", "src", [&]<class S>(Tag<S>) {
      using C = compute_t<D>;
      const S* s = src.as<S>();
      D* d = dst.as<D>();
      for (int64_t i = 0, count = dst.numel(); i < count; ++i)
        d[i] = tensor::store<D>(static_cast<C>(tensor::load(d[i])) +
                                static_cast<C>(tensor::load(s[i])));
    });
  });
}

void CpuBackend::scale(const Tensor& dst, double factor) {
  const ScopedOp timed(timer_, OpFamily::elementwise);
  expect_present("scale", "dst", dst);
  dispatch_float(dst.dtype, "scale", "dst", [&]<class D>(Tag<D>) {
    using C = compute_t<D>;
    const C f = static_cast<C>(factor);
    D* d = dst.as<D>();
    for (int64_t i = 0, count = dst.numel(); i < count; ++i)
      d[i] = tensor::store<D>(tensor::load(d[i]) * f);
  });
}

// ---- reductions (sequential, double accumulation: the same bits on every run) -------------------

double CpuBackend::sum(const Tensor& src) {
  const ScopedOp timed(timer_, OpFamily::reduction);
  expect_present("sum", "src", src);
  return dispatch_float(src.dtype, "sum", "src", [&]<class S>(Tag<S>) {
    const S* s = src.as<S>();
    double total = 0;
    for (int64_t i = 0, count = src.numel(); i < count; ++i)
      total += static_cast<double>(tensor::load(s[i]));
    return total;
  });
}

// kLanes double partial sums (lane_sum in fast_math.hpp): vectorises, and the order depends on the
// element count alone. Squares of f32/bf16/f16 values are exact in double, so only the additions
// round.
double CpuBackend::sum_squares(const Tensor& src) {
  const ScopedOp timed(timer_, OpFamily::reduction);
  expect_present("sum_squares", "src", src);
  return dispatch_float(src.dtype, "sum_squares", "src", [&]<class S>(Tag<S>) {
    const S* s = src.as<S>();
    return lane_sum<double>(src.numel(), [&](int64_t i) {
      const double v = tensor::load(s[i]);
      return v * v;
    });
  });
}

// x - x is 0 for finite x and NaN for inf or NaN; the lane sums of those stay 0 exactly when all
// elements are finite, and the loop vectorises (no early exit).
bool CpuBackend::all_finite(const Tensor& src) {
  const ScopedOp timed(timer_, OpFamily::reduction);
  expect_present("all_finite", "src", src);
  return dispatch_float(src.dtype, "all_finite", "src", [&]<class S>(Tag<S>) {
    using C = compute_t<S>;
    const S* s = src.as<S>();
    const C zero_if_finite = lane_sum<C>(src.numel(), [&](int64_t i) {
      const C v = tensor::load(s[i]);
      return v - v;
    });
    return zero_if_finite == 0;
  });
}

// Non-finite magnitudes become +inf before the max: std::max would keep or drop a NaN depending
// on its position, and +inf survives a max over ranks.
void CpuBackend::amax(const Tensor& out, const Tensor& src) {
  const ScopedOp timed(timer_, OpFamily::reduction);
  kArgs.amax(out, src);
  float result = 0.0f;
  dispatch_float(src.dtype, "amax", "src", [&]<class S>(Tag<S>) {
    const S* s = src.as<S>();
    for (int64_t i = 0, count = src.numel(); i < count; ++i) {
      const float a = std::fabs(static_cast<float>(tensor::load(s[i])));
      result = std::max(result, a <= std::numeric_limits<float>::max()
                                    ? a
                                    : std::numeric_limits<float>::infinity());
    }
  });
  *out.as<float>() = result;
}

}  // namespace cpu
}  // namespace trainctl::backend
