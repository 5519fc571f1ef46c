// AdamW kernel. See adamw.cuh for the contract. The __f*_rn intrinsics spell out the CPU
// backend's order of operations and keep nvcc from fusing multiply-adds, which would round once
// where the CPU rounds twice.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/adamw.cuh"
#include "kernels/check.cuh"
#include "kernels/vector_io.cuh"
#include "tensor/stochastic_round.hpp"

namespace trainctl::kernels {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kBlocksPerSm = 8;

// Updates m and v in place and returns the new weight.
__device__ __forceinline__ float adamw_update(float w, float g, float& m, float& v, float decay,
                                              const AdamWConstants& k) {
  const float gi = __fmul_rn(g, k.grad_scale);
  m = __fadd_rn(__fmul_rn(k.beta1, m), __fmul_rn(k.one_minus_beta1, gi));
  v = __fadd_rn(__fmul_rn(k.beta2, v), __fmul_rn(__fmul_rn(k.one_minus_beta2, gi), gi));
  const float denominator = __fadd_rn(__fsqrt_rn(__fmul_rn(v, k.inv_correction2)), k.eps);
  return __fsub_rn(__fmul_rn(w, decay), __fdiv_rn(__fmul_rn(k.step_size, m), denominator));
}

// The ranges of one launch, passed by value (kernel arguments live in constant memory).
struct SpanTable {
  int64_t begin[kAdamWRangesPerLaunch];
  int64_t end[kAdamWRangesPerLaunch];
  float decay[kAdamWRangesPerLaunch];
  bool vectorised[kAdamWRangesPerLaunch];
  uint64_t key[kAdamWRangesPerLaunch];
  int64_t global_begin[kAdamWRangesPerLaunch];
  int64_t local_width[kAdamWRangesPerLaunch];
  int64_t global_width[kAdamWRangesPerLaunch];
};

// A moment of element i: f32, or bf16 bits (widened; stored rounded with the 16 bits given).
template <bool kBf16>
struct Moments;
template <>
struct Moments<false> {
  using T = float;
  __device__ __forceinline__ static float load(const float* p, int64_t i) { return p[i]; }
  __device__ __forceinline__ static void store(float* p, int64_t i, float x, uint32_t) { p[i] = x; }
};
template <>
struct Moments<true> {
  using T = uint16_t;
  __device__ __forceinline__ static float load(const uint16_t* p, int64_t i) {
    return bf16_bits_to_f32(p[i]);
  }
  __device__ __forceinline__ static void store(uint16_t* p, int64_t i, float x, uint32_t r) {
    p[i] = tensor::bf16_stochastic(x, r);
  }
};

// blockIdx.y picks the range; the blocks along x stride over it.
template <class P, bool kBf16>
__global__ void __launch_bounds__(kThreadsPerBlock)
    adamw_kernel(P* __restrict__ param, float* __restrict__ master, const float* __restrict__ grad,
                 typename Moments<kBf16>::T* __restrict__ m,
                 typename Moments<kBf16>::T* __restrict__ v, const SpanTable spans,
                 const AdamWConstants k) {
  using M = Moments<kBf16>;
  const int s = static_cast<int>(blockIdx.y);
  const int64_t begin = spans.begin[s];
  const int64_t n = spans.end[s] - begin;
  const float decay = spans.decay[s];
  param += begin;
  if (master != nullptr) master += begin;
  grad += begin;
  m += begin;
  v += begin;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t scalar_begin = 0;
  if constexpr (!kBf16) {
    if (spans.vectorised[s]) {
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
          w[e] = adamw_update(w[e], g[e], mm[e], vv[e], decay, k);
        store_vector(m + base, mm);
        store_vector(v + base, vv);
        if (master != nullptr) store_vector(master + base, w);
        store_vector(param + base, w);
      }
      scalar_begin = num_vectors * kVectorElements;
    }
  }
  for (int64_t i = scalar_begin + thread; i < n; i += stride) {
    float mi = M::load(m, i);
    float vi = M::load(v, i);
    const float w0 = master != nullptr ? master[i] : load_float(param[i]);
    const float w = adamw_update(w0, grad[i], mi, vi, decay, k);
    uint32_t r = 0;
    if (kBf16) {
      const int64_t global = tensor::range_global_index(
          begin + i, begin, spans.global_begin[s], spans.local_width[s], spans.global_width[s]);
      r = tensor::rounding_bits(spans.key[s], static_cast<uint64_t>(global), k.step);
    }
    M::store(m, i, mi, r);
    M::store(v, i, vi, r >> 16);
    if (master != nullptr) master[i] = w;
    param[i] = store_float<P>(w);
  }
}

bool aligned_16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

template <class P, class T>
cudaError_t run(P* param, float* master, const float* grad, T* m, T* v, const AdamWSpan* spans,
                int64_t num_spans, const AdamWConstants& constants, cudaStream_t stream) {
  constexpr bool kBf16 = !std::is_same_v<T, float>;
  int device = 0;
  int num_sms = 0;
  TRAINCTL_CUDA_RETURN(cudaGetDevice(&device));
  TRAINCTL_CUDA_RETURN(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t most = static_cast<int64_t>(std::max(num_sms, 1)) * kBlocksPerSm;
  for (int64_t first = 0; first < num_spans; first += kAdamWRangesPerLaunch) {
    const int64_t count = std::min<int64_t>(num_spans - first, kAdamWRangesPerLaunch);
    SpanTable table{};
    int64_t items = 1;
    for (int64_t s = 0; s < count; ++s) {
      const AdamWSpan& span = spans[first + s];
      const int64_t b = span.begin;
      const bool vectorised = !kBf16 && aligned_16(param + b) && aligned_16(grad + b) &&
                              aligned_16(m + b) && aligned_16(v + b) &&
                              (master == nullptr || aligned_16(master + b));
      table.begin[s] = b;
      table.end[s] = span.end;
      table.decay[s] = span.decay;
      table.vectorised[s] = vectorised;
      table.key[s] = span.key;
      table.global_begin[s] = span.global_begin;
      table.local_width[s] = span.local_width;
      table.global_width[s] = span.global_width;
      const int64_t n = span.end - b;
      items = std::max(items, vectorised ? std::max<int64_t>(n / kVectorElements, 1) : n);
    }
    const int64_t wanted = (items + kThreadsPerBlock - 1) / kThreadsPerBlock;
    const dim3 grid(static_cast<unsigned>(std::clamp<int64_t>(wanted, 1, most)),
                    static_cast<unsigned>(count));
    adamw_kernel<P, kBf16>
        <<<grid, kThreadsPerBlock, 0, stream>>>(param, master, grad, m, v, table, constants);
    TRAINCTL_CUDA_RETURN(cudaGetLastError());
  }
  return cudaSuccess;
}

template <class P>
cudaError_t run_state(P* param, float* master, const float* grad, void* m, void* v, bool bf16_state,
                      const AdamWSpan* spans, int64_t num_spans, const AdamWConstants& constants,
                      cudaStream_t stream) {
  if (bf16_state)
    return run(param, master, grad, static_cast<uint16_t*>(m), static_cast<uint16_t*>(v), spans,
               num_spans, constants, stream);
  return run(param, master, grad, static_cast<float*>(m), static_cast<float*>(v), spans, num_spans,
             constants, stream);
}

}  // namespace

cudaError_t launch_adamw(void* param, Storage param_type, float* master, const float* grad, void* m,
                         void* v, bool bf16_state, const AdamWSpan* spans, int64_t num_spans,
                         const AdamWConstants& constants, cudaStream_t stream) {
  if (num_spans < 0 || (num_spans > 0 && spans == nullptr)) return cudaErrorInvalidValue;
  int64_t previous_end = 0;
  for (int64_t s = 0; s < num_spans; ++s) {
    if (spans[s].begin < previous_end || spans[s].end < spans[s].begin ||
        spans[s].local_width < 1 || spans[s].global_width < 1)
      return cudaErrorInvalidValue;
    previous_end = spans[s].end;
  }
  if (previous_end == 0) return cudaSuccess;
  if (param == nullptr || grad == nullptr || m == nullptr || v == nullptr)
    return cudaErrorInvalidValue;
  switch (param_type) {
    case Storage::f32:
      return run_state(static_cast<float*>(param), master, grad, m, v, bf16_state, spans, num_spans,
                       constants, stream);
    case Storage::bf16:
      return run_state(static_cast<Bf16*>(param), master, grad, m, v, bf16_state, spans, num_spans,
                       constants, stream);
    case Storage::f16:
      return run_state(static_cast<F16*>(param), master, grad, m, v, bf16_state, spans, num_spans,
                       constants, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace trainctl::kernels
