// CudaBackend: casts, elementwise ops and reductions: its own argument checks here, the kernels
// in kernels/{elementwise,reduce,fp8}.cu. Every op is enqueued on the backend's stream; the
// reductions that return a host value copy it back and so synchronise (amax does not).
//
// Numerics: cast, fill, add, accumulate, scale do the CPU backend's fp32 arithmetic
// operation for operation with one rounding per stored value, so they return the same bits.
// sum and sum_squares accumulate in double in a fixed tree order (not the CPU's sequential
// order): deterministic run to run, equal to the CPU's to about 1e-15 relative of sum |x|.
#include <fmt/format.h>

#include <cstdint>
#include <string_view>

#include "backend/cuda/cuda_args.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "kernels/check.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/fp8.cuh"
#include "kernels/reduce.cuh"

namespace trainctl::backend::cuda {

namespace {

// Where a reduction's device-side result lives in scratch; the partials follow at kPartials.
constexpr size_t kPartialsOffset = 256;

}  // namespace

void CudaBackend::do_cast(const Tensor& dst, const Tensor& src) {
  constexpr std::string_view op = "cast";
  const auto dst_type = storage_type(op, "dst", dst.dtype);
  const auto src_type = storage_type(op, "src", src.dtype);
  activate(*impl_, op);
  check_cuda(
      kernels::launch_cast(dst.data, dst_type, src.data, src_type, src.numel(), impl_->stream), op,
      "the cast kernel");
}

void CudaBackend::do_copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src,
                                  int64_t src_col, int64_t cols) {
  constexpr std::string_view op = "copy_columns";
  const size_t item = tensor::dtype_size(src.dtype);
  activate(*impl_, op);
  if (cols == 0 || src.shape[0] == 0) return;
  check_cuda(
      cudaMemcpy2DAsync(static_cast<char*>(dst.data) + dst_col * item,
                        static_cast<size_t>(dst.shape[1]) * item,
                        static_cast<const char*>(src.data) + src_col * item,
                        static_cast<size_t>(src.shape[1]) * item, static_cast<size_t>(cols) * item,
                        static_cast<size_t>(src.shape[0]), cudaMemcpyDeviceToDevice, impl_->stream),
      op, "cudaMemcpy2DAsync");
}

void CudaBackend::do_fill(const Tensor& dst, double value) {
  constexpr std::string_view op = "fill";
  const auto type = storage_type(op, "dst", dst.dtype);
  activate(*impl_, op);
  check_cuda(
      kernels::launch_fill(dst.data, type, static_cast<float>(value), dst.numel(), impl_->stream),
      op, "the fill kernel");
}

void CudaBackend::do_add(const Tensor& out, const Tensor& a, const Tensor& b) {
  constexpr std::string_view op = "add";
  const auto out_type = storage_type(op, "out", out.dtype);
  const auto a_type = storage_type(op, "a", a.dtype);
  const auto b_type = storage_type(op, "b", b.dtype);
  activate(*impl_, op);
  check_cuda(kernels::launch_add(out.data, out_type, a.data, a_type, b.data, b_type, out.numel(),
                                 impl_->stream),
             op, "the add kernel");
}

void CudaBackend::do_accumulate(const Tensor& dst, const Tensor& src) {
  constexpr std::string_view op = "accumulate";
  const auto dst_type = storage_type(op, "dst", dst.dtype);
  const auto src_type = storage_type(op, "src", src.dtype);
  activate(*impl_, op);
  check_cuda(kernels::launch_accumulate(dst.data, dst_type, src.data, src_type, dst.numel(),
                                        impl_->stream),
             op, "the accumulate kernel");
}

void CudaBackend::do_scale(const Tensor& dst, double factor) {
  constexpr std::string_view op = "scale";
  const auto type = storage_type(op, "dst", dst.dtype);
  activate(*impl_, op);
  check_cuda(
      kernels::launch_scale(dst.data, type, static_cast<float>(factor), dst.numel(), impl_->stream),
      op, "the scale kernel");
}

namespace {

double reduce(CudaBackend::Impl& impl, const Tensor& src, kernels::ReduceKind kind,
              std::string_view op) {
  const auto type = storage_type(op, "src", src.dtype);
  activate(impl, op);
  const size_t partial_bytes = kernels::reduce_scratch_bytes(src.numel());
  auto* scratch = static_cast<char*>(impl.scratch_for(kPartialsOffset + partial_bytes));
  auto* result = reinterpret_cast<double*>(scratch);
  check_cuda(kernels::launch_reduce(src.data, type, src.numel(), kind, scratch + kPartialsOffset,
                                    partial_bytes, result, impl.stream),
             op, "the reduction kernels");
  double host = 0;
  check_cuda(cudaMemcpyAsync(&host, result, sizeof(double), cudaMemcpyDeviceToHost, impl.stream),
             op, "copying the result back");
  check_cuda(cudaStreamSynchronize(impl.stream), op, "cudaStreamSynchronize");
  return host;
}

}  // namespace

double CudaBackend::do_sum(const Tensor& src) {
  return reduce(*impl_, src, kernels::ReduceKind::sum, "sum");
}

double CudaBackend::do_sum_squares(const Tensor& src) {
  return reduce(*impl_, src, kernels::ReduceKind::sum_squares, "sum_squares");
}

bool CudaBackend::do_all_finite(const Tensor& src) {
  constexpr std::string_view op = "all_finite";
  const auto type = storage_type(op, "src", src.dtype);
  activate(*impl_, op);
  auto* flag = static_cast<int*>(impl_->scratch_for(sizeof(int)));
  check_cuda(kernels::launch_all_finite(src.data, type, src.numel(), flag, impl_->stream), op,
             "the finiteness kernel");
  int host = 0;
  check_cuda(cudaMemcpyAsync(&host, flag, sizeof(int), cudaMemcpyDeviceToHost, impl_->stream), op,
             "copying the result back");
  check_cuda(cudaStreamSynchronize(impl_->stream), op, "cudaStreamSynchronize");
  return host == 0;
}

// Stays on the device (no copy back, no synchronisation): the GEMM that takes it as amax_a/amax_b
// runs after it on the same stream. A collective on another stream (NCCL's all_reduce_max) needs
// this stream synchronised first (nccl_communicator.hpp, "Buffers").
void CudaBackend::do_amax(const Tensor& out, const Tensor& src) {
  constexpr std::string_view op = "amax";
  const auto type = storage_type(op, "src", src.dtype);
  activate(*impl_, op);
  const int64_t n = src.numel();
  if (n == 0) {
    // The max over nothing is 0 (the CPU's starting value); +0.0f is all zero bytes.
    check_cuda(cudaMemsetAsync(out.data, 0, sizeof(float), impl_->stream), op, "cudaMemsetAsync");
    return;
  }
  const size_t bytes = kernels::fp8_amax_scratch_bytes(n);
  void* scratch = impl_->scratch_for(bytes);
  check_cuda(
      kernels::launch_fp8_amax(src.data, type, n, out.as<float>(), scratch, bytes, impl_->stream),
      op, "the amax kernels");
}

}  // namespace trainctl::backend::cuda
