// MoE kernels. See moe.cuh for the contract.
#include <cstdint>

#include "kernels/check.cuh"
#include "kernels/moe.cuh"
#include "kernels/storage.cuh"

namespace trainctl::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <class St>
__device__ float row_lse(const typename St::T* row, int64_t E) {
  float mx = -INFINITY;
  for (int64_t e = 0; e < E; ++e)
    mx = fmaxf(mx, St::load(row[e]));
  float total = 0.0f;
  for (int64_t e = 0; e < E; ++e)
    total += expf(St::load(row[e]) - mx);
  return mx + logf(total);
}

template <class St>
__global__ void __launch_bounds__(kThreads)
    router_tokens_kernel(const typename St::T* logits, float* probs, int32_t* idx, float* gates,
                         float* lse_out, int64_t N, int64_t E, int64_t K, bool renormalize) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (n >= N) return;
  const typename St::T* row = logits + n * E;
  float* p = probs + n * E;
  const float lse = row_lse<St>(row, E);
  for (int64_t e = 0; e < E; ++e)
    p[e] = expf(St::load(row[e]) - lse);
  lse_out[n] = lse;
  for (int64_t j = 0; j < K; ++j) {  // strict > keeps the lower index on ties
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i)
        taken = taken || idx[n * K + i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    idx[n * K + j] = static_cast<int32_t>(best);
    gates[n * K + j] = p[best];
  }
  if (renormalize) {  // the CPU's order: sum in choice order, then divide
    float chosen_sum = 0.0f;
    for (int64_t j = 0; j < K; ++j)
      chosen_sum += gates[n * K + j];
    for (int64_t j = 0; j < K; ++j)
      gates[n * K + j] /= chosen_sum;
  }
}

// Fixed-tree block sum of one double per thread; the result is valid in thread 0.
__device__ double block_sum(double v, double* shared) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kWarps; ++w)
      total += shared[w];
  __syncthreads();
  return total;
}

// One block per expert e: positions in priority order (assignment a = j * N + n).
__global__ void __launch_bounds__(kThreads)
    router_slots_kernel(const int32_t* idx, const float* probs, int32_t* slot, int32_t* counts,
                        float* load, double* stats, int64_t N, int64_t E, int64_t K,
                        int64_t capacity) {
  __shared__ int warp_counts[kWarps];
  __shared__ double warp_sums[kWarps];
  const int64_t e = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int64_t running = 0;
  for (int64_t base = 0; base < N * K; base += kThreads) {
    const int64_t a = base + threadIdx.x;
    const int64_t n = a % N, j = a / N;
    const bool mine = a < N * K && idx[n * K + j] == e;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int64_t before = running + __popc(ballot & ((1u << lane) - 1u));
    int64_t block_total = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) before += warp_counts[w];
      block_total += warp_counts[w];
    }
    if (mine)
      slot[n * K + j] = before < capacity ? static_cast<int32_t>(e * capacity + before) : -1;
    running += block_total;
    __syncthreads();
  }
  double sum = 0.0;
  for (int64_t n = threadIdx.x; n < N; n += kThreads)
    sum += static_cast<double>(probs[n * E + e]);
  sum = block_sum(sum, warp_sums);
  if (threadIdx.x == 0) {
    counts[e] = static_cast<int32_t>(running < capacity ? running : capacity);
    const float l = static_cast<float>(static_cast<double>(running) / static_cast<double>(N * K));
    load[e] = l;
    stats[e] = sum;
    stats[E + 1 + e] = static_cast<double>(l);
  }
}

__global__ void __launch_bounds__(kThreads)
    router_z_kernel(const float* lse, double* stats, int64_t N, int64_t E) {
  __shared__ double warp_sums[kWarps];
  double sum = 0.0;
  for (int64_t n = threadIdx.x; n < N; n += kThreads) {
    const double l = lse[n];
    sum += l * l;
  }
  sum = block_sum(sum, warp_sums);
  if (threadIdx.x == 0) stats[E] = sum;
}

template <class St>
__global__ void __launch_bounds__(kThreads)
    router_backward_kernel(typename St::T* dlogits, const float* dgates,
                           const typename St::T* logits, const float* probs, const int32_t* idx,
                           const float* load, int64_t N, int64_t E, int64_t K, bool renormalize,
                           float aux_coef, float z_coef, float grad_scale) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (n >= N) return;
  const float inv_n = 1.0f / static_cast<float>(N);
  const float aux = aux_coef * static_cast<float>(E) * inv_n;
  const float* p = probs + n * E;
  const float lse = row_lse<St>(logits + n * E, E);
  // Renormalised gates g_j = p_j / s: the chosen p_i get (dgate_i - sum_j dgate_j g_j) / s.
  float s = 1.0f, dot_g = 0.0f;
  if (renormalize) {
    s = 0.0f;
    for (int64_t j = 0; j < K; ++j)
      s += p[idx[n * K + j]];
    for (int64_t j = 0; j < K; ++j)
      dot_g += dgates[n * K + j] * p[idx[n * K + j]] / s;
  }
  // dprobs[e] = aux load[e] + the (renormalised) dgates of the choices of e, in choice order.
  auto dprobs = [&](int64_t e) {
    float d = aux * load[e];
    for (int64_t j = 0; j < K; ++j)
      if (idx[n * K + j] == e)
        d += renormalize ? (dgates[n * K + j] - dot_g) / s : dgates[n * K + j];
    return d;
  };
  float dot = 0.0f;
  for (int64_t e = 0; e < E; ++e)
    dot += p[e] * dprobs(e);
  const float z = z_coef * 2.0f * lse * inv_n;
  typename St::T* d = dlogits + n * E;
  for (int64_t e = 0; e < E; ++e)
    d[e] = St::store((p[e] * (dprobs(e) - dot) + z * p[e]) * grad_scale);
}

__device__ __forceinline__ bool kept(int32_t s, int64_t R) {
  return s >= 0 && s < R;
}

template <class St>
__global__ void __launch_bounds__(kThreads)
    permute_kernel(typename St::T* expert_in, const typename St::T* x, const int32_t* slot,
                   int64_t N, int64_t K, int64_t C, int64_t R) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < N * K * C;
       k += stride) {
    const int64_t a = k / C, c = k % C;
    const int32_t s = slot[a];
    if (kept(s, R)) expert_in[s * C + c] = x[(a / K) * C + c];
  }
}

template <class St>
__global__ void __launch_bounds__(kThreads)
    permute_backward_kernel(typename St::T* dx, const typename St::T* dexpert_in,
                            const int32_t* slot, int64_t N, int64_t K, int64_t C, int64_t R) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < N * C;
       k += stride) {
    const int64_t n = k / C, c = k % C;
    float total = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t s = slot[n * K + j];
      if (kept(s, R)) total += St::load(dexpert_in[s * C + c]);
    }
    dx[k] = St::store(total);
  }
}

template <class St>
__global__ void __launch_bounds__(kThreads)
    unpermute_kernel(typename St::T* out, const typename St::T* expert_out, const float* gates,
                     const int32_t* slot, int64_t N, int64_t K, int64_t C, int64_t R) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < N * C;
       k += stride) {
    const int64_t n = k / C, c = k % C;
    float total = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t s = slot[n * K + j];
      if (kept(s, R)) total += gates[n * K + j] * St::load(expert_out[s * C + c]);
    }
    out[k] = St::store(total);
  }
}

// One warp per assignment (n, j): dexpert_out row = gate * dout[n], dgates = dot(dout[n], row).
template <class St>
__global__ void __launch_bounds__(kThreads)
    unpermute_backward_kernel(typename St::T* dexpert_out, float* dgates,
                              const typename St::T* dout, const typename St::T* expert_out,
                              const float* gates, const int32_t* slot, int64_t N, int64_t K,
                              int64_t C, int64_t R) {
  const int64_t a = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (a >= N * K) return;
  const int32_t s = slot[a];
  if (!kept(s, R)) {
    if (lane == 0) dgates[a] = 0.0f;
    return;
  }
  const typename St::T* dy = dout + (a / K) * C;
  const typename St::T* eo = expert_out + static_cast<int64_t>(s) * C;
  typename St::T* de = dexpert_out + static_cast<int64_t>(s) * C;
  const float g = gates[a];
  float dot = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = St::load(dy[c]);
    dot += d * St::load(eo[c]);
    de[c] = St::store(g * d);
  }
  dot = warp_sum(dot);
  if (lane == 0) dgates[a] = dot;
}

size_t element_bytes(Storage storage) {
  return storage == Storage::f32 ? 4 : 2;
}

}  // namespace

cudaError_t launch_moe_router_forward(Storage storage, const void* logits, float* probs,
                                      int32_t* expert_idx, float* gates, int32_t* slot,
                                      int32_t* counts, float* load, int64_t N, int64_t E, int64_t K,
                                      int64_t capacity, bool renormalize, float* lse_scratch,
                                      double* stats, cudaStream_t stream) {
  if (N <= 0 || E <= 0 || K < 1 || K > E || capacity <= 0) return cudaErrorInvalidValue;
  const auto token_blocks = static_cast<unsigned>((N + kThreads - 1) / kThreads);
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    router_tokens_kernel<St>
        <<<token_blocks, kThreads, 0, stream>>>(static_cast<const Tp*>(logits), probs, expert_idx,
                                                gates, lse_scratch, N, E, K, renormalize);
    TRAINCTL_CUDA_RETURN(cudaGetLastError());
    router_slots_kernel<<<static_cast<unsigned>(E), kThreads, 0, stream>>>(
        expert_idx, probs, slot, counts, load, stats, N, E, K, capacity);
    TRAINCTL_CUDA_RETURN(cudaGetLastError());
    router_z_kernel<<<1, kThreads, 0, stream>>>(lse_scratch, stats, N, E);
    return cudaGetLastError();
  });
}

cudaError_t launch_moe_router_backward(Storage storage, void* dlogits, const float* dgates,
                                       const void* logits, const float* probs,
                                       const int32_t* expert_idx, const float* load, int64_t N,
                                       int64_t E, int64_t K, bool renormalize, float aux_coef,
                                       float z_coef, float grad_scale, cudaStream_t stream) {
  if (N <= 0 || E <= 0 || K < 1 || K > E) return cudaErrorInvalidValue;
  const auto token_blocks = static_cast<unsigned>((N + kThreads - 1) / kThreads);
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    router_backward_kernel<St><<<token_blocks, kThreads, 0, stream>>>(
        static_cast<Tp*>(dlogits), dgates, static_cast<const Tp*>(logits), probs, expert_idx, load,
        N, E, K, renormalize, aux_coef, z_coef, grad_scale);
    return cudaGetLastError();
  });
}

cudaError_t launch_moe_permute(Storage storage, void* expert_in, const void* x, const int32_t* slot,
                               int64_t N, int64_t K, int64_t C, int64_t R, cudaStream_t stream) {
  if (N < 0 || K < 0 || C <= 0 || R < 0) return cudaErrorInvalidValue;
  TRAINCTL_CUDA_RETURN(cudaMemsetAsync(expert_in, 0, R * C * element_bytes(storage), stream));
  if (N * K == 0) return cudaSuccess;
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    permute_kernel<St><<<grid_for(N * K * C, kThreads), kThreads, 0, stream>>>(
        static_cast<Tp*>(expert_in), static_cast<const Tp*>(x), slot, N, K, C, R);
    return cudaGetLastError();
  });
}

cudaError_t launch_moe_permute_backward(Storage storage, void* dx, const void* dexpert_in,
                                        const int32_t* slot, int64_t N, int64_t K, int64_t C,
                                        int64_t R, cudaStream_t stream) {
  if (N < 0 || K < 0 || C <= 0 || R < 0) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    permute_backward_kernel<St><<<grid_for(N * C, kThreads), kThreads, 0, stream>>>(
        static_cast<Tp*>(dx), static_cast<const Tp*>(dexpert_in), slot, N, K, C, R);
    return cudaGetLastError();
  });
}

cudaError_t launch_moe_unpermute(Storage storage, void* out, const void* expert_out,
                                 const float* gates, const int32_t* slot, int64_t N, int64_t K,
                                 int64_t C, int64_t R, cudaStream_t stream) {
  if (N < 0 || K < 0 || C <= 0 || R < 0) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    unpermute_kernel<St><<<grid_for(N * C, kThreads), kThreads, 0, stream>>>(
        static_cast<Tp*>(out), static_cast<const Tp*>(expert_out), gates, slot, N, K, C, R);
    return cudaGetLastError();
  });
}

cudaError_t launch_moe_unpermute_backward(Storage storage, void* dexpert_out, float* dgates,
                                          const void* dout, const void* expert_out,
                                          const float* gates, const int32_t* slot, int64_t N,
                                          int64_t K, int64_t C, int64_t R, cudaStream_t stream) {
  if (N < 0 || K < 0 || C <= 0 || R < 0) return cudaErrorInvalidValue;
  TRAINCTL_CUDA_RETURN(cudaMemsetAsync(dexpert_out, 0, R * C * element_bytes(storage), stream));
  if (N * K == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((N * K + kWarps - 1) / kWarps);
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    unpermute_backward_kernel<St><<<blocks, kThreads, 0, stream>>>(
        static_cast<Tp*>(dexpert_out), dgates, static_cast<const Tp*>(dout),
        static_cast<const Tp*>(expert_out), gates, slot, N, K, C, R);
    return cudaGetLastError();
  });
}

}  // namespace trainctl::kernels
