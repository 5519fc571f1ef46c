// Momentum kernels. See momentum.cuh for the contract. The __f*_rn intrinsics spell out the CPU
// backend's order of operations and keep nvcc from fusing multiply-adds.
#include <algorithm>
#include <cstdint>

#include "kernels/check.cuh"
#include "kernels/momentum.cuh"
#include "kernels/vector_io.cuh"

namespace trainctl::kernels {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kBlocksPerSm = 8;

__device__ __forceinline__ float sign_of(float x) {
  return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
}

template <class P>
__global__ void __launch_bounds__(kThreadsPerBlock)
    momentum_kernel(P* __restrict__ param, float* __restrict__ master,
                    const float* __restrict__ grad, float* __restrict__ m, float* __restrict__ out,
                    const MomentumSpan span, const MomentumConstants k) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = span.begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < span.end; i += stride) {
    if (k.kind == MomentumKind::muon) {
      const float g = __fmul_rn(grad[i], k.grad_scale);
      const float mi = __fadd_rn(__fmul_rn(k.beta1, m[i]), g);
      m[i] = mi;
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
          const float mi = __fadd_rn(__fmul_rn(k.beta1, m[i]), g);
          m[i] = mi;
          const float d = k.nesterov ? __fadd_rn(g, __fmul_rn(k.beta1, mi)) : mi;
          next = __fsub_rn(w, __fmul_rn(k.lr, d));
        }
        break;
      }
      case MomentumKind::lion: {
        const float g = __fmul_rn(grad[i], k.grad_scale);
        const float c = __fadd_rn(__fmul_rn(k.beta1, m[i]), __fmul_rn(k.one_minus_beta1, g));
        m[i] = __fadd_rn(__fmul_rn(k.beta2, m[i]), __fmul_rn(k.one_minus_beta2, g));
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

template <class P>
cudaError_t run(P* param, float* master, const float* grad, float* m, float* out,
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
    momentum_kernel<P>
        <<<blocks, kThreadsPerBlock, 0, stream>>>(param, master, grad, m, out, spans[s], constants);
    TRAINCTL_CUDA_RETURN(cudaGetLastError());
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t launch_momentum(void* param, Storage param_type, float* master, const float* grad,
                            float* m, float* out, const MomentumSpan* spans, int64_t num_spans,
                            const MomentumConstants& constants, cudaStream_t stream) {
  if (num_spans < 0 || (num_spans > 0 && spans == nullptr)) return cudaErrorInvalidValue;
  for (int64_t s = 0; s < num_spans; ++s)
    if (spans[s].end < spans[s].begin) return cudaErrorInvalidValue;
  if (num_spans == 0) return cudaSuccess;
  const MomentumKind kind = constants.kind;
  if (param == nullptr || grad == nullptr ||
      (m == nullptr && (kind == MomentumKind::lion || kind == MomentumKind::muon)) ||
      (out == nullptr && kind == MomentumKind::muon))
    return cudaErrorInvalidValue;
  switch (param_type) {
    case Storage::f32:
      return run(static_cast<float*>(param), master, grad, m, out, spans, num_spans, constants,
                 stream);
    case Storage::bf16:
      return run(static_cast<Bf16*>(param), master, grad, m, out, spans, num_spans, constants,
                 stream);
    case Storage::f16:
      return run(static_cast<F16*>(param), master, grad, m, out, spans, num_spans, constants,
                 stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace trainctl::kernels
