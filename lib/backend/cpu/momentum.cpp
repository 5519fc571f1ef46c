// The momentum rules beside AdamW (Backend::momentum_update) and the update Muon applies
// (Backend::apply_update), over ranges of flat buffers as in adamw.cpp. Computed in compute_t<S>
// (f32, or f64 for f64 storage); w is the master copy when given and param = round(w).
//   sgd   g = gs grad + wd w;  m = mu m + g;  d = nesterov ? g + mu m : m;  w -= lr d
//   lion  g = gs grad;  c = b1 m + (1 - b1) g;  w = w (1 - lr wd) - lr sign(c);
//         m = b2 m + (1 - b2) g
//   muon  g = gs grad;  m = mu m + g;  out = nesterov ? g + mu m : m
//   apply w = w (1 - lr wd) - lr u
// wd is the rule's weight decay in ranges marked decay, else 0; (1 - lr wd) is computed in double
// and rounded once, as adamw.cpp does (kernels/momentum.cu computes the same bits). A bf16 m is
// widened, updated in f32 and stored stochastically rounded (moment_chunks.hpp).
#include <span>
#include <string_view>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/moment_chunks.hpp"

namespace trainctl::backend::cpu {

namespace {

template <class C>
C sign(C x) {
  return x > C(0) ? C(1) : (x < C(0) ? C(-1) : C(0));
}

}  // namespace

void CpuBackend::do_momentum_update(const Tensor& param, const Tensor& master, const Tensor& grad,
                                    const Tensor& m, const Tensor& out,
                                    std::span<const AdamWRange> ranges, const Momentum& hyper) {
  const ScopedOp timed(timer_, OpFamily::optimizer);
  constexpr std::string_view op = "momentum_update";
  dispatch_float(param.dtype, op, "param", [&]<class S>(Tag<S>) {
    using C = compute_t<S>;
    const C lr = static_cast<C>(hyper.lr);
    const C b1 = static_cast<C>(hyper.beta1), b2 = static_cast<C>(hyper.beta2);
    const C gs = static_cast<C>(hyper.grad_scale);
    const C wd = static_cast<C>(hyper.weight_decay);
    const C decay = static_cast<C>(1.0 - hyper.lr * hyper.weight_decay);  // lion
    const C* __restrict g = grad.as<C>();
    // m (bf16 or G, moment_chunks.hpp) of the run [first, last) from first; null when empty.
    for_moment_chunks<C>(
        m, Tensor{}, ranges, hyper.step,
        [&](const AdamWRange& range, int64_t first, int64_t last, C* __restrict mm, C*) {
          switch (hyper.rule) {
            case MomentumRule::sgd:
              update_run<S, C>(param, master, first, last, [&](int64_t i, C w) {
                const C gi = g[i] * gs + (range.decay ? wd * w : C(0));
                if (!mm) return w - lr * gi;
                const C mi = b1 * mm[i - first] + gi;
                mm[i - first] = mi;
                return w - lr * (hyper.nesterov ? gi + b1 * mi : mi);
              });
              break;
            case MomentumRule::lion:
              update_run<S, C>(param, master, first, last, [&](int64_t i, C w) {
                const C gi = g[i] * gs;
                const C c = b1 * mm[i - first] + (C(1) - b1) * gi;
                mm[i - first] = b2 * mm[i - first] + (C(1) - b2) * gi;
                return w * (range.decay ? decay : C(1)) - lr * sign(c);
              });
              break;
            case MomentumRule::muon: {
              C* __restrict o = out.as<C>();
              for (int64_t i = first; i < last; ++i) {
                const C gi = g[i] * gs;
                const C mi = b1 * mm[i - first] + gi;
                mm[i - first] = mi;
                o[i] = hyper.nesterov ? gi + b1 * mi : mi;
              }
              break;
            }
          }
        });
  });
}

void CpuBackend::do_apply_update(const Tensor& param, const Tensor& master, const Tensor& update,
                                 std::span<const AdamWRange> ranges, double lr,
                                 double weight_decay) {
  const ScopedOp timed(timer_, OpFamily::optimizer);
  constexpr std::string_view op = "apply_update";
  dispatch_float(param.dtype, op, "param", [&]<class S>(Tag<S>) {
    using C = compute_t<S>;
    const C rate = static_cast<C>(lr);
    const C kept = static_cast<C>(1.0 - lr * weight_decay);
    const C* __restrict u = update.as<C>();
    for (const AdamWRange& range : ranges)
      update_run<S, C>(param, master, range.begin, range.end, [&](int64_t i, C w) {
        return w * (range.decay ? kept : C(1)) - rate * u[i];
      });
  });
}

}  // namespace trainctl::backend::cpu
