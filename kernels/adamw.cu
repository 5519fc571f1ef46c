// AdamW kernel. See adamw.cuh for the contract. The __f*_rn intrinsics spell out the CPU
// backend's order of operations and keep nvcc from fusing multiply-adds, which would round once
// where the CPU rounds twice.
#include <algorithm>
#include <cstdint>

#include "kernels/adamw.cuh"
#include "kernels/check.cuh"
#include "kernels/vector_io.cuh"

namespace trainctl::kernels {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kBlocksPerSm = 8;

// Updates m and v in place and returns the new weight.
__device__ __forceinline__ float adamw_update(float w, float g, float& m, float& v,
                                              const AdamWConstants& k) {
  const float gi = __fmul_rn(g, k.grad_scale);
  m = __fadd_rn(__fmul_rn(k.beta1, m), __fmul_rn(k.one_minus_beta1, gi));
  v = __fadd_rn(__fmul_rn(k.beta2, v), __fmul_rn(__fmul_rn(k.one_minus_beta2, gi), gi));
  const float denominator = __fadd_rn(__fsqrt_rn(__fmul_rn(v, k.inv_correction2)), k.eps);
  return __fsub_rn(__fmul_rn(w, k.decay), __fdiv_rn(__fmul_rn(k.step_size, m), denominator));
}

template <class P>
__global__ void __launch_bounds__(kThreadsPerBlock)
    adamw_kernel(P* __restrict__ param, float* __restrict__ master, const float* __restrict__ grad,
                 float* __restrict__ m, float* __restrict__ v, int64_t n, bool vectorised,
                 AdamWConstants k) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t scalar_begin = 0;
  if (vectorised) {
    const int64_t num_vectors = n / kVectorElements;
    for (int64_t vec = thread; vec < num_vectors; vec += stride) {
      const int64_t base = vec * kVectorElements;
      float w[kVectorElements], g[kVectorElements], mm[kVectorElements], vv[kVectorElements];
      if (master != nullptr) {
        load_vector(master + base, w);
      } else {
        load_vector(param + base, w);
      }
      load_vector(grad + base, g);
      load_vector(m + base, mm);
      load_vector(v + base, vv);
#pragma unroll
      for (int e = 0; e < kVectorElements; ++e)
        w[e] = adamw_update(w[e], g[e], mm[e], vv[e], k);
      store_vector(m + base, mm);
      store_vector(v + base, vv);
      if (master != nullptr) store_vector(master + base, w);
      store_vector(param + base, w);
    }
    scalar_begin = num_vectors * kVectorElements;
  }
  for (int64_t i = scalar_begin + thread; i < n; i += stride) {
    float mi = m[i];
    float vi = v[i];
    const float w0 = master != nullptr ? master[i] : load_float(param[i]);
    const float w = adamw_update(w0, grad[i], mi, vi, k);
    m[i] = mi;
    v[i] = vi;
    if (master != nullptr) master[i] = w;
    param[i] = store_float<P>(w);
  }
}

bool aligned_16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

template <class P>
cudaError_t run(P* param, float* master, const float* grad, float* m, float* v, int64_t n,
                const AdamWConstants& constants, cudaStream_t stream) {
  const bool vectorised = aligned_16(param) && aligned_16(grad) && aligned_16(m) && aligned_16(v) &&
                          (master == nullptr || aligned_16(master));
  int device = 0;
  int num_sms = 0;
  TRAINCTL_CUDA_RETURN(cudaGetDevice(&device));
  TRAINCTL_CUDA_RETURN(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t items = vectorised ? std::max<int64_t>(n / kVectorElements, 1) : n;
  const int64_t wanted = (items + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const int64_t most = static_cast<int64_t>(std::max(num_sms, 1)) * kBlocksPerSm;
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(wanted, 1, most));
  adamw_kernel<P><<<blocks, kThreadsPerBlock, 0, stream>>>(param, master, grad, m, v, n, vectorised,
                                                           constants);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_adamw(void* param, Storage param_type, float* master, const float* grad,
                         float* m, float* v, int64_t n, const AdamWConstants& constants,
                         cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (param == nullptr || grad == nullptr || m == nullptr || v == nullptr)
    return cudaErrorInvalidValue;
  switch (param_type) {
    case Storage::f32:
      return run(static_cast<float*>(param), master, grad, m, v, n, constants, stream);
    case Storage::bf16:
      return run(static_cast<Bf16*>(param), master, grad, m, v, n, constants, stream);
    case Storage::f16:
      return run(static_cast<F16*>(param), master, grad, m, v, n, constants, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace trainctl::kernels
