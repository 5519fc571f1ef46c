// The Backend: every numerical operation the model and the optimizer need, written once against
// this interface and implemented by `cpu` (the numerical reference, OpenBLAS + loops) and `cuda`
// (cuBLASLt + kernels/). Ops are synchronous from the caller's point of view.
//
// Two parts, one object at runtime:
//   BackendDevice  what the backend is and can do (name, device, Capabilities: storage dtypes and
//                  op families), its memory (allocate, copies) and its hand-off to other consumers
//                  (fence, stream).
//   Backend        the ops. Each public op is a non-virtual wrapper (ggml-backend's pattern): it
//                  refuses an op family the backend does not declare, checks the arguments against
//                  this contract once for every backend (arg_check.hpp, backend_ops.cpp), then
//                  calls the backend's private do_<op>. A backend's do_<op> adds only the checks it
//                  alone can do (the CPU reads token ids, targets and slots; the CUDA backend
//                  checks the dtypes it computes on and its kernels' limits).
// Every argument error is a std::invalid_argument "<name> backend <op>: <what is wrong>".
//
// Types. A run has one storage type S for parameters and activations (f64 | f32 | bf16 | f16).
// Derived from it:
//   G = parameter-gradient type: f64 when S is f64, else f32 (fp32 accumulation across
//   micro-batches) A = statistics type (norm mean/rstd, log-sum-exp, router probabilities): f64
//   when S is f64, else f32
// Every op computes in fp32 (fp64 for S = f64) and rounds once when it stores an S value.
//
// Gradient contract (as in llm.c): parameter gradients ACCUMULATE (+=) so micro-batches add up;
// activation gradients are OVERWRITTEN (the model adds residual branches explicitly).
//
// Layouts: activations are row-major [N, C] with N = B*T tokens (b major, t minor). Linear weights
// are [out, in] (PyTorch/Hugging Face layout), y = x W^T + b. The attention input is the fused
// projection qkv [N, (H + 2*KV) * D]: H query heads, then KV key heads, then KV value heads, each
// head D contiguous values. Grouped-query attention maps query head h to kv head h / (H / KV).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "tensor/tensor.hpp"

namespace trainctl::backend {

using tensor::Device;
using tensor::DType;
using tensor::Shape;
using tensor::Tensor;

DType grad_dtype(DType storage);   // G above
DType stats_dtype(DType storage);  // A above

// The op families of the Backend interface; a backend declares which it implements
// (Capabilities::supports). A call into a family it lacks throws std::invalid_argument from the
// wrapper, before any argument is looked at. The CPU backend's op timing counts per family too
// (cpu/op_timing.hpp; it counts bias_backward under elementwise and fp8 GEMMs under gemm).
enum class OpFamily : int {
  gemm,         // gemm, bias_backward
  attention,    // attention_forward, attention_backward
  norm,         // layernorm_*, rmsnorm_*
  activation,   // gelu_*, swiglu_*
  rope,         // rope
  embedding,    // embedding_forward/backward and their _shard forms
  loss,         // cross_entropy_forward/backward, cross_entropy_backward_shard
  moe,          // moe_router_*, moe_permute*, moe_unpermute*
  optimizer,    // adamw, momentum_update, apply_update
  elementwise,  // cast, fill, add, accumulate, scale
  reduction,    // sum, sum_squares, all_finite, amax
  fp8,          // gemm with GemmArgs fp8 operands (the fp8 flag of Capabilities)
  count
};
inline constexpr int kNumOpFamilies = static_cast<int>(OpFamily::count);
std::string_view op_family_name(OpFamily family);

// What a backend can do, declared up front so a recipe asking for something it lacks fails at
// validation, not mid-run.
struct Capabilities {
  bool f64 = false;
  bool f32 = true;
  bool bf16 = false;
  bool f16 = false;
  bool fp8 = false;  // GemmArgs fp8 operands (on the CPU: the same values, computed in fp32)
  // The op families implemented, bit i for OpFamily i; every family unless a backend clears it.
  // fp8's support is the flag above (its bit is not read).
  uint32_t op_families = ~uint32_t{0};
  bool supports(DType storage) const;
  bool supports(OpFamily family) const;
  void set_supported(OpFamily family, bool supported);
};

class BackendDevice;

// Owning device memory from a backend. Move-only; frees itself.
class Allocation {
 public:
  Allocation() = default;
  Allocation(BackendDevice* owner, void* data, size_t bytes)
      : owner_(owner), data_(data), bytes_(bytes) {}
  Allocation(Allocation&& other) noexcept;
  Allocation& operator=(Allocation&& other) noexcept;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  ~Allocation();
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Tensor view(DType dtype, Shape shape, size_t byte_offset = 0) const;

 private:
  BackendDevice* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// C = alpha * op(A) op(B) + beta * C, row-major, contiguous; op(A) is [m, k], op(B) is [k, n].
// A stored [m, k] (or [k, m] when trans_a), B stored [k, n] (or [n, k] when trans_b).
// A and B share one dtype; C may be that dtype or G (weight gradients accumulate into f32 with
// beta = 1). `bias` (optional, [n], dtype of C or S) is added to every row after the product.
// batch > 1 runs `batch` independent products at element strides stride_a/b/c.
//
// Epilogue gelu: c = gelu(alpha op(A) op(B) + beta c + bias) (the tanh GELU of gelu_forward),
// and `pre_gelu` ([m, n], dtype of C) receives the value before the GELU. Bit-identical to the
// gemm followed by gelu_forward on the CPU; cuBLASLt's GELU_AUX_BIAS epilogue on the GPU.
//
// fp8 operands (Hopper's e4m3/e5m2 tensor cores; the CPU backend computes the same values): an
// operand whose fp8_a / fp8_b names e4m3 or e5m2 is quantized per tensor ("current scaling")
// before the product, and the product is scaled back:
//   p = fp8_scale(format, amax), amax = max |x| over the operand's m*k (k*n) elements
//   q = x * p rounded to nearest even in the format (saturating)
//   C = alpha * (op(qA) op(qB)) / (pA * pB) + beta * C + bias,  accumulated in fp32.
// A non-finite element makes p NaN, hence every output NaN (the trainer's overflow check sees
// it). fp8 operands need batch == 1 and epilogue none.
// Given amax (amax_a / amax_b, a [1] f32 tensor, e.g. Backend::amax max-reduced over a tensor-
// parallel group): p = fp8_scale(format, *amax) instead of the operand's own, so a shard is
// quantized exactly as its slice of the whole tensor is. It must be >= the operand's own amax
// (larger values saturate); +inf (a non-finite element anywhere in the group) makes p NaN.
enum class Epilogue : uint8_t { none, gelu };

struct GemmArgs {
  Tensor a, b, c;
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  double alpha = 1.0;
  double beta = 0.0;
  Tensor bias;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  Epilogue epilogue = Epilogue::none;
  Tensor pre_gelu = {};                         // epilogue gelu: out, [m, n]
  std::optional<DType> fp8_a = {}, fp8_b = {};  // e4m3 | e5m2: quantize that operand (see above)
  Tensor amax_a = {}, amax_b = {};              // optional [1] f32: the amax to scale by (above)
};

// The per-tensor scale of an fp8 operand whose largest magnitude is `amax`: the largest power
// of two p with amax * p <= max_finite(format), clamped to [2^-126, 2^126]; 1 when amax is 0;
// NaN when amax is not finite. A power of two, so x * p and the scaling back are exact.
// format: e4m3 (max 448) or e5m2 (max 57344). Every backend computes exactly this value.
float fp8_scale(DType format, float amax);

// Attention geometry: B sequences of T tokens, H query heads, KV key/value heads, head size D.
struct AttentionShape {
  int64_t B = 0, T = 0, H = 0, KV = 0, D = 0;
  int64_t qkv_width() const { return (H + 2 * KV) * D; }
};

// One block of context-parallel ("ring") attention: the queries of B sequences, Tq tokens each at
// global positions q_pos, against a block of keys and values, Tk tokens each at k_pos; query i
// sees key j when k_pos[j] <= q_pos[i] (causal by global position). Heads as AttentionShape.
struct AttentionBlockShape {
  int64_t B = 0, Tq = 0, Tk = 0, H = 0, KV = 0, D = 0;
  int64_t qkv_width() const { return (H + 2 * KV) * D; }
  int64_t kv_width() const { return 2 * KV * D; }
};

// Mixture-of-experts routing of N tokens over E experts, top-k, with `capacity` slots per expert
// (tokens beyond it are dropped: they skip the expert and keep only the residual path).
struct RouterArgs {
  Tensor logits;      // [N, E] S         router logits
  Tensor probs;       // [N, E] A         out: softmax(logits)
  Tensor expert_idx;  // [N, k] i32       out: chosen experts, best first (ties: lower index)
  Tensor gates;       // [N, k] A         out: probs of the chosen experts
  Tensor slot;        // [N, k] i32       out: row in the expert buffer e*capacity + position, or -1
  Tensor counts;      // [E]    i32       out: tokens kept per expert (<= capacity)
  Tensor load;  // [E]    A         out: share of the N*k assignments each expert was chosen for
  int64_t top_k = 1;
  int64_t capacity = 0;  // slots per expert; positions are given in order (slot j, then token n)
  // gates = probs of the chosen experts divided by their sum (Mixtral's router); else the probs.
  bool renormalize = false;
};

struct RouterLosses {
  double aux_loss = 0;  // Switch/GShard balance: E * sum_e load_e * mean_n probs[n, e]
  double z_loss = 0;    // ST-MoE: mean_n logsumexp(logits[n])^2
};

// ================================================================================================
// Part 1: the device. What the backend is and can do, its memory, its hand-off to communication.
// ================================================================================================
class BackendDevice {
 public:
  virtual ~BackendDevice() = default;
  BackendDevice(const BackendDevice&) = delete;
  BackendDevice& operator=(const BackendDevice&) = delete;

  virtual std::string_view name() const = 0;  // "cpu", "cuda": messages say "<name> backend"
  virtual Device device() const = 0;          // where its tensors live
  // Declared by the backend's constructor (declare_capabilities) and fixed from then on.
  Capabilities capabilities() const { return capabilities_; }
  bool supports(OpFamily family) const { return capabilities_.supports(family); }

  // ---- memory ----
  virtual Allocation allocate(size_t bytes) = 0;  // zero-filled
  virtual void deallocate(void* data) = 0;
  // src / dst present and on this backend's device (checked here), then the backend's copy.
  void copy_to_host(void* dst, const Tensor& src);
  void copy_from_host(const Tensor& dst, const void* src);

  // ---- hand-off to communication ----
  // Ops run in the order they are issued, but a backend may complete them after they return (the
  // CUDA backend enqueues them on its stream). Memory handed to anything else that reads it (a
  // communicator on its own stream, a thread) must be complete first:
  //  - fence() marks every op issued so far; Fence::wait(), from any thread, returns once all of
  //    them have completed (throws when the device failed). One fence per hand-off; it may be
  //    waited on more than once.
  //  - stream() is the native queue the ops run on (the CUDA backend's cudaStream_t), for a
  //    consumer that orders its own device work after them (NCCL waits on an event recorded on
  //    it); null when ops are complete when they return.
  // The CPU backend's ops are complete when they return: its fences are passed at once and its
  // stream() is null.
  class Fence {
   public:
    virtual ~Fence() = default;
    virtual void wait() = 0;
  };
  virtual std::unique_ptr<Fence> fence();
  virtual void* stream() const { return nullptr; }

 protected:
  BackendDevice() = default;
  void declare_capabilities(const Capabilities& capabilities) { capabilities_ = capabilities; }

 private:
  virtual void do_copy_to_host(void* dst, const Tensor& src) = 0;
  virtual void do_copy_from_host(const Tensor& dst, const void* src) = 0;

  Capabilities capabilities_;
};

// ================================================================================================
// Part 2: the ops. Public: non-virtual, family gate and argument checks (backend_ops.cpp), then
// the backend's do_<op> (private, below). Adding an op: its declaration and contract here, its
// wrapper in backend_ops.cpp, its do_<op> in each backend's file of its family (cpu/<family>.cpp,
// cuda/<family>.cpp), its cases in tests/unit/backend_op_cases.hpp.
// ================================================================================================
class Backend : public BackendDevice {
 public:
  // ---- elementwise and reductions (any float dtypes; shapes must match in numel) ----
  void cast(const Tensor& dst, const Tensor& src);  // dst = round(src)
  // dst[r, dst_col + c] = src[r, src_col + c] for every row r and c < cols: a band of columns of
  // one matrix into another with as many rows, in one dtype (the packed K and V of a qkv row).
  void copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                    int64_t cols);
  void fill(const Tensor& dst, double value);
  void add(const Tensor& out, const Tensor& a, const Tensor& b);  // out = a + b
  void accumulate(const Tensor& dst, const Tensor& src);          // dst += src
  void scale(const Tensor& dst, double factor);                   // dst *= factor
  double sum(const Tensor& src);                                  // fixed order, f64 accumulation
  // Fixed order, f64 accumulation. For f32/bf16/f16 input it cannot overflow, so it is finite
  // exactly when every element is (the trainer's overflow check relies on this).
  double sum_squares(const Tensor& src);
  bool all_finite(const Tensor& src);
  // out[0] (f32, [1]) = max |src| over f32/bf16/f16 src, +inf when any element is not finite (so
  // that a max over ranks keeps it); exact. The amax of an fp8 operand (GemmArgs amax_a/amax_b).
  void amax(const Tensor& out, const Tensor& src);

  // ---- GEMM ----
  void gemm(const GemmArgs& args);  // fp8 operands also need the fp8 family
  // dbias[C] (G) += column sums of dout[N, C] (S)
  void bias_backward(const Tensor& dbias, const Tensor& dout);

  // ---- norms over the last dim of [N, C] ----
  // LayerNorm: out = (x - mean) * rstd * weight + bias (bias optional). mean, rstd: [N] A.
  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                         const Tensor& weight, const Tensor& bias, double eps);
  void layernorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd);
  // RMSNorm: out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps).
  void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                       double eps);
  void rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                        const Tensor& x, const Tensor& weight, const Tensor& rstd);

  // ---- activations ----
  // GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  void gelu_forward(const Tensor& out, const Tensor& x);
  void gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x);
  // SwiGLU: gate_up [N, 2F] holds gate in columns [0, F), up in [F, 2F); out [N, F] =
  // silu(gate) * up.
  void swiglu_forward(const Tensor& out, const Tensor& gate_up);
  void swiglu_backward(const Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up);

  // ---- rotary position embedding (rotate-half / GPT-NeoX / Hugging Face Llama convention) ----
  // x, out: [B*T, width]; the first `rotated_heads` heads of D columns of each row are rotated by
  // the angle of their position t (row % T, or positions[row % T] when given: i32 [T], the global
  // positions of a sequence's rows under context parallelism), the remaining columns are copied.
  // `inverse` applies the transpose rotation: the backward pass.
  void rope(const Tensor& out, const Tensor& x, int64_t T, int64_t rotated_heads, int64_t D,
            double theta, bool inverse, const Tensor& positions = {});

  // ---- causal attention, softmax scale 1/sqrt(D) ----
  // out [N, H*D] S; lse [B, H, T] A (log-sum-exp of each score row, kept for backward).
  void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                         const AttentionShape& shape);
  // dqkv [N, (H+2KV)*D] is overwritten.
  void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& out, const Tensor& lse, const AttentionShape& shape);

  // ---- attention over one key/value block (context parallel), softmax scale 1/sqrt(D) ----
  // out [B*Tq, H*D] A and lse [B, H, Tq] A hold the attention over the blocks merged so far
  // (before the first: out 0, lse -inf); this merges in the block's keys (online softmax). The
  // queries are the first H*D columns of qkv [B*Tq, (H+2KV)*D] S; kv [B*Tk, 2*KV*D] S holds the
  // keys, then the values; q_pos [Tq] and k_pos [Tk] i32. A row that sees no key of the block is
  // left as it was. After every block, out and lse equal attention_forward's for those rows.
  void attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                               const Tensor& kv, const Tensor& q_pos, const Tensor& k_pos,
                               const AttentionBlockShape& shape);
  // One block's share of the backward, from the final out and lse: dq [B*Tq, H*D] A and
  // dkv [B*Tk, 2*KV*D] A ACCUMULATE (+=); dout [B*Tq, H*D] S. Summed over every block, dq and dkv
  // are attention_backward's.
  void attention_block_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout,
                                const Tensor& qkv, const Tensor& kv, const Tensor& out,
                                const Tensor& lse, const Tensor& q_pos, const Tensor& k_pos,
                                const AttentionBlockShape& shape);

  // ---- embeddings ----
  // out[n] = wte[tokens[n]] + (wpe ? wpe[n % T] : 0). tokens: [N] i32.
  void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                         const Tensor& wpe, int64_t T);
  // dwte (G) += scatter of dout by token; dwpe (G, optional) += sum over sequences. Fixed order.
  void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens, int64_t T);

  // ---- loss ----
  // losses[n] = logsumexp(logits[n]) - logits[n, targets[n]] (A); lse[n] kept (A).
  // A target < 0 is ignored (loss 0, gradient 0).
  void cross_entropy_forward(const Tensor& losses, const Tensor& lse, const Tensor& logits,
                             const Tensor& targets);
  // dlogits[n] = (softmax(logits[n]) - onehot(targets[n])) * grad_scale   (overwritten, S)
  void cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                              const Tensor& targets, double grad_scale);

  // ---- vocab-parallel variants (tensor parallel) ----
  // The table or logits hold vocabulary rows/columns [vocab_begin, vocab_begin + V_local) of a
  // larger vocabulary; tokens and targets are global ids.
  // Lookup: a token outside the shard reads zeros; wpe (optional) is added to every row.
  void embedding_forward_shard(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                               const Tensor& wpe, int64_t T, int64_t vocab_begin);
  // dwte (G) += dout rows of the tokens inside the shard; dwpe (G, optional) += as for
  // embedding_backward (every token). Fixed order.
  void embedding_backward_shard(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                const Tensor& tokens, int64_t T, int64_t vocab_begin);
  // lse [N] (A) is the log-sum-exp over the WHOLE vocabulary. dlogits[n] = (softmax(logits[n]) -
  // onehot(targets[n] when inside the shard)) * grad_scale, with softmax relative to that lse;
  // target < 0: zeros. Overwritten, S.
  void cross_entropy_backward_shard(const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                    const Tensor& targets, int64_t vocab_begin, double grad_scale);

  // ---- mixture of experts ----
  RouterLosses moe_router_forward(const RouterArgs& args);
  // dlogits (S, overwritten) from dgates [N, k] (A), plus the gradients of
  // aux_coef * aux_loss and z_coef * z_loss, all multiplied by grad_scale.
  void moe_router_backward(const Tensor& dlogits, const Tensor& dgates, const RouterArgs& args,
                           double aux_coef, double z_coef, double grad_scale);
  // expert_in[slot[n, j]] = x[n] for every kept assignment; unused rows are zeroed.
  void moe_permute(const Tensor& expert_in, const Tensor& x, const Tensor& slot);
  // dx[n] = sum_j dexpert_in[slot[n, j]] (overwritten).
  void moe_permute_backward(const Tensor& dx, const Tensor& dexpert_in, const Tensor& slot);
  // out[n] = sum_j gates[n, j] * expert_out[slot[n, j]] over kept assignments (overwritten).
  void moe_unpermute(const Tensor& out, const Tensor& expert_out, const Tensor& gates,
                     const Tensor& slot);
  // dexpert_out[slot] = gates * dout (unused rows zeroed); dgates[n, j] = dot(dout[n],
  // expert_out[slot[n, j]]) (0 where dropped). Both overwritten.
  void moe_unpermute_backward(const Tensor& dexpert_out, const Tensor& dgates, const Tensor& dout,
                              const Tensor& expert_out, const Tensor& gates, const Tensor& slot);

  // ---- optimizer ----
  // AdamW with decoupled weight decay on one contiguous parameter range. grad (G) is multiplied
  // by grad_scale first (un-scaling and clipping). master (f32) is updated when present and the
  // storage param (S) is set to round(master); without master the param itself is updated.
  // m, v: f32 (f64 when S is f64), or both bf16 (below). step counts from 1 (bias correction).
  struct AdamW {
    double lr, beta1, beta2, eps, weight_decay, grad_scale;
    int64_t step;
  };
  // Multi-tensor form: one call (one launch on a GPU) over many parameters. Every tensor is 1-D
  // over the same elements; `ranges` (disjoint, element indices into them) select what is
  // updated, each with or without weight decay (hyper.weight_decay applies where decay is set).
  //
  // Moments in bf16 (optimizer.state_dtype: bf16; f32 G only) are loaded to f32, updated as
  // above, and stored back stochastically rounded (tensor/stochastic_round.hpp) with the bits of
  // each element's global index in its parameter: a range then also says which parameter it
  // lies in (key: tensor::rounding_key of the seed and the name) and where its elements sit in
  // it (local element begin + r * local_width + c is global element global_begin +
  // r * global_width + c). step is the rounding's step. With G moments these fields are unused.
  struct AdamWRange {
    int64_t begin = 0, end = 0;
    bool decay = true;
    uint64_t key = 0;
    int64_t global_begin = 0, local_width = 1, global_width = 1;
  };
  void adamw(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
             const Tensor& v, std::span<const AdamWRange> ranges, const AdamW& hyper);
  // One range: the whole tensors, decayed by hyper.weight_decay.
  void adamw(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
             const Tensor& v, const AdamW& hyper);

  // The momentum rules (train/optimizer.hpp), over `ranges` as adamw (decay selects
  // hyper.weight_decay or 0 as wd). g = grad * grad_scale; w is the master when present
  // (param = round(w)), else the param; out is G like grad, m too or bf16 (as adamw's).
  //   sgd   PyTorch's SGD: g += wd w; m = beta1 m + g; d = nesterov ? g + beta1 m : m;
  //         w -= lr d. m may be empty when beta1 (the momentum) is 0: d = g.
  //   lion  Chen et al. 2023: c = beta1 m + (1 - beta1) g; w = w (1 - lr wd) - lr sign(c);
  //         m = beta2 m + (1 - beta2) g.
  //   muon  the momentum half of Muon (Moonlight's form): m = beta1 m + g;
  //         out = nesterov ? g + beta1 m : m. The parameters are not touched (apply_update).
  // `out` is used by muon only (empty otherwise).
  enum class MomentumRule : uint8_t { sgd, lion, muon };
  struct Momentum {
    MomentumRule rule = MomentumRule::sgd;
    double lr = 0, beta1 = 0, beta2 = 0, weight_decay = 0, grad_scale = 1;
    bool nesterov = false;
    int64_t step = 1;  // bf16 moments: the stochastic rounding's step
  };
  void momentum_update(const Tensor& param, const Tensor& master, const Tensor& grad,
                       const Tensor& m, const Tensor& out, std::span<const AdamWRange> ranges,
                       const Momentum& hyper);
  // w = w (1 - lr wd) - lr update over `ranges` (wd: weight_decay where decay is set), w the
  // master when present (param = round(w)). update is G.
  void apply_update(const Tensor& param, const Tensor& master, const Tensor& update,
                    std::span<const AdamWRange> ranges, double lr, double weight_decay);

 protected:
  Backend() = default;

 private:
  // What a backend implements: one do_<op> per public op above, same arguments, called only after
  // the family gate and the contract's checks passed.
  virtual void do_cast(const Tensor& dst, const Tensor& src) = 0;
  virtual void do_copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src,
                               int64_t src_col, int64_t cols) = 0;
  virtual void do_fill(const Tensor& dst, double value) = 0;
  virtual void do_add(const Tensor& out, const Tensor& a, const Tensor& b) = 0;
  virtual void do_accumulate(const Tensor& dst, const Tensor& src) = 0;
  virtual void do_scale(const Tensor& dst, double factor) = 0;
  virtual double do_sum(const Tensor& src) = 0;
  virtual double do_sum_squares(const Tensor& src) = 0;
  virtual bool do_all_finite(const Tensor& src) = 0;
  virtual void do_amax(const Tensor& out, const Tensor& src) = 0;

  virtual void do_gemm(const GemmArgs& args) = 0;
  virtual void do_bias_backward(const Tensor& dbias, const Tensor& dout) = 0;

  virtual void do_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                    const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    double eps) = 0;
  virtual void do_layernorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                     const Tensor& dout, const Tensor& x, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd) = 0;
  virtual void do_rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x,
                                  const Tensor& weight, double eps) = 0;
  virtual void do_rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                                   const Tensor& x, const Tensor& weight, const Tensor& rstd) = 0;

  virtual void do_gelu_forward(const Tensor& out, const Tensor& x) = 0;
  virtual void do_gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) = 0;
  virtual void do_swiglu_forward(const Tensor& out, const Tensor& gate_up) = 0;
  virtual void do_swiglu_backward(const Tensor& dgate_up, const Tensor& dout,
                                  const Tensor& gate_up) = 0;

  virtual void do_rope(const Tensor& out, const Tensor& x, int64_t T, int64_t rotated_heads,
                       int64_t D, double theta, bool inverse, const Tensor& positions) = 0;

  virtual void do_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                    const AttentionShape& shape) = 0;
  virtual void do_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                     const Tensor& out, const Tensor& lse,
                                     const AttentionShape& shape) = 0;
  virtual void do_attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                          const Tensor& kv, const Tensor& q_pos,
                                          const Tensor& k_pos,
                                          const AttentionBlockShape& shape) = 0;
  virtual void do_attention_block_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout,
                                           const Tensor& qkv, const Tensor& kv, const Tensor& out,
                                           const Tensor& lse, const Tensor& q_pos,
                                           const Tensor& k_pos,
                                           const AttentionBlockShape& shape) = 0;

  virtual void do_embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                    const Tensor& wpe, int64_t T) = 0;
  virtual void do_embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                     const Tensor& tokens, int64_t T) = 0;
  virtual void do_embedding_forward_shard(const Tensor& out, const Tensor& tokens,
                                          const Tensor& wte, const Tensor& wpe, int64_t T,
                                          int64_t vocab_begin) = 0;
  virtual void do_embedding_backward_shard(const Tensor& dwte, const Tensor& dwpe,
                                           const Tensor& dout, const Tensor& tokens, int64_t T,
                                           int64_t vocab_begin) = 0;

  virtual void do_cross_entropy_forward(const Tensor& losses, const Tensor& lse,
                                        const Tensor& logits, const Tensor& targets) = 0;
  virtual void do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits,
                                         const Tensor& lse, const Tensor& targets,
                                         double grad_scale) = 0;
  virtual void do_cross_entropy_backward_shard(const Tensor& dlogits, const Tensor& logits,
                                               const Tensor& lse, const Tensor& targets,
                                               int64_t vocab_begin, double grad_scale) = 0;

  virtual RouterLosses do_moe_router_forward(const RouterArgs& args) = 0;
  virtual void do_moe_router_backward(const Tensor& dlogits, const Tensor& dgates,
                                      const RouterArgs& args, double aux_coef, double z_coef,
                                      double grad_scale) = 0;
  virtual void do_moe_permute(const Tensor& expert_in, const Tensor& x, const Tensor& slot) = 0;
  virtual void do_moe_permute_backward(const Tensor& dx, const Tensor& dexpert_in,
                                       const Tensor& slot) = 0;
  virtual void do_moe_unpermute(const Tensor& out, const Tensor& expert_out, const Tensor& gates,
                                const Tensor& slot) = 0;
  virtual void do_moe_unpermute_backward(const Tensor& dexpert_out, const Tensor& dgates,
                                         const Tensor& dout, const Tensor& expert_out,
                                         const Tensor& gates, const Tensor& slot) = 0;

  virtual void do_adamw(const Tensor& param, const Tensor& master, const Tensor& grad,
                        const Tensor& m, const Tensor& v, std::span<const AdamWRange> ranges,
                        const AdamW& hyper) = 0;
  virtual void do_momentum_update(const Tensor& param, const Tensor& master, const Tensor& grad,
                                  const Tensor& m, const Tensor& out,
                                  std::span<const AdamWRange> ranges, const Momentum& hyper) = 0;
  virtual void do_apply_update(const Tensor& param, const Tensor& master, const Tensor& update,
                               std::span<const AdamWRange> ranges, double lr,
                               double weight_decay) = 0;
};

// The CPU backend (lib/backend/cpu): OpenBLAS GEMMs (its thread count: OPENBLAS_NUM_THREADS) and
// single-threaded loops for everything else.
std::unique_ptr<Backend> make_cpu_backend();

// The CUDA backend on GPU `device` (lib/backend/cuda). Throws std::runtime_error naming the cause
// when this build has no CUDA or the device cannot be used; callers fall back to the CPU with
// that message.
std::unique_ptr<Backend> make_cuda_backend(int device, bool deterministic = true);

}  // namespace trainctl::backend
