// The CUDA backend: every Backend op on one GPU, numerically checked against the CPU backend by
// tests/gpu. One file per op family, as in cpu/: GEMMs through cuBLASLt (gemm.cpp), everything
// else through the kernels of kernels/ (launch wrappers in elementwise.cpp, norm.cpp,
// activation.cpp, rope.cpp, attention.cpp, embedding.cpp, loss.cpp, moe.cpp, adamw.cpp).
//
// Execution: every op is enqueued on the backend's compute stream; the Backend contract
// ("synchronous from the caller's point of view") holds because every op that returns a host value
// (sum, sum_squares, all_finite, copy_to_host) synchronises the stream, and device memory is only
// read by later ops on the same stream or by a communicator ordered after it (stream(), fence()).
// Determinism: every path is deterministic; there is no faster non-deterministic one to switch to
// yet. No float atomics, fixed reduction orders, cuBLASLt without TF32 for fp32 and with one
// algorithm per shape (cuBLAS promises bit-wise equal results for a given algorithm, architecture
// and SM count, its split-K reductions included; tests/gpu repeats a split-K shape to check it),
// so two runs on the same GPU are bit-identical. CudaOptions::deterministic (the recipe's
// determinism.deterministic) is therefore accepted and changes nothing today.
//
// Memory: allocate() is cudaMalloc (zero-filled with cudaMemsetAsync), called only while the model
// plans its buffers, never in the step loop; kernels that need temporary space take it from
// Impl::scratch. The scratch grows stream-ordered (cudaFreeAsync/cudaMallocAsync on the compute
// stream), so a growth never synchronises the device and cannot wait on an NCCL kernel of another
// stream; the first step sizes it, and reserve_scratch sizes it up front where a caller knows the
// need.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "backend/backend.hpp"

namespace trainctl::backend::cuda {

struct CudaOptions {
  int device = 0;             // CUDA device index (a rank uses its local rank)
  bool deterministic = true;  // accepted; every path is deterministic (see above)
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaOptions& options);  // throws std::runtime_error naming the cause
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::cuda; }

  Allocation allocate(size_t bytes) override;
  void deallocate(void* data) override;
  // A fence is a cudaEvent recorded on the compute stream (created per call: about a microsecond,
  // cheap next to a gradient bucket); wait() synchronises on it from any thread.
  std::unique_ptr<Fence> fence() override;
  void* stream() const override;  // the compute stream, a cudaStream_t

  // How many GEMMs took each path since construction (gemm.cpp): fp8 operands on fp8
  // tensor cores, or emulated on the input dtype's GEMM (same values: dequantized operands);
  // the GELU epilogue fused into cuBLASLt, or the GEMM followed by gelu_forward. fp8_given_amax
  // counts operands scaled by a caller's amax (GemmArgs amax_a / amax_b) on either fp8 path.
  struct GemmPaths {
    int64_t fp8_tensor_core = 0;
    int64_t fp8_emulated = 0;
    int64_t fp8_given_amax = 0;
    int64_t gelu_fused = 0;
    int64_t gelu_unfused = 0;
  };
  GemmPaths gemm_paths() const;

  // Grows the scratch buffer to at least `bytes` now (stream-ordered, never smaller).
  void reserve_scratch(size_t bytes);

  struct Impl;  // cuda_backend_impl.hpp: stream, cuBLASLt handle, workspace, scratch
  Impl& impl() { return *impl_; }

 private:
  // The ops: the contract's checks ran in Backend's wrappers; these add the CUDA backend's own (the
  // dtypes it computes on, its kernels' limits). One file per op family (backend_cuda.cmake).
  void do_copy_to_host(void* dst, const Tensor& src) override;
  void do_copy_from_host(const Tensor& dst, const void* src) override;

  void do_cast(const Tensor& dst, const Tensor& src) override;
  void do_copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                       int64_t cols) override;
  void do_fill(const Tensor& dst, double value) override;
  void do_add(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void do_accumulate(const Tensor& dst, const Tensor& src) override;
  void do_scale(const Tensor& dst, double factor) override;
  double do_sum(const Tensor& src) override;
  double do_sum_squares(const Tensor& src) override;
  bool do_all_finite(const Tensor& src) override;
  void do_amax(const Tensor& out, const Tensor& src) override;

  void do_gemm(const GemmArgs& args) override;
  void do_bias_backward(const Tensor& dbias, const Tensor& dout) override;

  void do_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                            const Tensor& x, const Tensor& weight, const Tensor& bias,
                            double eps) override;
  void do_layernorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                             const Tensor& dout, const Tensor& x, const Tensor& weight,
                             const Tensor& mean, const Tensor& rstd) override;
  void do_rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x,
                          const Tensor& weight, double eps) override;
  void do_rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                           const Tensor& x, const Tensor& weight, const Tensor& rstd) override;
  void do_gelu_forward(const Tensor& out, const Tensor& x) override;
  void do_gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) override;
  void do_swiglu_forward(const Tensor& out, const Tensor& gate_up) override;
  void do_swiglu_backward(const Tensor& dgate_up, const Tensor& dout,
                          const Tensor& gate_up) override;
  void do_rope(const Tensor& out, const Tensor& x, int64_t T, int64_t rotated_heads, int64_t D,
               double theta, bool inverse, const Tensor& positions) override;
  void do_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                            const AttentionShape& shape) override;
  void do_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                             const Tensor& out, const Tensor& lse,
                             const AttentionShape& shape) override;
  void do_attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                  const Tensor& kv, const Tensor& q_pos, const Tensor& k_pos,
                                  const AttentionBlockShape& shape) override;
  void do_attention_block_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout,
                                   const Tensor& qkv, const Tensor& kv, const Tensor& out,
                                   const Tensor& lse, const Tensor& q_pos, const Tensor& k_pos,
                                   const AttentionBlockShape& shape) override;
  void do_embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                            const Tensor& wpe, int64_t T) override;
  void do_embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                             const Tensor& tokens, int64_t T) override;
  void do_embedding_forward_shard(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                  const Tensor& wpe, int64_t T, int64_t vocab_begin) override;
  void do_embedding_backward_shard(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                   const Tensor& tokens, int64_t T, int64_t vocab_begin) override;
  void do_cross_entropy_forward(const Tensor& losses, const Tensor& lse, const Tensor& logits,
                                const Tensor& targets) override;
  void do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                 const Tensor& targets, double grad_scale) override;
  void do_cross_entropy_backward_shard(const Tensor& dlogits, const Tensor& logits,
                                       const Tensor& lse, const Tensor& targets,
                                       int64_t vocab_begin, double grad_scale) override;
  RouterLosses do_moe_router_forward(const RouterArgs& args) override;
  void do_moe_router_backward(const Tensor& dlogits, const Tensor& dgates, const RouterArgs& args,
                              double aux_coef, double z_coef, double grad_scale) override;
  void do_moe_permute(const Tensor& expert_in, const Tensor& x, const Tensor& slot) override;
  void do_moe_permute_backward(const Tensor& dx, const Tensor& dexpert_in,
                               const Tensor& slot) override;
  void do_moe_unpermute(const Tensor& out, const Tensor& expert_out, const Tensor& gates,
                        const Tensor& slot) override;
  void do_moe_unpermute_backward(const Tensor& dexpert_out, const Tensor& dgates,
                                 const Tensor& dout, const Tensor& expert_out, const Tensor& gates,
                                 const Tensor& slot) override;
  void do_adamw(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
                const Tensor& v, std::span<const AdamWRange> ranges, const AdamW& hyper) override;
  void do_momentum_update(const Tensor& param, const Tensor& master, const Tensor& grad,
                          const Tensor& m, const Tensor& out, std::span<const AdamWRange> ranges,
                          const Momentum& hyper) override;
  void do_apply_update(const Tensor& param, const Tensor& master, const Tensor& update,
                       std::span<const AdamWRange> ranges, double lr, double weight_decay) override;

  void gemm_fp8(const GemmArgs& g);
  void gemm_gelu(const GemmArgs& g);

  std::unique_ptr<Impl> impl_;
};

}  // namespace trainctl::backend::cuda
