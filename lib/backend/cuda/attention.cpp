// CudaBackend: causal attention, forward and backward. The contract's checks ran in Backend's
// wrappers (backend_ops.cpp); here the CUDA backend's own (the dtypes it computes on, its kernels'
// limits), then the launch of kernels/attention.cu on the backend's stream.
//
// Determinism: no float atomics; every reduction runs in an order fixed by the shapes, so repeats
// on one GPU are bit-identical (tests/gpu/gpu_layers_test.cpp checks each op twice).
#include <fmt/format.h>

#include <cstdint>
#include <string_view>

#include "backend/cuda/cuda_args.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "kernels/attention.cuh"

namespace trainctl::backend::cuda {

using kernels::Storage;

namespace {

// The kernels' limits (the contract's checks ran in Backend's wrapper).
void check_attention(std::string_view op, const AttentionShape& a) {
  if (!kernels::attention_supported_head_size(a.D))
    fail(op, fmt::format("head size D={} has no CUDA attention kernel (32, 64 and 128 do): "
                         "choose hidden / heads among them, or run on the cpu backend",
                         a.D));
  if (a.B > 65535 || a.H > 65535)
    fail(op, fmt::format("B={} or H={} exceeds the 65535 blocks of a grid dimension", a.B, a.H));
}

}  // namespace

void CudaBackend::do_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                       const AttentionShape& shape) {
  constexpr std::string_view op = "attention_forward";
  check_attention(op, shape);
  const auto [B, T, H, KV, D] = shape;
  const Storage s = storage_of(op, "qkv", qkv);
  activate(*impl_, op);
  check_cuda(kernels::launch_attention_forward(s, out.data, f32(lse), qkv.data, B, T, H, KV, D,
                                               impl_->stream),
             op, "the attention kernel");
}

void CudaBackend::do_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                        const Tensor& out, const Tensor& lse,
                                        const AttentionShape& shape) {
  constexpr std::string_view op = "attention_backward";
  check_attention(op, shape);
  const auto [B, T, H, KV, D] = shape;
  const Storage s = storage_of(op, "qkv", qkv);
  activate(*impl_, op);
  auto* delta = static_cast<float*>(
      impl_->scratch_for(kernels::attention_backward_scratch_floats(B, H, T) * sizeof(float)));
  check_cuda(kernels::launch_attention_backward(s, dqkv.data, dout.data, qkv.data, out.data,
                                                f32(lse), B, T, H, KV, D, delta, impl_->stream),
             op, "the attention backward kernels");
}

void CudaBackend::do_attention_block_forward(const Tensor& out, const Tensor& lse,
                                             const Tensor& qkv, const Tensor& kv,
                                             const Tensor& q_pos, const Tensor& k_pos,
                                             const AttentionBlockShape& shape) {
  constexpr std::string_view op = "attention_block_forward";
  const auto [B, Tq, Tk, H, KV, D] = shape;
  check_attention(op, AttentionShape{B, Tq, H, KV, D});
  const Storage s = storage_of(op, "qkv", qkv);
  activate(*impl_, op);
  check_cuda(
      kernels::launch_attention_block_forward(s, f32(out), f32(lse), qkv.data, kv.data, i32(q_pos),
                                              i32(k_pos), B, Tq, Tk, H, KV, D, impl_->stream),
      op, "the attention block kernel");
}

void CudaBackend::do_attention_block_backward(const Tensor& dq, const Tensor& dkv,
                                              const Tensor& dout, const Tensor& qkv,
                                              const Tensor& kv, const Tensor& out,
                                              const Tensor& lse, const Tensor& q_pos,
                                              const Tensor& k_pos,
                                              const AttentionBlockShape& shape) {
  constexpr std::string_view op = "attention_block_backward";
  const auto [B, Tq, Tk, H, KV, D] = shape;
  check_attention(op, AttentionShape{B, Tq, H, KV, D});
  const Storage s = storage_of(op, "qkv", qkv);
  activate(*impl_, op);
  auto* delta = static_cast<float*>(
      impl_->scratch_for(kernels::attention_block_scratch_floats(B, H, Tq) * sizeof(float)));
  check_cuda(kernels::launch_attention_block_backward(
                 s, f32(dq), f32(dkv), dout.data, qkv.data, kv.data, f32(out), f32(lse), i32(q_pos),
                 i32(k_pos), B, Tq, Tk, H, KV, D, delta, impl_->stream),
             op, "the attention block backward kernels");
}

}  // namespace trainctl::backend::cuda
