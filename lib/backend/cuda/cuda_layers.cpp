// CudaBackend: the layer ops (norms, activations, RoPE, attention, embedding, cross-entropy, MoE).
// Argument checks here (the CPU backend's checks, on shapes and dtypes), the kernels in
// kernels/{norm,activation,rope,attention,embedding,loss,moe}.cu. Every op is enqueued on the
// backend's stream; only moe_router_forward synchronises (it returns the losses to the host).
//
// What cannot be checked here without a device round trip: token and target ids and MoE slots
// live on the GPU. The kernels never read or write out of bounds with a bad id; a token outside
// a whole embedding table yields a NaN row and a target >= V a NaN loss, so the trainer's finite
// check stops the step (see kernels/embedding.cuh and kernels/loss.cuh).
//
// Determinism: no float atomics; every reduction runs in an order fixed by the shapes, so repeats
// on one GPU are bit-identical (tests/gpu/gpu_layers_test.cpp checks each op twice).
#include <fmt/format.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "backend/cuda/cuda_args.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "kernels/activation.cuh"
#include "kernels/attention.cuh"
#include "kernels/embedding.cuh"
#include "kernels/loss.cuh"
#include "kernels/moe.cuh"
#include "kernels/norm.cuh"
#include "kernels/rope.cuh"

namespace trainctl::backend::cuda {

namespace {

using kernels::Storage;

void activate(const CudaBackend::Impl& impl, std::string_view op) {
  check_cuda(cudaSetDevice(impl.device), op, fmt::format("cudaSetDevice({})", impl.device));
}

// The kernel type of t's dtype: the CUDA backend's own check (f32, bf16 or f16; so the
// statistics and gradients, A and G, are f32).
Storage storage_of(std::string_view op, std::string_view name, const Tensor& t) {
  return storage_type(op, name, t.dtype);
}

float* f32(const Tensor& t) {
  return t.empty() ? nullptr : static_cast<float*>(t.data);
}
const int32_t* i32(const Tensor& t) {
  return static_cast<const int32_t*>(t.data);
}

}  // namespace

// ---- norms ---------------------------------------------------------------------------------

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

// ---- activations ---------------------------------------------------------------------------

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

// ---- RoPE ----------------------------------------------------------------------------------

void CudaBackend::do_rope(const Tensor& out, const Tensor& x, int64_t T, int64_t rotated_heads,
                          int64_t D, double theta, bool inverse) {
  constexpr std::string_view op = "rope";
  const Storage s = storage_of(op, "x", x);
  const int64_t N = x.shape[0];
  const int64_t width = N > 0 ? x.numel() / N : 0;
  activate(*impl_, op);
  auto* table =
      static_cast<float2*>(impl_->scratch_for(static_cast<size_t>(T * (D / 2)) * sizeof(float2)));
  check_cuda(kernels::launch_rope(s, out.data, x.data, N, width, T, rotated_heads, D, theta,
                                  inverse, table, impl_->stream),
             op, "the rope kernels");
}

// ---- attention -----------------------------------------------------------------------------

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

// ---- embeddings ----------------------------------------------------------------------------

namespace {

struct EmbeddingDims {
  int64_t N, C, V;
};

// table [V, C], N tokens (checked by Backend's wrapper).
EmbeddingDims embedding_dims(const Tensor& table, const Tensor& tokens) {
  return {tokens.numel(), table.shape[1], table.shape[0]};
}

}  // namespace

void CudaBackend::do_embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                       const Tensor& wpe, int64_t T) {
  do_embedding_forward_shard(out, tokens, wte, wpe, T, -1);
}

void CudaBackend::do_embedding_forward_shard(const Tensor& out, const Tensor& tokens,
                                             const Tensor& wte, const Tensor& wpe, int64_t T,
                                             int64_t vocab_begin) {
  // vocab_begin -1 marks the whole-table lookup (embedding_forward): rows start at 0 and a token
  // outside the table is an error (NaN row), not another rank's row.
  const bool shard = vocab_begin >= 0;
  const std::string_view op = shard ? "embedding_forward_shard" : "embedding_forward";
  const Storage s = storage_of(op, "wte", wte);
  const auto [N, C, V] = embedding_dims(wte, tokens);
  activate(*impl_, op);
  check_cuda(kernels::launch_embedding_forward(s, out.data, i32(tokens), wte.data, wpe.data, N, C,
                                               V, T, shard ? vocab_begin : 0, shard, impl_->stream),
             op, "the embedding kernel");
}

void CudaBackend::do_embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                        const Tensor& tokens, int64_t T) {
  do_embedding_backward_shard(dwte, dwpe, dout, tokens, T, -1);
}

void CudaBackend::do_embedding_backward_shard(const Tensor& dwte, const Tensor& dwpe,
                                              const Tensor& dout, const Tensor& tokens, int64_t T,
                                              int64_t vocab_begin) {
  const bool shard = vocab_begin >= 0;
  const std::string_view op = shard ? "embedding_backward_shard" : "embedding_backward";
  const Storage s = storage_of(op, "dout", dout);
  const auto [N, C, V] = embedding_dims(dwte, tokens);
  if (N >= INT32_MAX || V >= INT32_MAX)
    fail(op, fmt::format("N={} tokens or V={} rows exceed the sort's 32-bit keys", N, V));
  activate(*impl_, op);
  const size_t bytes = kernels::embedding_backward_scratch_bytes(N, V);
  void* scratch = impl_->scratch_for(bytes);
  check_cuda(
      kernels::launch_embedding_backward(s, f32(dwte), f32(dwpe), dout.data, i32(tokens), N, C, V,
                                         T, shard ? vocab_begin : 0, scratch, bytes, impl_->stream),
      op, "the embedding backward kernels");
}

// ---- loss ----------------------------------------------------------------------------------

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

// ---- mixture of experts --------------------------------------------------------------------

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
  check_cuda(kernels::launch_moe_router_forward(s, r.logits.data, f32(r.probs),
                                                static_cast<int32_t*>(r.expert_idx.data),
                                                f32(r.gates), static_cast<int32_t*>(r.slot.data),
                                                static_cast<int32_t*>(r.counts.data), f32(r.load),
                                                N, E, K, capacity, lse, stats, impl_->stream),
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
                 f32(r.load), N, E, K, static_cast<float>(aux_coef), static_cast<float>(z_coef),
                 static_cast<float>(grad_scale), impl_->stream),
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
