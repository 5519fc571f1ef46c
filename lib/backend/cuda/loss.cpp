// CudaBackend: cross-entropy and its vocab-parallel backward. The contract's checks ran in
// Backend's wrappers (backend_ops.cpp); here the CUDA backend's own (the dtypes it computes on, its
// kernels' limits), then the launch of kernels/loss.cu on the backend's stream.
//
// Targets live on the GPU and are not checked without a device round trip: the kernels never read
// out of bounds with a bad target, and a target >= V yields a NaN loss, so the trainer's finite
// check stops the step (kernels/loss.cuh).
#include <fmt/format.h>

#include <cstdint>
#include <string_view>

#include "backend/cuda/cuda_args.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "kernels/loss.cuh"

namespace trainctl::backend::cuda {

using kernels::Storage;

namespace {

// N = targets.numel() rows of V logits (checked by Backend's wrapper), within one grid dimension.
int64_t check_logits(std::string_view op, const Tensor& logits, const Tensor& targets, int64_t& V) {
  const int64_t N = targets.numel();
  V = logits.numel() / N;
  if (N > INT32_MAX) fail(op, fmt::format("N={} rows exceed one grid dimension", N));
  return N;
}

}  // namespace

void CudaBackend::do_cross_entropy_forward(const Tensor& losses, const Tensor& lse,
                                           const Tensor& logits, const Tensor& targets) {
  constexpr std::string_view op = "cross_entropy_forward";
  const Storage s = storage_of(op, "logits", logits);
  int64_t V = 0;
  const int64_t N = check_logits(op, logits, targets, V);
  activate(*impl_, op);
  check_cuda(kernels::launch_cross_entropy_forward(s, f32(losses), f32(lse), logits.data,
                                                   i32(targets), N, V, impl_->stream),
             op, "the cross-entropy kernel");
}

void CudaBackend::do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits,
                                            const Tensor& lse, const Tensor& targets,
                                            double grad_scale) {
  do_cross_entropy_backward_shard(dlogits, logits, lse, targets, 0, grad_scale);
}

void CudaBackend::do_cross_entropy_backward_shard(const Tensor& dlogits, const Tensor& logits,
                                                  const Tensor& lse, const Tensor& targets,
                                                  int64_t vocab_begin, double grad_scale) {
  constexpr std::string_view op = "cross_entropy_backward";
  const Storage s = storage_of(op, "logits", logits);
  int64_t V = 0;
  const int64_t N = check_logits(op, logits, targets, V);
  activate(*impl_, op);
  check_cuda(kernels::launch_cross_entropy_backward(s, dlogits.data, logits.data, f32(lse),
                                                    i32(targets), N, V, vocab_begin,
                                                    static_cast<float>(grad_scale), impl_->stream),
             op, "the cross-entropy backward kernel");
}

}  // namespace trainctl::backend::cuda
