// CudaBackend::adamw: the multi-tensor AdamW kernel (kernels/adamw.cu) over the caller's ranges.
// The contract's checks ran in Backend's wrapper (backend_ops.cpp); here the CUDA backend's own
// (the parameter dtype it computes on).
//
// Numerics: the CPU backend's fp32 arithmetic operation for operation with one rounding per
// stored value, so it returns the same bits (tests/gpu/gpu_backend_test.cpp).
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "backend/cuda/cuda_args.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "kernels/adamw.cuh"

namespace trainctl::backend::cuda {

void CudaBackend::do_adamw(const Tensor& param, const Tensor& master, const Tensor& grad,
                           const Tensor& m, const Tensor& v, std::span<const AdamWRange> ranges,
                           const AdamW& hyper) {
  constexpr std::string_view op = "adamw";
  // Its own check: a dtype it computes on (so grad, m, v and master are f32, G).
  const auto param_type = storage_type(op, "param", param.dtype);
  // The same expressions, in the same types, as lib/backend/cpu/adamw.cpp: the kernel then
  // reproduces the CPU backend's bits.
  kernels::AdamWConstants k;
  const auto lr = static_cast<float>(hyper.lr);
  k.beta1 = static_cast<float>(hyper.beta1);
  k.beta2 = static_cast<float>(hyper.beta2);
  k.one_minus_beta1 = 1.0f - k.beta1;
  k.one_minus_beta2 = 1.0f - k.beta2;
  k.eps = static_cast<float>(hyper.eps);
  k.grad_scale = static_cast<float>(hyper.grad_scale);
  const auto t = static_cast<double>(hyper.step);
  const auto correction1 = static_cast<float>(1.0 - std::pow(hyper.beta1, t));
  const auto correction2 = static_cast<float>(1.0 - std::pow(hyper.beta2, t));
  k.step_size = lr / correction1;
  k.inv_correction2 = 1.0f / correction2;
  k.step = static_cast<uint64_t>(hyper.step);
  const auto decay_of = [&](bool decay) {
    return static_cast<float>(1.0 - hyper.lr * (decay ? hyper.weight_decay : 0.0));
  };
  // One span per range: callers pass their ranges already merged (train::AdamW joins adjacent
  // parameters of the same decay), so most steps are one launch of a few spans.
  std::vector<kernels::AdamWSpan> spans;
  spans.reserve(ranges.size());
  for (const AdamWRange& r : ranges)
    if (r.end > r.begin)
      spans.push_back({r.begin, r.end, decay_of(r.decay), r.key, r.global_begin, r.local_width,
                       r.global_width});
  if (spans.empty()) return;
  activate(*impl_, op);
  check_cuda(
      kernels::launch_adamw(param.data, param_type, master.empty() ? nullptr : master.as<float>(),
                            grad.as<float>(), m.data, v.data, m.dtype == tensor::DType::bf16,
                            spans.data(), static_cast<int64_t>(spans.size()), k, impl_->stream),
      op, "the AdamW kernel");
}

}  // namespace trainctl::backend::cuda
