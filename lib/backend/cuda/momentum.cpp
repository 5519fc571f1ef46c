// CudaBackend::momentum_update and apply_update: the momentum kernel (kernels/momentum.cu) over
// the caller's ranges, with the constants computed as lib/backend/cpu/momentum.cpp computes them.
#include <span>
#include <string_view>
#include <vector>

#include "backend/cuda/cuda_args.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "kernels/momentum.cuh"

namespace trainctl::backend::cuda {

namespace {

std::vector<kernels::MomentumSpan> spans_of(std::span<const Backend::AdamWRange> ranges, double lr,
                                            double weight_decay) {
  std::vector<kernels::MomentumSpan> spans;
  spans.reserve(ranges.size());
  for (const Backend::AdamWRange& r : ranges)
    if (r.end > r.begin)
      spans.push_back({r.begin, r.end, r.decay,
                       static_cast<float>(1.0 - lr * (r.decay ? weight_decay : 0.0)), r.key,
                       r.global_begin, r.local_width, r.global_width});
  return spans;
}

}  // namespace

void CudaBackend::do_momentum_update(const Tensor& param, const Tensor& master, const Tensor& grad,
                                     const Tensor& m, const Tensor& out,
                                     std::span<const AdamWRange> ranges, const Momentum& hyper) {
  constexpr std::string_view op = "momentum_update";
  const auto param_type = storage_type(op, "param", param.dtype);
  kernels::MomentumConstants k;
  k.kind = hyper.rule == MomentumRule::sgd    ? kernels::MomentumKind::sgd
           : hyper.rule == MomentumRule::lion ? kernels::MomentumKind::lion
                                              : kernels::MomentumKind::muon;
  k.lr = static_cast<float>(hyper.lr);
  k.beta1 = static_cast<float>(hyper.beta1);
  k.beta2 = static_cast<float>(hyper.beta2);
  k.one_minus_beta1 = 1.0f - k.beta1;
  k.one_minus_beta2 = 1.0f - k.beta2;
  k.weight_decay = static_cast<float>(hyper.weight_decay);
  k.grad_scale = static_cast<float>(hyper.grad_scale);
  k.nesterov = hyper.nesterov;
  k.step = static_cast<uint64_t>(hyper.step);
  const std::vector<kernels::MomentumSpan> spans = spans_of(ranges, hyper.lr, hyper.weight_decay);
  if (spans.empty()) return;
  activate(*impl_, op);
  check_cuda(kernels::launch_momentum(
                 param.data, param_type, master.empty() ? nullptr : master.as<float>(),
                 grad.as<float>(), m.empty() ? nullptr : m.data, m.dtype == tensor::DType::bf16,
                 out.empty() ? nullptr : out.as<float>(), spans.data(),
                 static_cast<int64_t>(spans.size()), k, impl_->stream),
             op, "the momentum kernel");
}

void CudaBackend::do_apply_update(const Tensor& param, const Tensor& master, const Tensor& update,
                                  std::span<const AdamWRange> ranges, double lr,
                                  double weight_decay) {
  constexpr std::string_view op = "apply_update";
  const auto param_type = storage_type(op, "param", param.dtype);
  kernels::MomentumConstants k;
  k.kind = kernels::MomentumKind::apply;
  k.lr = static_cast<float>(lr);
  const std::vector<kernels::MomentumSpan> spans = spans_of(ranges, lr, weight_decay);
  if (spans.empty()) return;
  activate(*impl_, op);
  check_cuda(kernels::launch_momentum(param.data, param_type,
                                      master.empty() ? nullptr : master.as<float>(),
                                      update.as<float>(), nullptr, false, nullptr, spans.data(),
                                      static_cast<int64_t>(spans.size()), k, impl_->stream),
             op, "the momentum kernel");
}

}  // namespace trainctl::backend::cuda
