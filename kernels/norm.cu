// LayerNorm / RMSNorm kernels. See norm.cuh for the contract.
#include <cstdint>

#include "kernels/check.cuh"
#include "kernels/norm.cuh"
#include "kernels/storage.cuh"

namespace trainctl::kernels {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kColumnThreads = 128;
constexpr int64_t kRowsPerChunk = 32;  // rows summed serially by one thread of the column kernel

int64_t rows_per_chunk(int64_t N) {
  // gridDim.y is at most 65535 chunks.
  const int64_t at_least = (N + 65534) / 65535;
  return at_least > kRowsPerChunk ? at_least : kRowsPerChunk;
}

int64_t num_chunks(int64_t N) {
  const int64_t rows = rows_per_chunk(N);
  return (N + rows - 1) / rows;
}

// kLayer: LayerNorm (subtract the mean, optional bias); else RMSNorm.
template <class St, bool kLayer>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    norm_forward_kernel(typename St::T* out, float* mean, float* rstd, const typename St::T* x,
                        const typename St::T* weight, const typename St::T* bias, int64_t N,
                        int64_t C, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (n >= N) return;
  const typename St::T* xr = x + n * C;
  float m = 0.0f;
  if constexpr (kLayer) {
    float s = 0.0f;
    for (int64_t c = lane; c < C; c += 32)
      s += St::load(xr[c]);
    m = warp_sum(s) / static_cast<float>(C);
  }
  float s2 = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = St::load(xr[c]) - m;
    s2 += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(s2) / static_cast<float>(C) + eps);
  typename St::T* o = out + n * C;
  for (int64_t c = lane; c < C; c += 32) {
    float y = (St::load(xr[c]) - m) * r * St::load(weight[c]);
    if (kLayer && bias) y += St::load(bias[c]);
    o[c] = St::store(y);
  }
  if (lane == 0) {
    if constexpr (kLayer) mean[n] = m;
    rstd[n] = r;
  }
}

// dx = r (dnorm - mean(dnorm) - xhat mean(dnorm xhat)), dnorm = dout * weight (LayerNorm);
// dx = r (dnorm - xhat mean(dnorm xhat)) (RMSNorm). Each element is read before it is written,
// by the same lane, so dx may alias dout.
template <class St, bool kLayer>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    norm_backward_dx_kernel(typename St::T* dx, const typename St::T* dout, const typename St::T* x,
                            const typename St::T* weight, const float* mean, const float* rstd,
                            int64_t N, int64_t C) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (n >= N) return;
  const typename St::T* xr = x + n * C;
  const typename St::T* dy = dout + n * C;
  const float m = kLayer ? mean[n] : 0.0f;
  const float r = rstd[n];
  float sum_dnorm = 0.0f, sum_dnorm_xhat = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float dnorm = St::load(dy[c]) * St::load(weight[c]);
    sum_dnorm += dnorm;
    sum_dnorm_xhat += dnorm * ((St::load(xr[c]) - m) * r);
  }
  const float dnorm_mean = kLayer ? warp_sum(sum_dnorm) / static_cast<float>(C) : 0.0f;
  const float dnorm_xhat_mean = warp_sum(sum_dnorm_xhat) / static_cast<float>(C);
  typename St::T* d = dx + n * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = (St::load(xr[c]) - m) * r;
    const float dnorm = St::load(dy[c]) * St::load(weight[c]);
    d[c] = St::store(r * (dnorm - dnorm_mean - xhat * dnorm_xhat_mean));
  }
}

// partial[chunk][c] = sum over the chunk's rows (in row order) of dout * xhat; with bias also
// partial[num_chunks + chunk][c] = sum of dout.
template <class St, bool kLayer>
__global__ void __launch_bounds__(kColumnThreads)
    norm_column_partials_kernel(float* partial, const typename St::T* dout, const typename St::T* x,
                                const float* mean, const float* rstd, int64_t N, int64_t C,
                                int64_t rows_per, bool with_bias) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumnThreads + threadIdx.x;
  if (c >= C) return;
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * rows_per;
  const int64_t end = begin + rows_per < N ? begin + rows_per : N;
  float sum_w = 0.0f, sum_b = 0.0f;
  for (int64_t n = begin; n < end; ++n) {
    const float g = St::load(dout[n * C + c]);
    const float xhat = (St::load(x[n * C + c]) - (kLayer ? mean[n] : 0.0f)) * rstd[n];
    sum_w += g * xhat;
    sum_b += g;
  }
  partial[chunk * C + c] = sum_w;
  if (with_bias) partial[(gridDim.y + chunk) * C + c] = sum_b;
}

// dweight[c] += sum over chunks in chunk order (and dbias likewise).
__global__ void __launch_bounds__(kColumnThreads)
    norm_column_finish_kernel(float* dweight, float* dbias, const float* partial, int64_t C,
                              int64_t chunks) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumnThreads + threadIdx.x;
  if (c >= C) return;
  float w = 0.0f;
  for (int64_t k = 0; k < chunks; ++k)
    w += partial[k * C + c];
  dweight[c] += w;
  if (dbias) {
    float b = 0.0f;
    for (int64_t k = 0; k < chunks; ++k)
      b += partial[(chunks + k) * C + c];
    dbias[c] += b;
  }
}

template <bool kLayer>
cudaError_t launch_forward(Storage storage, void* out, float* mean, float* rstd, const void* x,
                           const void* weight, const void* bias, int64_t N, int64_t C, float eps,
                           cudaStream_t stream) {
  if (N < 0 || C <= 0) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return dispatch_storage(storage, [&]<class St>(St) {
    using T = typename St::T;
    norm_forward_kernel<St, kLayer><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
        static_cast<T*>(out), mean, rstd, static_cast<const T*>(x), static_cast<const T*>(weight),
        static_cast<const T*>(bias), N, C, eps);
    return cudaGetLastError();
  });
}

template <bool kLayer>
cudaError_t launch_backward(Storage storage, void* dx, float* dweight, float* dbias,
                            const void* dout, const void* x, const void* weight, const float* mean,
                            const float* rstd, int64_t N, int64_t C, float* scratch,
                            cudaStream_t stream) {
  if (N < 0 || C <= 0) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  const auto row_blocks = static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const int64_t rows_per = rows_per_chunk(N);
  const int64_t chunks = num_chunks(N);
  const dim3 column_grid(static_cast<unsigned>((C + kColumnThreads - 1) / kColumnThreads),
                         static_cast<unsigned>(chunks));
  return dispatch_storage(storage, [&]<class St>(St) {
    using T = typename St::T;
    // The column sums read dout before dx (which may alias it) is written.
    norm_column_partials_kernel<St, kLayer><<<column_grid, kColumnThreads, 0, stream>>>(
        scratch, static_cast<const T*>(dout), static_cast<const T*>(x), mean, rstd, N, C, rows_per,
        dbias != nullptr);
    TRAINCTL_CUDA_RETURN(cudaGetLastError());
    norm_column_finish_kernel<<<column_grid.x, kColumnThreads, 0, stream>>>(dweight, dbias, scratch,
                                                                            C, chunks);
    TRAINCTL_CUDA_RETURN(cudaGetLastError());
    norm_backward_dx_kernel<St, kLayer><<<row_blocks, kWarpsPerBlock * 32, 0, stream>>>(
        static_cast<T*>(dx), static_cast<const T*>(dout), static_cast<const T*>(x),
        static_cast<const T*>(weight), mean, rstd, N, C);
    return cudaGetLastError();
  });
}

}  // namespace

size_t norm_backward_scratch_floats(int64_t N, int64_t C) {
  if (N <= 0 || C <= 0) return 1;
  return static_cast<size_t>(2 * num_chunks(N) * C);
}

cudaError_t launch_layernorm_forward(Storage storage, void* out, float* mean, float* rstd,
                                     const void* x, const void* weight, const void* bias, int64_t N,
                                     int64_t C, float eps, cudaStream_t stream) {
  return launch_forward<true>(storage, out, mean, rstd, x, weight, bias, N, C, eps, stream);
}

cudaError_t launch_layernorm_backward(Storage storage, void* dx, float* dweight, float* dbias,
                                      const void* dout, const void* x, const void* weight,
                                      const float* mean, const float* rstd, int64_t N, int64_t C,
                                      float* scratch, cudaStream_t stream) {
  return launch_backward<true>(storage, dx, dweight, dbias, dout, x, weight, mean, rstd, N, C,
                               scratch, stream);
}

cudaError_t launch_rmsnorm_forward(Storage storage, void* out, float* rstd, const void* x,
                                   const void* weight, int64_t N, int64_t C, float eps,
                                   cudaStream_t stream) {
  return launch_forward<false>(storage, out, nullptr, rstd, x, weight, nullptr, N, C, eps, stream);
}

cudaError_t launch_rmsnorm_backward(Storage storage, void* dx, float* dweight, const void* dout,
                                    const void* x, const void* weight, const float* rstd, int64_t N,
                                    int64_t C, float* scratch, cudaStream_t stream) {
  return launch_backward<false>(storage, dx, dweight, nullptr, dout, x, weight, nullptr, rstd, N, C,
                                scratch, stream);
}

}  // namespace trainctl::kernels
