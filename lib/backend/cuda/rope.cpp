// CudaBackend: rotary position embedding. The contract's checks ran in Backend's wrappers
// (backend_ops.cpp); here the CUDA backend's own (the dtypes it computes on, its kernels' limits),
// then the launch of kernels/rope.cu on the backend's stream.
#include <fmt/format.h>

#include <cstdint>
#include <string_view>

#include "backend/cuda/cuda_args.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "kernels/rope.cuh"

namespace trainctl::backend::cuda {

using kernels::Storage;

void CudaBackend::do_rope(const Tensor& out, const Tensor& x, int64_t T, int64_t rotated_heads,
                          int64_t D, double theta, bool inverse, const Tensor& positions) {
  constexpr std::string_view op = "rope";
  const Storage s = storage_of(op, "x", x);
  const int64_t N = x.shape[0];
  const int64_t width = N > 0 ? x.numel() / N : 0;
  activate(*impl_, op);
  auto* table =
      static_cast<float2*>(impl_->scratch_for(static_cast<size_t>(T * (D / 2)) * sizeof(float2)));
  check_cuda(
      kernels::launch_rope(s, out.data, x.data, N, width, T, rotated_heads, D, theta, inverse,
                           positions.empty() ? nullptr : i32(positions), table, impl_->stream),
      op, "the rope kernels");
}

}  // namespace trainctl::backend::cuda
