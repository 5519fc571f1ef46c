// GELU (tanh approximation, GPT-2) and SwiGLU, forward and backward. Elementwise: each output is
// computed in the compute type from loaded inputs and rounded once. Gradients are overwritten.
// Speed: tanhf costs ~20 ns, so for 16-bit storage GELU and its derivative are looked up in tables
// over all 65536 input bit patterns, filled once by the very same functions (bit-identical to
// computing them). For f32 storage (no table) GELU is computed as x * sigmoid(2u) with fast_exp
// (fast_math.hpp): the same function as 0.5 x (1 + tanh(u)), without its cancellation for x < 0,
// and it vectorises; relative error ~3e-7. f64 keeps std::tanh (the accurate reference).
#include <cmath>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/fast_math.hpp"

namespace trainctl::backend::cpu {

namespace {

template <class T>
constexpr T kGeluScale = static_cast<T>(0.7978845608028654);  // sqrt(2 / pi)
template <class T>
constexpr T kGeluCubic = static_cast<T>(0.044715);

// GELU of one stored value, rounded once to the storage type.
template <class S>
S gelu_value(S x) {
  using T = compute_t<S>;
  const T v = tensor::load(x);
  const T u = kGeluScale<T> * (v + kGeluCubic<T> * v * v * v);
  return tensor::store<S>(T(0.5) * v * (T(1) + std::tanh(u)));
}

// d GELU / dx in the compute type (the caller multiplies by dout and rounds once).
template <class T>
T gelu_derivative(T v) {
  const T u = kGeluScale<T> * (v + kGeluCubic<T> * v * v * v);
  const T t = std::tanh(u);
  const T du = kGeluScale<T> * (T(1) + T(3) * kGeluCubic<T> * v * v);
  return T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * du;
}

// f32 GELU through e = exp(-2u): s = sigmoid(2u) = 1 / (1 + e) = (1 + tanh u) / 2, so
// GELU = x s and d GELU / dx = s + 2 x du (e s) s  (1 - tanh^2 u = 4 s (1 - s), 1 - s = e s).
// -2u is clamped at 80 so e stays finite where s underflows (the derivative term is then ~0).
inline float fast_gelu(float v) {
  const float u = kGeluScale<float> * (v + kGeluCubic<float> * v * v * v);
  return v / (1.0f + fast_exp(-2.0f * u));
}

inline float fast_gelu_derivative(float v) {
  const float u = kGeluScale<float> * (v + kGeluCubic<float> * v * v * v);
  const float minus_2u = -2.0f * u;
  const float e = fast_exp(minus_2u < 80.0f ? minus_2u : 80.0f);
  const float s = 1.0f / (1.0f + e);
  const float du = kGeluScale<float> * (1.0f + 3.0f * kGeluCubic<float> * v * v);
  return s + (2.0f * v * du) * (e * s) * s;  // e s = 1 - s <= 1: no overflow
}

}  // namespace

void CpuBackend::do_gelu_forward(const Tensor& out, const Tensor& x) {
  const ScopedOp timed(timer_, OpFamily::activation);
  constexpr std::string_view op = "gelu_forward";
  const int64_t count = x.numel();
  dispatch_float(x.dtype, op, "x", [&]<class S>(Tag<S>) {
    const S* xs = x.as<S>();
    S* o = out.as<S>();
    if constexpr (sizeof(S) == 2) {
      const uint16_t* table = gelu_tables_.forward<S>();
      for (int64_t i = 0; i < count; ++i)
        o[i] = S{table[xs[i].bits]};
    } else if constexpr (std::is_same_v<S, float>) {
      for (int64_t i = 0; i < count; ++i)
        o[i] = fast_gelu(xs[i]);
    } else {
      for (int64_t i = 0; i < count; ++i)
        o[i] = gelu_value(xs[i]);
    }
  });
}

void CpuBackend::do_gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  const ScopedOp timed(timer_, OpFamily::activation);
  constexpr std::string_view op = "gelu_backward";
  const int64_t count = x.numel();
  dispatch_float(x.dtype, op, "x", [&]<class S>(Tag<S>) {
    const S* xs = x.as<S>();
    const S* dy = dout.as<S>();
    S* d = dx.as<S>();
    if constexpr (sizeof(S) == 2) {
      const float* table = gelu_tables_.derivative<S>();
      for (int64_t i = 0; i < count; ++i)
        d[i] = tensor::store<S>(table[xs[i].bits] * tensor::load(dy[i]));
    } else if constexpr (std::is_same_v<S, float>) {
      for (int64_t i = 0; i < count; ++i)
        d[i] = fast_gelu_derivative(xs[i]) * dy[i];
    } else {
      for (int64_t i = 0; i < count; ++i)
        d[i] = tensor::store<S>(gelu_derivative(tensor::load(xs[i])) * tensor::load(dy[i]));
    }
  });
}

// Every 16-bit pattern's GELU output and derivative, computed by the same functions the wide types
// use, so a lookup returns exactly the bits the formula would.
template <class S>
void GeluTables::build(std::vector<uint16_t>& forward, std::vector<float>& derivative) {
  forward.resize(65536);
  derivative.resize(65536);
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const S v{static_cast<uint16_t>(bits)};
    forward[bits] = gelu_value(v).bits;
    derivative[bits] = gelu_derivative(tensor::load(v));
  }
}

template <class S>
const uint16_t* GeluTables::forward() {
  auto& table = std::is_same_v<S, bf16> ? bf16_forward_ : f16_forward_;
  if (table.empty()) build<S>(table, std::is_same_v<S, bf16> ? bf16_derivative_ : f16_derivative_);
  return table.data();
}

template <class S>
const float* GeluTables::derivative() {
  auto& table = std::is_same_v<S, bf16> ? bf16_derivative_ : f16_derivative_;
  if (table.empty()) build<S>(std::is_same_v<S, bf16> ? bf16_forward_ : f16_forward_, table);
  return table.data();
}

void CpuBackend::do_swiglu_forward(const Tensor& out, const Tensor& gate_up) {
  const ScopedOp timed(timer_, OpFamily::activation);
  constexpr std::string_view op = "swiglu_forward";
  const int64_t F = out.shape[out.shape.rank - 1];
  const int64_t N = out.numel() / F;
  dispatch_float(out.dtype, op, "out", [&]<class S>(Tag<S>) {
    using T = compute_t<S>;
    for (int64_t n = 0; n < N; ++n) {
      const S* gate = gate_up.as<S>() + n * 2 * F;
      const S* up = gate + F;
      S* o = out.as<S>() + n * F;
      for (int64_t f = 0; f < F; ++f) {
        const T g = tensor::load(gate[f]);
        o[f] = tensor::store<S>(g * sigmoid_of(g) * tensor::load(up[f]));
      }
    }
  });
}

void CpuBackend::do_swiglu_backward(const Tensor& dgate_up, const Tensor& dout,
                                    const Tensor& gate_up) {
  const ScopedOp timed(timer_, OpFamily::activation);
  constexpr std::string_view op = "swiglu_backward";
  const int64_t F = dout.shape[dout.shape.rank - 1];
  const int64_t N = dout.numel() / F;
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
        const T s = sigmoid_of(g);
        // d silu(g) / dg = s (1 + g (1 - s)). Read both inputs before writing (in place is fine).
        dgate[f] = tensor::store<S>(d * u * s * (T(1) + g * (T(1) - s)));
        dup[f] = tensor::store<S>(d * g * s);
      }
    }
  });
}

}  // namespace trainctl::backend::cpu
