// GELU (tanh approximation, GPT-2) and SwiGLU, forward and backward. Elementwise: each output is
// computed in the compute type from loaded inputs and rounded once. Gradients are overwritten.
#include <cmath>
#include <string_view>

#include "backend/cpu/cpu_backend.hpp"

namespace trainctl::backend::cpu {

namespace {

template <class T>
constexpr T kGeluScale = static_cast<T>(0.7978845608028654);  // sqrt(2 / pi)
template <class T>
constexpr T kGeluCubic = static_cast<T>(0.044715);

template <class T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

void check_same(std::string_view op, std::string_view name, const Tensor& t, const Tensor& ref) {
  expect_dtype(op, name, t, ref.dtype);
  expect_numel(op, name, t, ref.numel());
}

}  // namespace

void CpuBackend::gelu_forward(const Tensor& out, const Tensor& x) {
  constexpr std::string_view op = "gelu_forward";
  expect_present(op, "x", x);
  check_same(op, "out", out, x);
  dispatch_float(x.dtype, op, "x", [&]<class S>(Tag<S>) {
    using T = compute_t<S>;
    const S* xs = x.as<S>();
    S* o = out.as<S>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const T v = tensor::load(xs[i]);
      const T u = kGeluScale<T> * (v + kGeluCubic<T> * v * v * v);
      o[i] = tensor::store<S>(T(0.5) * v * (T(1) + std::tanh(u)));
    }
  });
}

void CpuBackend::gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  constexpr std::string_view op = "gelu_backward";
  expect_present(op, "x", x);
  check_same(op, "dx", dx, x);
  check_same(op, "dout", dout, x);
  dispatch_float(x.dtype, op, "x", [&]<class S>(Tag<S>) {
    using T = compute_t<S>;
    const S* xs = x.as<S>();
    const S* dy = dout.as<S>();
    S* d = dx.as<S>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const T v = tensor::load(xs[i]);
      const T u = kGeluScale<T> * (v + kGeluCubic<T> * v * v * v);
      const T t = std::tanh(u);
      const T du = kGeluScale<T> * (T(1) + T(3) * kGeluCubic<T> * v * v);
      const T grad = T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * du;
      d[i] = tensor::store<S>(grad * tensor::load(dy[i]));
    }
  });
}

void CpuBackend::swiglu_forward(const Tensor& out, const Tensor& gate_up) {
  constexpr std::string_view op = "swiglu_forward";
  expect_present(op, "gate_up", gate_up);
  expect_dtype(op, "out", out, gate_up.dtype);
  if (out.shape.rank == 0) fail(op, "out must be [N, F]");
  const int64_t F = out.shape[out.shape.rank - 1];
  const int64_t N = rows_of(op, "out", out, F);
  expect_numel(op, "gate_up", gate_up, N * 2 * F);
  dispatch_float(out.dtype, op, "out", [&]<class S>(Tag<S>) {
    using T = compute_t<S>;
    for (int64_t n = 0; n < N; ++n) {
      const S* gate = gate_up.as<S>() + n * 2 * F;
      const S* up = gate + F;
      S* o = out.as<S>() + n * F;
      for (int64_t f = 0; f < F; ++f) {
        const T g = tensor::load(gate[f]);
        o[f] = tensor::store<S>(g * sigmoid(g) * tensor::load(up[f]));
      }
    }
  });
}

void CpuBackend::swiglu_backward(const Tensor& dgate_up, const Tensor& dout,
                                 const Tensor& gate_up) {
  constexpr std::string_view op = "swiglu_backward";
  expect_present(op, "gate_up", gate_up);
  expect_dtype(op, "dout", dout, gate_up.dtype);
  expect_dtype(op, "dgate_up", dgate_up, gate_up.dtype);
  expect_numel(op, "dgate_up", dgate_up, gate_up.numel());
  if (dout.shape.rank == 0) fail(op, "dout must be [N, F]");
  const int64_t F = dout.shape[dout.shape.rank - 1];
  const int64_t N = rows_of(op, "dout", dout, F);
  expect_numel(op, "gate_up", gate_up, N * 2 * F);
  dispatch_float(dout.dtype, op, "dout", [&]<class S>(Tag<S>) {
    using T = compute_t<S>;
    for (int64_t n = 0; n < N; ++n) {
      const S* gate = gate_up.as<S>() + n * 2 * F;
      const S* up = gate + F;
      const S* dy = dout.as<S>() + n * F;
      S* dgate = dgate_up.as<S>() + n * 2 * F;
      S* dup = dgate + F;
      for (int64_t f = 0; f < F; ++f) {
        const T g = tensor::load(gate[f]);
        const T u = tensor::load(up[f]);
        const T d = tensor::load(dy[f]);
        const T s = sigmoid(g);
        // d silu(g) / dg = s (1 + g (1 - s)). Read both inputs before writing (in place is fine).
        dgate[f] = tensor::store<S>(d * u * s * (T(1) + g * (T(1) - s)));
        dup[f] = tensor::store<S>(d * g * s);
      }
    }
  });
}

}  // namespace trainctl::backend::cpu
