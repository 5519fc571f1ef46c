// CudaBackend: GELU and SwiGLU, forward and backward. The contract's checks ran in Backend's
// wrappers (backend_ops.cpp); here the CUDA backend's own (the dtypes it computes on, its kernels'
// limits), then the launch of kernels/activation.cu on the backend's stream.
#include <fmt/format.h>

#include <cstdint>
#include <string_view>

#include "backend/cuda/cuda_args.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "kernels/activation.cuh"

namespace trainctl::backend::cuda {

using kernels::Storage;

void CudaBackend::do_gelu_forward(const Tensor& out, const Tensor& x) {
  constexpr std::string_view op = "gelu_forward";
  const Storage s = storage_of(op, "x", x);
  activate(*impl_, op);
  check_cuda(kernels::launch_gelu_forward(s, out.data, x.data, x.numel(), impl_->stream), op,
             "the gelu kernel");
}

void CudaBackend::do_gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  constexpr std::string_view op = "gelu_backward";
  const Storage s = storage_of(op, "x", x);
  activate(*impl_, op);
  check_cuda(kernels::launch_gelu_backward(s, dx.data, dout.data, x.data, x.numel(), impl_->stream),
             op, "the gelu backward kernel");
}

void CudaBackend::do_swiglu_forward(const Tensor& out, const Tensor& gate_up) {
  constexpr std::string_view op = "swiglu_forward";
  const Storage s = storage_of(op, "gate_up", gate_up);
  const int64_t F = out.shape[out.shape.rank - 1];
  const int64_t N = out.numel() / F;
  activate(*impl_, op);
  check_cuda(kernels::launch_swiglu_forward(s, out.data, gate_up.data, N, F, impl_->stream), op,
             "the swiglu kernel");
}

void CudaBackend::do_swiglu_backward(const Tensor& dgate_up, const Tensor& dout,
                                     const Tensor& gate_up) {
  constexpr std::string_view op = "swiglu_backward";
  const Storage s = storage_of(op, "gate_up", gate_up);
  const int64_t F = dout.shape[dout.shape.rank - 1];
  const int64_t N = dout.numel() / F;
  activate(*impl_, op);
  check_cuda(kernels::launch_swiglu_backward(s, dgate_up.data, dout.data, gate_up.data, N, F,
                                             impl_->stream),
             op, "the swiglu backward kernel");
}

}  // namespace trainctl::backend::cuda
