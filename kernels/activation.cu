// GELU / SwiGLU kernels. See activation.cuh for the contract. Grid-stride elementwise loops.
#include <cstdint>
#include <type_traits>

#include "kernels/activation.cuh"
#include "kernels/check.cuh"
#include "kernels/storage.cuh"

namespace trainctl::kernels {
namespace {

constexpr int kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

template <class St>
__device__ __forceinline__ float gelu(float v) {
  const float u = kGeluScale * (v + kGeluCubic * v * v * v);
  if constexpr (std::is_same_v<St, StoreF32>) {
    return v / (1.0f + expf(-2.0f * u));
  } else {
    return 0.5f * v * (1.0f + tanhf(u));
  }
}

template <class St>
__device__ __forceinline__ float gelu_derivative(float v) {
  const float u = kGeluScale * (v + kGeluCubic * v * v * v);
  const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
  if constexpr (std::is_same_v<St, StoreF32>) {
    // s = sigmoid(2u), e = exp(-2u): d/dx = s + 2 x du (e s) s; -2u clamped so e stays finite.
    const float minus_2u = -2.0f * u;
    const float e = expf(minus_2u < 80.0f ? minus_2u : 80.0f);
    const float s = 1.0f / (1.0f + e);
    return s + (2.0f * v * du) * (e * s) * s;
  } else {
    const float t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
  }
}

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

template <class St>
__global__ void __launch_bounds__(kThreads)
    gelu_forward_kernel(typename St::T* out, const typename St::T* x, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += stride)
    out[i] = St::store(gelu<St>(St::load(x[i])));
}

template <class St>
__global__ void __launch_bounds__(kThreads)
    gelu_backward_kernel(typename St::T* dx, const typename St::T* dout, const typename St::T* x,
                         int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += stride)
    dx[i] = St::store(gelu_derivative<St>(St::load(x[i])) * St::load(dout[i]));
}

template <class St>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(typename St::T* out, const typename St::T* gate_up, int64_t N,
                          int64_t F) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < N * F;
       i += stride) {
    const int64_t n = i / F, f = i % F;
    const float g = St::load(gate_up[n * 2 * F + f]);
    const float u = St::load(gate_up[n * 2 * F + F + f]);
    out[i] = St::store(g * sigmoid(g) * u);
  }
}

template <class St>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(typename St::T* dgate_up, const typename St::T* dout,
                           const typename St::T* gate_up, int64_t N, int64_t F) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < N * F;
       i += stride) {
    const int64_t n = i / F, f = i % F;
    const float g = St::load(gate_up[n * 2 * F + f]);
    const float u = St::load(gate_up[n * 2 * F + F + f]);
    const float d = St::load(dout[i]);
    const float s = sigmoid(g);
    // d silu(g) / dg = s (1 + g (1 - s)); both inputs are read above, so in place is fine.
    dgate_up[n * 2 * F + f] = St::store(d * u * s * (1.0f + g * (1.0f - s)));
    dgate_up[n * 2 * F + F + f] = St::store(d * g * s);
  }
}

}  // namespace

cudaError_t launch_gelu_forward(Storage storage, void* out, const void* x, int64_t count,
                                cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  return dispatch_storage(storage, [&]<class St>(St) {
    using T = typename St::T;
    gelu_forward_kernel<St><<<grid_for(count, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(x), count);
    return cudaGetLastError();
  });
}

cudaError_t launch_gelu_backward(Storage storage, void* dx, const void* dout, const void* x,
                                 int64_t count, cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  return dispatch_storage(storage, [&]<class St>(St) {
    using T = typename St::T;
    gelu_backward_kernel<St><<<grid_for(count, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(dx), static_cast<const T*>(dout), static_cast<const T*>(x), count);
    return cudaGetLastError();
  });
}

cudaError_t launch_swiglu_forward(Storage storage, void* out, const void* gate_up, int64_t N,
                                  int64_t F, cudaStream_t stream) {
  if (N < 0 || F < 0) return cudaErrorInvalidValue;
  if (N * F == 0) return cudaSuccess;
  return dispatch_storage(storage, [&]<class St>(St) {
    using T = typename St::T;
    swiglu_forward_kernel<St><<<grid_for(N * F, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(gate_up), N, F);
    return cudaGetLastError();
  });
}

cudaError_t launch_swiglu_backward(Storage storage, void* dgate_up, const void* dout,
                                   const void* gate_up, int64_t N, int64_t F, cudaStream_t stream) {
  if (N < 0 || F < 0) return cudaErrorInvalidValue;
  if (N * F == 0) return cudaSuccess;
  return dispatch_storage(storage, [&]<class St>(St) {
    using T = typename St::T;
    swiglu_backward_kernel<St><<<grid_for(N * F, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(dgate_up), static_cast<const T*>(dout), static_cast<const T*>(gate_up), N,
        F);
    return cudaGetLastError();
  });
}

}  // namespace trainctl::kernels
