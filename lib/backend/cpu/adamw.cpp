// AdamW (Loshchilov & Hutter; PyTorch's torch.optim.AdamW form) on one contiguous range:
//   g = grad * grad_scale
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   w = w (1 - lr wd);      w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// w is the master copy (G dtype: f32, or f64 for f64 storage) when given, and param = round(w);
// without a master the storage param itself is w. Computed in compute_t<S>.
#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.hpp"

namespace trainctl::backend::cpu {

void CpuBackend::adamw(const Tensor& param, const Tensor& master, const Tensor& grad,
                       const Tensor& m, const Tensor& v, const AdamW& hyper) {
  const ScopedOp timed(timer_, OpFamily::optimizer);
  constexpr std::string_view op = "adamw";
  expect_present(op, "param", param);
  const int64_t count = param.numel();
  const DType g_type = grad_dtype(param.dtype);
  expect_dtype(op, "grad", grad, g_type);
  expect_numel(op, "grad", grad, count);
  expect_dtype(op, "m", m, g_type);
  expect_numel(op, "m", m, count);
  expect_dtype(op, "v", v, g_type);
  expect_numel(op, "v", v, count);
  if (!master.empty()) {
    expect_dtype(op, "master", master, g_type);
    expect_numel(op, "master", master, count);
  }
  if (hyper.step < 1) fail(op, fmt::format("step={} must count from 1", hyper.step));
  dispatch_float(param.dtype, op, "param", [&]<class S>(Tag<S>) {
    using C = compute_t<S>;
    const C lr = static_cast<C>(hyper.lr);
    const C b1 = static_cast<C>(hyper.beta1), b2 = static_cast<C>(hyper.beta2);
    const C eps = static_cast<C>(hyper.eps);
    const C decay = static_cast<C>(1.0 - hyper.lr * hyper.weight_decay);
    const C gs = static_cast<C>(hyper.grad_scale);
    const auto t = static_cast<double>(hyper.step);
    const C correction1 = static_cast<C>(1.0 - std::pow(hyper.beta1, t));
    const C correction2 = static_cast<C>(1.0 - std::pow(hyper.beta2, t));
    const C* g = grad.as<C>();
    C* mm = m.as<C>();
    C* vv = v.as<C>();
    C* w = master.empty() ? nullptr : master.as<C>();
    S* p = param.as<S>();
    for (int64_t i = 0; i < count; ++i) {
      const C gi = g[i] * gs;
      mm[i] = b1 * mm[i] + (C(1) - b1) * gi;
      vv[i] = b2 * vv[i] + (C(1) - b2) * gi * gi;
      const C mhat = mm[i] / correction1;
      const C vhat = vv[i] / correction2;
      C value = w ? w[i] : tensor::load(p[i]);
      value = value * decay - lr * mhat / (std::sqrt(vhat) + eps);
      if (w) w[i] = value;
      p[i] = tensor::store<S>(value);
    }
  });
}

}  // namespace trainctl::backend::cpu
