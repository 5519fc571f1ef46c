// CudaBackend: mixture-of-experts routing and token permutation. The contract's checks ran in
// Backend's wrappers (backend_ops.cpp); here the CUDA backend's own (the dtypes it computes on, its
// kernels' limits), then the launch of kernels/moe.cu on the backend's stream.
//
// Only moe_router_forward synchronises: it returns the losses to the host.
// Slots live on the GPU and are not checked without a device round trip: the kernels never read
// or write out of bounds with a bad slot (kernels/moe.cuh).
#include <fmt/format.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "backend/cuda/cuda_args.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "kernels/moe.cuh"

namespace trainctl::backend::cuda {

using kernels::Storage;

namespace {

struct RouterDims {
  int64_t N, E, K;
};

// logits [N, E], top_k K (checked by Backend's wrapper); the kernels need a row.
RouterDims check_router(std::string_view op, const RouterArgs& r) {
  const RouterDims dims{r.logits.shape[0], r.logits.shape[1], r.top_k};
  if (dims.N <= 0) fail(op, "logits has no rows");
  return dims;
}

struct PermuteDims {
  int64_t N, K, C, R;
};

// tokens [N, C], expert rows [R, C], slot [N, K] (checked by Backend's wrapper).
PermuteDims permute_dims(const Tensor& tokens, const Tensor& experts, const Tensor& slot) {
  const int64_t N = tokens.shape[0], C = tokens.shape[1];
  return {N, slot.numel() / N, C, experts.numel() / C};
}

}  // namespace

RouterLosses CudaBackend::do_moe_router_forward(const RouterArgs& r) {
  constexpr std::string_view op = "moe_router_forward";
  const Storage s = storage_of(op, "logits", r.logits);
  const auto [N, E, K] = check_router(op, r);
  const int64_t capacity = r.capacity > 0 ? r.capacity : N;
  activate(*impl_, op);
  // scratch: [2E + 1] doubles of statistics, then N floats of lse.
  const size_t stats_bytes = static_cast<size_t>(2 * E + 1) * sizeof(double);
  const size_t lse_offset = (stats_bytes + 255) / 256 * 256;
  auto* base =
      static_cast<char*>(impl_->scratch_for(lse_offset + static_cast<size_t>(N) * sizeof(float)));
  auto* stats = reinterpret_cast<double*>(base);
  auto* lse = reinterpret_cast<float*>(base + lse_offset);
  check_cuda(
      kernels::launch_moe_router_forward(
          s, r.logits.data, f32(r.probs), static_cast<int32_t*>(r.expert_idx.data), f32(r.gates),
          static_cast<int32_t*>(r.slot.data), static_cast<int32_t*>(r.counts.data), f32(r.load), N,
          E, K, capacity, r.renormalize, lse, stats, impl_->stream),
      op, "the router kernels");
  std::vector<double> host(static_cast<size_t>(2 * E + 1));
  check_cuda(
      cudaMemcpyAsync(host.data(), stats, stats_bytes, cudaMemcpyDeviceToHost, impl_->stream), op,
      "cudaMemcpyAsync of the router statistics");
  check_cuda(cudaStreamSynchronize(impl_->stream), op, "cudaStreamSynchronize");
  // The CPU's formula and order: aux = E * sum_e load_e * (sum_n probs[n, e]) / N.
  RouterLosses losses;
  for (int64_t e = 0; e < E; ++e)
    losses.aux_loss += host[static_cast<size_t>(E + 1 + e)] * host[static_cast<size_t>(e)] /
                       static_cast<double>(N);
  losses.aux_loss *= static_cast<double>(E);
  losses.z_loss = host[static_cast<size_t>(E)] / static_cast<double>(N);
  return losses;
}

void CudaBackend::do_moe_router_backward(const Tensor& dlogits, const Tensor& dgates,
                                         const RouterArgs& r, double aux_coef, double z_coef,
                                         double grad_scale) {
  constexpr std::string_view op = "moe_router_backward";
  const Storage s = storage_of(op, "logits", r.logits);
  const auto [N, E, K] = check_router(op, r);
  activate(*impl_, op);
  check_cuda(kernels::launch_moe_router_backward(
                 s, dlogits.data, f32(dgates), r.logits.data, f32(r.probs), i32(r.expert_idx),
                 f32(r.load), N, E, K, r.renormalize, static_cast<float>(aux_coef),
                 static_cast<float>(z_coef), static_cast<float>(grad_scale), impl_->stream),
             op, "the router backward kernel");
}

void CudaBackend::do_moe_permute(const Tensor& expert_in, const Tensor& x, const Tensor& slot) {
  constexpr std::string_view op = "moe_permute";
  const Storage s = storage_of(op, "x", x);
  const auto [N, K, C, R] = permute_dims(x, expert_in, slot);
  activate(*impl_, op);
  check_cuda(
      kernels::launch_moe_permute(s, expert_in.data, x.data, i32(slot), N, K, C, R, impl_->stream),
      op, "the permute kernel");
}

void CudaBackend::do_moe_permute_backward(const Tensor& dx, const Tensor& dexpert_in,
                                          const Tensor& slot) {
  constexpr std::string_view op = "moe_permute_backward";
  const Storage s = storage_of(op, "dx", dx);
  const auto [N, K, C, R] = permute_dims(dx, dexpert_in, slot);
  activate(*impl_, op);
  check_cuda(kernels::launch_moe_permute_backward(s, dx.data, dexpert_in.data, i32(slot), N, K, C,
                                                  R, impl_->stream),
             op, "the permute backward kernel");
}

void CudaBackend::do_moe_unpermute(const Tensor& out, const Tensor& expert_out, const Tensor& gates,
                                   const Tensor& slot) {
  constexpr std::string_view op = "moe_unpermute";
  const Storage s = storage_of(op, "out", out);
  const auto [N, K, C, R] = permute_dims(out, expert_out, slot);
  activate(*impl_, op);
  check_cuda(kernels::launch_moe_unpermute(s, out.data, expert_out.data, f32(gates), i32(slot), N,
                                           K, C, R, impl_->stream),
             op, "the unpermute kernel");
}

void CudaBackend::do_moe_unpermute_backward(const Tensor& dexpert_out, const Tensor& dgates,
                                            const Tensor& dout, const Tensor& expert_out,
                                            const Tensor& gates, const Tensor& slot) {
  constexpr std::string_view op = "moe_unpermute_backward";
  const Storage s = storage_of(op, "dout", dout);
  const auto [N, K, C, R] = permute_dims(dout, expert_out, slot);
  activate(*impl_, op);
  check_cuda(kernels::launch_moe_unpermute_backward(s, dexpert_out.data, f32(dgates), dout.data,
                                                    expert_out.data, f32(gates), i32(slot), N, K, C,
                                                    R, impl_->stream),
             op, "the unpermute backward kernel");
}

}  // namespace trainctl::backend::cuda
