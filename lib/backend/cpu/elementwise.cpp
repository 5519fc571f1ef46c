// CpuBackend's elementwise ops (cast, fill, add, accumulate, scale) and reductions (sum,
// sum_squares, all_finite, amax). Elementwise: computed in the destination's compute type, rounded
// once. Reductions: sequential or lane sums (fast_math.hpp) in double, the same bits on every run.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/fast_math.hpp"

namespace trainctl::backend::cpu {

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

void CpuBackend::do_copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src,
                                 int64_t src_col, int64_t cols) {
  const ScopedOp timed(timer_, OpFamily::elementwise);
  const size_t item = tensor::dtype_size(src.dtype);
  const int64_t rows = src.shape[0];
  const auto* from = static_cast<const char*>(src.data);
  auto* to = static_cast<char*>(dst.data);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(to + static_cast<size_t>(r * dst.shape[1] + dst_col) * item,
                from + static_cast<size_t>(r * src.shape[1] + src_col) * item,
                static_cast<size_t>(cols) * item);
}

void CpuBackend::do_cast(const Tensor& dst, const Tensor& src) {
  const ScopedOp timed(timer_, OpFamily::elementwise);
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

void CpuBackend::do_fill(const Tensor& dst, double value) {
  const ScopedOp timed(timer_, OpFamily::elementwise);
  dispatch_float(dst.dtype, "fill", "dst", [&]<class D>(Tag<D>) {
    const D v = tensor::store<D>(static_cast<compute_t<D>>(value));
    D* d = dst.as<D>();
    for (int64_t i = 0, count = dst.numel(); i < count; ++i)
      d[i] = v;
  });
}

void CpuBackend::do_add(const Tensor& out, const Tensor& a, const Tensor& b) {
  const ScopedOp timed(timer_, OpFamily::elementwise);
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

void CpuBackend::do_accumulate(const Tensor& dst, const Tensor& src) {
  const ScopedOp timed(timer_, OpFamily::elementwise);
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

void CpuBackend::do_scale(const Tensor& dst, double factor) {
  const ScopedOp timed(timer_, OpFamily::elementwise);
  dispatch_float(dst.dtype, "scale", "dst", [&]<class D>(Tag<D>) {
    using C = compute_t<D>;
    const C f = static_cast<C>(factor);
    D* d = dst.as<D>();
    for (int64_t i = 0, count = dst.numel(); i < count; ++i)
      d[i] = tensor::store<D>(tensor::load(d[i]) * f);
  });
}

// ---- reductions (sequential, double accumulation: the same bits on every run) -------------------

double CpuBackend::do_sum(const Tensor& src) {
  const ScopedOp timed(timer_, OpFamily::reduction);
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
double CpuBackend::do_sum_squares(const Tensor& src) {
  const ScopedOp timed(timer_, OpFamily::reduction);
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
bool CpuBackend::do_all_finite(const Tensor& src) {
  const ScopedOp timed(timer_, OpFamily::reduction);
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
void CpuBackend::do_amax(const Tensor& out, const Tensor& src) {
  const ScopedOp timed(timer_, OpFamily::reduction);
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

}  // namespace trainctl::backend::cpu
