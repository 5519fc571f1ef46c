// Cross-entropy kernels. See loss.cuh for the contract.
#include <cstdint>

#include "kernels/check.cuh"
#include "kernels/loss.cuh"
#include "kernels/storage.cuh"

namespace trainctl::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct MaxSum {
  float max;
  float sum;  // sum of exp(x - max)
};

// (-inf, 0) is the empty pair; combining with it returns the other side exactly.
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  if (a.max == -INFINITY) return b;
  if (b.max == -INFINITY) return a;
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

template <class St>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_forward_kernel(float* losses, float* lse, const typename St::T* logits,
                                 const int32_t* targets, int64_t V) {
  __shared__ MaxSum warp_parts[kWarps];
  const int64_t n = blockIdx.x;
  const typename St::T* row = logits + n * V;
  MaxSum part{-INFINITY, 0.0f};
  for (int64_t j = threadIdx.x; j < V; j += kThreads) {
    const float v = St::load(row[j]);
    if (v == -INFINITY) continue;  // exp(-inf) = 0; skipping avoids (-inf) - (-inf)
    if (v > part.max) {
      part.sum = part.sum * expf(part.max - v) + 1.0f;
      part.max = v;
    } else {
      part.sum += expf(v - part.max);
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, part.max, offset),
                       __shfl_xor_sync(0xffffffffu, part.sum, offset)};
    part = combine(part, other);
  }
  if (threadIdx.x % 32 == 0) warp_parts[threadIdx.x / 32] = part;
  __syncthreads();
  if (threadIdx.x != 0) return;
  MaxSum total = warp_parts[0];
  for (int w = 1; w < kWarps; ++w)
    total = combine(total, warp_parts[w]);
  const float l = total.max + logf(total.sum);
  lse[n] = l;
  const int32_t target = targets[n];
  if (target < 0)
    losses[n] = 0.0f;
  else if (target >= V)
    losses[n] = __int_as_float(0x7fc00000);
  else
    losses[n] = l - St::load(row[target]);
}

template <class St>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward_kernel(typename St::T* dlogits, const typename St::T* logits,
                                  const float* lse, const int32_t* targets, int64_t V,
                                  int64_t vocab_begin, float grad_scale) {
  const int64_t n = blockIdx.x;
  const typename St::T* row = logits + n * V;
  typename St::T* d = dlogits + n * V;
  const int32_t target = targets[n];
  if (target < 0) {
    for (int64_t j = threadIdx.x; j < V; j += kThreads)
      d[j] = St::store(0.0f);
    return;
  }
  const float l = lse[n];
  const int64_t local = static_cast<int64_t>(target) - vocab_begin;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) {
    const float p = expf(St::load(row[j]) - l);
    d[j] = St::store((j == local ? p - 1.0f : p) * grad_scale);
  }
}

}  // namespace

cudaError_t launch_cross_entropy_forward(Storage storage, float* losses, float* lse,
                                         const void* logits, const int32_t* targets, int64_t N,
                                         int64_t V, cudaStream_t stream) {
  if (N < 0 || V <= 0 || N > INT32_MAX) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    cross_entropy_forward_kernel<St><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        losses, lse, static_cast<const Tp*>(logits), targets, V);
    return cudaGetLastError();
  });
}

cudaError_t launch_cross_entropy_backward(Storage storage, void* dlogits, const void* logits,
                                          const float* lse, const int32_t* targets, int64_t N,
                                          int64_t V, int64_t vocab_begin, float grad_scale,
                                          cudaStream_t stream) {
  if (N < 0 || V <= 0 || N > INT32_MAX) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    cross_entropy_backward_kernel<St><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        static_cast<Tp*>(dlogits), static_cast<const Tp*>(logits), lse, targets, V, vocab_begin,
        grad_scale);
    return cudaGetLastError();
  });
}

}  // namespace trainctl::kernels
