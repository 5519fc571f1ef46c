// CudaBackend: LayerNorm and RMSNorm, forward and backward. The contract's checks ran in Backend's
// wrappers (backend_ops.cpp); here the CUDA backend's own (the dtypes it computes on, its kernels'
// limits), then the launch of kernels/norm.cu on the backend's stream.
//
// Determinism: no float atomics; every reduction runs in an order fixed by the shapes, so repeats
// on one GPU are bit-identical (tests/gpu/gpu_layers_test.cpp checks each op twice).
#include <fmt/format.h>

#include <cstdint>
#include <string_view>

#include "backend/cuda/cuda_args.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "kernels/norm.cuh"

namespace trainctl::backend::cuda {

using kernels::Storage;

void CudaBackend::do_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                       const Tensor& x, const Tensor& weight, const Tensor& bias,
                                       double eps) {
  constexpr std::string_view op = "layernorm_forward";
  const Storage s = storage_of(op, "x", x);
  const int64_t C = weight.numel();
  const int64_t N = x.numel() / C;
  activate(*impl_, op);
  check_cuda(
      kernels::launch_layernorm_forward(s, out.data, f32(mean), f32(rstd), x.data, weight.data,
                                        bias.data, N, C, static_cast<float>(eps), impl_->stream),
      op, "the layernorm kernel");
}

void CudaBackend::do_layernorm_backward(const Tensor& dx, const Tensor& dweight,
                                        const Tensor& dbias, const Tensor& dout, const Tensor& x,
                                        const Tensor& weight, const Tensor& mean,
                                        const Tensor& rstd) {
  constexpr std::string_view op = "layernorm_backward";
  const Storage s = storage_of(op, "x", x);
  const int64_t C = weight.numel();
  const int64_t N = x.numel() / C;
  activate(*impl_, op);
  auto* scratch = static_cast<float*>(
      impl_->scratch_for(kernels::norm_backward_scratch_floats(N, C) * sizeof(float)));
  check_cuda(kernels::launch_layernorm_backward(s, dx.data, f32(dweight), f32(dbias), dout.data,
                                                x.data, weight.data, f32(mean), f32(rstd), N, C,
                                                scratch, impl_->stream),
             op, "the layernorm backward kernels");
}

void CudaBackend::do_rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x,
                                     const Tensor& weight, double eps) {
  constexpr std::string_view op = "rmsnorm_forward";
  const Storage s = storage_of(op, "x", x);
  const int64_t C = weight.numel();
  const int64_t N = x.numel() / C;
  activate(*impl_, op);
  check_cuda(kernels::launch_rmsnorm_forward(s, out.data, f32(rstd), x.data, weight.data, N, C,
                                             static_cast<float>(eps), impl_->stream),
             op, "the rmsnorm kernel");
}

void CudaBackend::do_rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                                      const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  constexpr std::string_view op = "rmsnorm_backward";
  const Storage s = storage_of(op, "x", x);
  const int64_t C = weight.numel();
  const int64_t N = x.numel() / C;
  activate(*impl_, op);
  auto* scratch = static_cast<float*>(
      impl_->scratch_for(kernels::norm_backward_scratch_floats(N, C) * sizeof(float)));
  check_cuda(kernels::launch_rmsnorm_backward(s, dx.data, f32(dweight), dout.data, x.data,
                                              weight.data, f32(rstd), N, C, scratch, impl_->stream),
             op, "the rmsnorm backward kernels");
}

}  // namespace trainctl::backend::cuda
