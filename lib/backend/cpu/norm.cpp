// LayerNorm and RMSNorm over the last dim of [N, C], forward and backward.
// Contract (backend.hpp): dx is overwritten; dweight and dbias accumulate (+=). Statistics
// (mean, rstd) are stored in A = compute_t<S> and reused by backward.
// Row sums use lane_sum (fast_math.hpp): fixed order given C, and they vectorise.
#include <cmath>
#include <string_view>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/fast_math.hpp"

namespace trainctl::backend::cpu {

namespace {

struct NormDims {
  int64_t N, C;
};

NormDims check_norm(std::string_view op, const Tensor& x, const Tensor& weight) {
  expect_present(op, "x", x);
  expect_dtype(op, "weight", weight, x.dtype);
  const int64_t C = weight.numel();
  return {rows_of(op, "x", x, C), C};
}

}  // namespace

void CpuBackend::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   double eps) {
  const ScopedOp timed(timer_, OpFamily::norm);
  constexpr std::string_view op = "layernorm_forward";
  const auto [N, C] = check_norm(op, x, weight);
  expect_dtype(op, "out", out, x.dtype);
  expect_numel(op, "out", out, N * C);
  expect_dtype(op, "mean", mean, stats_dtype(x.dtype));
  expect_numel(op, "mean", mean, N);
  expect_dtype(op, "rstd", rstd, stats_dtype(x.dtype));
  expect_numel(op, "rstd", rstd, N);
  if (!bias.empty()) {
    expect_dtype(op, "bias", bias, x.dtype);
    expect_numel(op, "bias", bias, C);
  }
  dispatch_float(x.dtype, op, "x", [&]<class S>(Tag<S>) {
    using T = compute_t<S>;
    const S* w = weight.as<S>();
    const S* b = bias.empty() ? nullptr : bias.as<S>();
    for (int64_t n = 0; n < N; ++n) {
      const S* xr = x.as<S>() + n * C;
      S* o = out.as<S>() + n * C;
      const T m =
          lane_sum<T>(C, [&](int64_t c) { return tensor::load(xr[c]); }) / static_cast<T>(C);
      const T var = lane_sum<T>(C,
                                [&](int64_t c) {
                                  const T d = tensor::load(xr[c]) - m;
                                  return d * d;
                                }) /
                    static_cast<T>(C);
      const T r = T(1) / std::sqrt(var + static_cast<T>(eps));
      for (int64_t c = 0; c < C; ++c) {
        T y = (tensor::load(xr[c]) - m) * r * tensor::load(w[c]);
        if (b) y += tensor::load(b[c]);
        o[c] = tensor::store<S>(y);
      }
      mean.as<T>()[n] = m;
      rstd.as<T>()[n] = r;
    }
  });
}

void CpuBackend::layernorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                    const Tensor& dout, const Tensor& x, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd) {
  const ScopedOp timed(timer_, OpFamily::norm);
  constexpr std::string_view op = "layernorm_backward";
  const auto [N, C] = check_norm(op, x, weight);
  expect_dtype(op, "dx", dx, x.dtype);
  expect_numel(op, "dx", dx, N * C);
  expect_dtype(op, "dout", dout, x.dtype);
  expect_numel(op, "dout", dout, N * C);
  expect_dtype(op, "dweight", dweight, grad_dtype(x.dtype));
  expect_numel(op, "dweight", dweight, C);
  if (!dbias.empty()) {
    expect_dtype(op, "dbias", dbias, grad_dtype(x.dtype));
    expect_numel(op, "dbias", dbias, C);
  }
  expect_dtype(op, "mean", mean, stats_dtype(x.dtype));
  expect_numel(op, "mean", mean, N);
  expect_dtype(op, "rstd", rstd, stats_dtype(x.dtype));
  expect_numel(op, "rstd", rstd, N);
  dispatch_float(x.dtype, op, "x", [&]<class S>(Tag<S>) {
    using T = compute_t<S>;
    const S* w = weight.as<S>();
    T* dw = dweight.as<T>();
    T* db = dbias.empty() ? nullptr : dbias.as<T>();
    for (int64_t n = 0; n < N; ++n) {
      const S* xr = x.as<S>() + n * C;
      const S* dy = dout.as<S>() + n * C;
      S* dxr = dx.as<S>() + n * C;
      const T m = mean.as<T>()[n];
      const T r = rstd.as<T>()[n];
      // dx = r * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * weight.
      const T dnorm_mean =
          lane_sum<T>(C, [&](int64_t c) { return tensor::load(dy[c]) * tensor::load(w[c]); }) /
          static_cast<T>(C);
      const T dnorm_xhat_mean =
          lane_sum<T>(C,
                      [&](int64_t c) {
                        const T xhat = (tensor::load(xr[c]) - m) * r;
                        return tensor::load(dy[c]) * tensor::load(w[c]) * xhat;
                      }) /
          static_cast<T>(C);
      for (int64_t c = 0; c < C; ++c) {
        const T xhat = (tensor::load(xr[c]) - m) * r;
        const T g = tensor::load(dy[c]);
        dw[c] += g * xhat;
        if (db) db[c] += g;
        const T dnorm = g * tensor::load(w[c]);
        dxr[c] = tensor::store<S>(r * (dnorm - dnorm_mean - xhat * dnorm_xhat_mean));
      }
    }
  });
}

void CpuBackend::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x,
                                 const Tensor& weight, double eps) {
  const ScopedOp timed(timer_, OpFamily::norm);
  constexpr std::string_view op = "rmsnorm_forward";
  const auto [N, C] = check_norm(op, x, weight);
  expect_dtype(op, "out", out, x.dtype);
  expect_numel(op, "out", out, N * C);
  expect_dtype(op, "rstd", rstd, stats_dtype(x.dtype));
  expect_numel(op, "rstd", rstd, N);
  dispatch_float(x.dtype, op, "x", [&]<class S>(Tag<S>) {
    using T = compute_t<S>;
    const S* w = weight.as<S>();
    for (int64_t n = 0; n < N; ++n) {
      const S* xr = x.as<S>() + n * C;
      S* o = out.as<S>() + n * C;
      const T ms = lane_sum<T>(C, [&](int64_t c) {
        const T v = tensor::load(xr[c]);
        return v * v;
      });
      const T r = T(1) / std::sqrt(ms / static_cast<T>(C) + static_cast<T>(eps));
      for (int64_t c = 0; c < C; ++c)
        o[c] = tensor::store<S>(tensor::load(xr[c]) * r * tensor::load(w[c]));
      rstd.as<T>()[n] = r;
    }
  });
}

void CpuBackend::rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                                  const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  const ScopedOp timed(timer_, OpFamily::norm);
  constexpr std::string_view op = "rmsnorm_backward";
  const auto [N, C] = check_norm(op, x, weight);
  expect_dtype(op, "dx", dx, x.dtype);
  expect_numel(op, "dx", dx, N * C);
  expect_dtype(op, "dout", dout, x.dtype);
  expect_numel(op, "dout", dout, N * C);
  expect_dtype(op, "dweight", dweight, grad_dtype(x.dtype));
  expect_numel(op, "dweight", dweight, C);
  expect_dtype(op, "rstd", rstd, stats_dtype(x.dtype));
  expect_numel(op, "rstd", rstd, N);
  dispatch_float(x.dtype, op, "x", [&]<class S>(Tag<S>) {
    using T = compute_t<S>;
    const S* w = weight.as<S>();
    T* dw = dweight.as<T>();
    for (int64_t n = 0; n < N; ++n) {
      const S* xr = x.as<S>() + n * C;
      const S* dy = dout.as<S>() + n * C;
      S* dxr = dx.as<S>() + n * C;
      const T r = rstd.as<T>()[n];
      // dx = r * (dnorm - xhat * mean(dnorm * xhat)), dnorm = dout * weight, xhat = x * r.
      const T dnorm_xhat_mean =
          lane_sum<T>(C,
                      [&](int64_t c) {
                        return tensor::load(dy[c]) * tensor::load(w[c]) * tensor::load(xr[c]) * r;
                      }) /
          static_cast<T>(C);
      for (int64_t c = 0; c < C; ++c) {
        const T xhat = tensor::load(xr[c]) * r;
        const T g = tensor::load(dy[c]);
        dw[c] += g * xhat;
        dxr[c] = tensor::store<S>(r * (g * tensor::load(w[c]) - xhat * dnorm_xhat_mean));
      }
    }
  });
}

}  // namespace trainctl::backend::cpu
