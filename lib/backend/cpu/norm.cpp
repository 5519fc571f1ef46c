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

// x [N, C], C = weight.numel() (checked by Backend's wrapper).
NormDims norm_dims(const Tensor& x, const Tensor& weight) {
  const int64_t C = weight.numel();
  return {x.numel() / C, C};
}

}  // namespace

void CpuBackend::do_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& x, const Tensor& weight, const Tensor& bias,
                                      double eps) {
  const ScopedOp timed(timer_, OpFamily::norm);
  constexpr std::string_view op = "layernorm_forward";
  const auto [N, C] = norm_dims(x, weight);
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

void CpuBackend::do_layernorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                       const Tensor& dout, const Tensor& x, const Tensor& weight,
                                       const Tensor& mean, const Tensor& rstd) {
  const ScopedOp timed(timer_, OpFamily::norm);
  constexpr std::string_view op = "layernorm_backward";
  const auto [N, C] = norm_dims(x, weight);
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

void CpuBackend::do_rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x,
                                    const Tensor& weight, double eps) {
  const ScopedOp timed(timer_, OpFamily::norm);
  constexpr std::string_view op = "rmsnorm_forward";
  const auto [N, C] = norm_dims(x, weight);
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

void CpuBackend::do_rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                                     const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  const ScopedOp timed(timer_, OpFamily::norm);
  constexpr std::string_view op = "rmsnorm_backward";
  const auto [N, C] = norm_dims(x, weight);
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
