// AdamW (Loshchilov & Hutter; PyTorch's torch.optim.AdamW form) over ranges of flat buffers:
//   g = grad * grad_scale
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   w = w (1 - lr wd);      w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// w is the master copy (G dtype: f32, or f64 for f64 storage) when given, and param = round(w);
// without a master the storage param itself is w. Computed in compute_t<S>.
// wd is hyper.weight_decay in ranges marked decay, else 0. bf16 m and v (f32 G only) are
// widened, updated in f32 and stored stochastically rounded (moment_chunks.hpp).
// Speed: one contiguous pass per range and case (with / without master) over restrict pointers,
// with the bias corrections folded into constants, so the loop vectorises (sqrt and divide
// included).
#include <cmath>
#include <span>
#include <string_view>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/moment_chunks.hpp"

namespace trainctl::backend::cpu {

void CpuBackend::do_adamw(const Tensor& param, const Tensor& master, const Tensor& grad,
                          const Tensor& m, const Tensor& v, std::span<const AdamWRange> ranges,
                          const AdamW& hyper) {
  const ScopedOp timed(timer_, OpFamily::optimizer);
  constexpr std::string_view op = "adamw";
  dispatch_float(param.dtype, op, "param", [&]<class S>(Tag<S>) {
    using C = compute_t<S>;
    const C lr = static_cast<C>(hyper.lr);
    const C b1 = static_cast<C>(hyper.beta1), b2 = static_cast<C>(hyper.beta2);
    const C eps = static_cast<C>(hyper.eps);
    const C gs = static_cast<C>(hyper.grad_scale);
    const auto t = static_cast<double>(hyper.step);
    const C correction1 = static_cast<C>(1.0 - std::pow(hyper.beta1, t));
    const C correction2 = static_cast<C>(1.0 - std::pow(hyper.beta2, t));
    const C step_size = lr / correction1;  // lr * mhat = step_size * m
    const C inv_correction2 = C(1) / correction2;
    const C* __restrict g = grad.as<C>();
    for_moment_chunks<C>(
        m, v, ranges, hyper.step,
        [&](const AdamWRange& range, int64_t first, int64_t last, C* __restrict mm,
            C* __restrict vv) {
          const C decay = static_cast<C>(1.0 - hyper.lr * (range.decay ? hyper.weight_decay : 0.0));
          // w_new = w * decay - step_size * m / (sqrt(v / correction2) + eps); mm, vv from first
          const auto update = [&](int64_t i, C w) {
            const C gi = g[i] * gs;
            const int64_t k = i - first;
            const C mi = b1 * mm[k] + (C(1) - b1) * gi;
            const C vi = b2 * vv[k] + (C(1) - b2) * gi * gi;
            mm[k] = mi;
            vv[k] = vi;
            return w * decay - step_size * mi / (std::sqrt(vi * inv_correction2) + eps);
          };
          update_run<S, C>(param, master, first, last, update);
        });
  });
}

}  // namespace trainctl::backend::cpu
