// Momentum kernels. See momentum.cuh for the contract. The __f*_rn intrinsics spell out the CPU
// backend's order of operations and keep nvcc from fusing multiply-adds.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/check.cuh"
#include "kernels/momentum.cuh"
#include "kernels/vector_io.cuh"
#include "tensor/stochastic_round.hpp"

namespace trainctl::kernels {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kBlocksPerSm = 8;

__device__ __forceinline__ float sign_of(float x) {
  return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
}

// The momentum of element i: f32, or bf16 bits (widened; stored stochastically rounded).
template <class T>
__device__ __forceinline__ float load_moment(const T* m, int64_t i) {
  if constexpr (std::is_same_v<T, float>)
    return m[i];
  else
    return bf16_bits_to_f32(m[i]);
}
template <class T>
__device__ __forceinline__ void store_moment(T* m, int64_t i, float x, const MomentumSpan& span,
                                             const MomentumConstants& k) {
  if constexpr (std::is_same_v<T, float>) {
    m[i] = x;
  } else {
    const int64_t global = tensor::range_global_index(i, span.begin, span.global_begin,
                                                      span.local_width, span.global_width);
    m[i] = tensor::bf16_stochastic(
        x, tensor::rounding_bits(span.key, static_cast<uint64_t>(global), k.step));
  }
}

template <class P, class T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    momentum_kernel(P* __restrict__ param, float* __restrict__ master,
                    const float* __restrict__ grad, T* __restrict__ m, float* __restrict__ out,
                    const MomentumSpan span, const MomentumConstants k) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = span.begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < span.end; i += stride) {
    if (k.kind == MomentumKind::muon) {
      const float g = __fmul_rn(grad[i], k.grad_scale);
      const float mi = __fadd_rn(__fmul_rn(k.beta1, load_moment(m, i)), g);
      store_moment(m, i, mi, span, k);
      out[i] = k.nesterov ? __fadd_rn(g, __fmul_rn(k.beta1, mi)) : mi;
      continue;
    }
    const float w = master != nullptr ? master[i] : load_float(param[i]);
    float next = w;
    switch (k.kind) {
      case MomentumKind::sgd: {
        const float g = __fadd_rn(__fmul_rn(grad[i], k.grad_scale),
                                  span.decayed ? __fmul_rn(k.weight_decay, w) : 0.0f);
        if (m == nullptr) {
          next = __fsub_rn(w, __fmul_rn(k.lr, g));
        } else {
          const float mi = __fadd_rn(__fmul_rn(k.beta1, load_moment(m, i)), g);
          store_moment(m, i, mi, span, k);
          const float d = k.nesterov ? __fadd_rn(g, __fmul_rn(k.beta1, mi)) : mi;
          next = __fsub_rn(w, __fmul_rn(k.lr, d));
        }
        break;
      }
      case MomentumKind::lion: {
        const float g = __fmul_rn(grad[i], k.grad_scale);
        const float m0 = load_moment(m, i);
        const float c = __fadd_rn(__fmul_rn(k.beta1, m0), __fmul_rn(k.one_minus_beta1, g));
        store_moment(m, i, __fadd_rn(__fmul_rn(k.beta2, m0), __fmul_rn(k.one_minus_beta2, g)), span,
                     k);
        next = __fsub_rn(__fmul_rn(w, span.decay), __fmul_rn(k.lr, sign_of(c)));
        break;
      }
      case MomentumKind::apply:
        next = __fsub_rn(__fmul_rn(w, span.decay), __fmul_rn(k.lr, grad[i]));
        break;
      case MomentumKind::muon:
        break;
    }
    if (master != nullptr) master[i] = next;
    param[i] = store_float<P>(next);
  }
}

template <class P, class T>
cudaError_t run(P* param, float* master, const float* grad, T* m, float* out,
                const MomentumSpan* spans, int64_t num_spans, const MomentumConstants& constants,
                cudaStream_t stream) {
  int device = 0;
  int num_sms = 0;
  TRAINCTL_CUDA_RETURN(cudaGetDevice(&device));
  TRAINCTL_CUDA_RETURN(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t most = static_cast<int64_t>(std::max(num_sms, 1)) * kBlocksPerSm;
  for (int64_t s = 0; s < num_spans; ++s) {
    const int64_t n = spans[s].end - spans[s].begin;
    if (n == 0) continue;
    const int64_t wanted = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
    const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(wanted, 1, most));
    momentum_kernel<P, T>
        <<<blocks, kThreadsPerBlock, 0, stream>>>(param, master, grad, m, out, spans[s], constants);
    TRAINCTL_CUDA_RETURN(cudaGetLastError());
  }
  return cudaSuccess;
}

template <class P>
cudaError_t run_state(P* param, float* master, const float* grad, void* m, bool bf16_state,
                      float* out, const MomentumSpan* spans, int64_t num_spans,
                      const MomentumConstants& constants, cudaStream_t stream) {
  if (bf16_state)
    return run(param, master, grad, static_cast<uint16_t*>(m), out, spans, num_spans, constants,
               stream);
  return run(param, master, grad, static_cast<float*>(m), out, spans, num_spans, constants, stream);
}

}  // namespace

cudaError_t launch_momentum(void* param, Storage param_type, float* master, const float* grad,
                            void* m, bool bf16_state, float* out, const MomentumSpan* spans,
                            int64_t num_spans, const MomentumConstants& constants,
                            cudaStream_t stream) {
  if (num_spans < 0 || (num_spans > 0 && spans == nullptr)) return cudaErrorInvalidValue;
  for (int64_t s = 0; s < num_spans; ++s)
    if (spans[s].end < spans[s].begin || spans[s].local_width < 1 || spans[s].global_width < 1)
      return cudaErrorInvalidValue;
  if (num_spans == 0) return cudaSuccess;
  const MomentumKind kind = constants.kind;
  if (param == nullptr || grad == nullptr ||
      (m == nullptr && (kind == MomentumKind::lion || kind == MomentumKind::muon)) ||
      (out == nullptr && kind == MomentumKind::muon))
    return cudaErrorInvalidValue;
  switch (param_type) {
    case Storage::f32:
      return run_state(static_cast<float*>(param), master, grad, m, bf16_state, out, spans,
                       num_spans, constants, stream);
    case Storage::bf16:
      return run_state(static_cast<Bf16*>(param), master, grad, m, bf16_state, out, spans,
                       num_spans, constants, stream);
    case Storage::f16:
      return run_state(static_cast<F16*>(param), master, grad, m, bf16_state, out, spans, num_spans,
                       constants, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace trainctl::kernels
