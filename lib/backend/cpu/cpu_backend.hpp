// The CPU backend: the numerical reference every other backend is compared against.
// Internal to lib/backend (users call make_cpu_backend()). One file per op family implements the
// member functions declared here; this header also holds the shared helpers those files use:
//   - Tag<S> and dispatch_float(): switch on a storage dtype once, then run a kernel templated on
//     S in {double, float, bf16, f16}; the compute type is tensor::compute_t<S>, and the statistics
//     and gradient types (A, G in backend.hpp) are the same C++ type as compute_t<S>.
//   - fail(): the error of the checks only this backend can do (token ids, targets and slots it
//     reads, dtypes it has no kernel for); the contract's checks ran before any do_<op>
//     (backend_ops.cpp).
//   - ScratchPool: growing scratch buffers owned by the backend, so warm calls do not allocate.
// Determinism: every kernel runs on one thread in a fixed order of operations that depends only on
// the shapes (lane sums of fast_math.hpp, fixed attention blocks); reductions over many elements
// (sum, sum_squares) accumulate in double. OpenBLAS may use threads: its results are stable run to
// run but depend on OPENBLAS_NUM_THREADS. So results are bit-identical for the same binary, inputs
// and OPENBLAS_NUM_THREADS. The float path uses fast_exp (~1 ulp); the f64 path uses libm.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "backend/arg_check.hpp"
#include "backend/backend.hpp"
#include "backend/cpu/op_timing.hpp"
#include "tensor/tensor.hpp"

namespace trainctl::backend::cpu {

using tensor::bf16;
using tensor::compute_t;
using tensor::f16;

template <class S>
struct Tag {
  using type = S;
};

// This backend's messages ("cpu backend <op>: ..."), for the checks only it does.
extern const ArgCheck kArgs;
[[noreturn]] void fail(std::string_view op, const std::string& message);
[[noreturn]] void fail_unsupported_dtype(std::string_view op, std::string_view name, DType dtype);

// Runs f(Tag<S>{}) for the C++ storage type of `dtype` (f64, f32, bf16 or f16).
template <class F>
decltype(auto) dispatch_float(DType dtype, std::string_view op, std::string_view name, F&& f) {
  switch (dtype) {
    case DType::f64:
      return f(Tag<double>{});
    case DType::f32:
      return f(Tag<float>{});
    case DType::bf16:
      return f(Tag<bf16>{});
    case DType::f16:
      return f(Tag<f16>{});
    default:
      fail_unsupported_dtype(op, name, dtype);
  }
}

// The DType of a storage C++ type.
template <class S>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<S, double>) return DType::f64;
  if constexpr (std::is_same_v<S, float>) return DType::f32;
  if constexpr (std::is_same_v<S, bf16>) return DType::bf16;
  if constexpr (std::is_same_v<S, f16>) return DType::f16;
}

// Growing scratch buffers, one per slot. A pointer stays valid until the same slot is asked for
// more memory. Slots are assigned per op family (see kSlot* below) so no op overwrites the
// scratch of another op that is still using it.
class ScratchPool {
 public:
  template <class T>
  T* get(size_t slot, size_t count) {
    return static_cast<T*>(raw(slot, count * sizeof(T)));
  }

 private:
  void* raw(size_t slot, size_t bytes);
  std::array<tensor::Buffer, 12> buffers_;
};

// GEMM uses slots 0-2; attention 3-11 (it calls blas_gemm directly, never Backend::gemm). Ops
// that never call gemm (rope's angle table, the router backward) borrow slot 0 for their call.
inline constexpr size_t kSlotGemmA = 0, kSlotGemmB = 1, kSlotGemmC = 2, kSlotAttention = 3;

// y rounded to the nearest e4m3 / e5m2 value, ties to even, for |y| <= the format's largest
// finite value or NaN (what the fp8 GEMM operands need; tensor::round_to handles every float).
float round_fp8(float y, DType format);

// Row-major C = alpha op(A) op(B) + beta C in the compute type (float -> sgemm, double -> dgemm).
template <class T>
void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
               int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// GELU and its derivative over every 16-bit input pattern (bf16 or f16), built on first use
// (activation.cpp explains why).
class GeluTables {
 public:
  template <class S>
  const uint16_t* forward();
  template <class S>
  const float* derivative();

 private:
  template <class S>
  static void build(std::vector<uint16_t>& forward, std::vector<float>& derivative);
  std::vector<uint16_t> bf16_forward_, f16_forward_;
  std::vector<float> bf16_derivative_, f16_derivative_;
};

// Not final: tests derive from it to watch the hand-offs (fence()) while it computes.
class CpuBackend : public Backend {
 public:
  // TRAINCTL_OP_TIMING=1 in the environment turns the op counters on and prints them to stderr
  // when the backend is destroyed.
  CpuBackend();
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;
  OpTimer& op_timer() { return timer_; }

  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::cpu; }

  Allocation allocate(size_t bytes) override;
  void deallocate(void* data) override;

 private:
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

  void do_cross_entropy_forward(const Tensor& losses, const Tensor& lse, const Tensor& logits,
                                const Tensor& targets) override;
  void do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                 const Tensor& targets, double grad_scale) override;

  void do_embedding_forward_shard(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                  const Tensor& wpe, int64_t T, int64_t vocab_begin) override;
  void do_embedding_backward_shard(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                   const Tensor& tokens, int64_t T, int64_t vocab_begin) override;
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

  ScratchPool scratch_;
  OpTimer timer_;
  GeluTables gelu_tables_;
  bool print_timing_ = false;
};

}  // namespace trainctl::backend::cpu
