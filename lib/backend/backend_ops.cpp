// Backend's public ops: for each, the op-family gate, the contract's argument checks (written once
// here for every backend, with ArgCheck's messages "<name> backend <op>: ..."), then the backend's
// do_<op>. The checks run in the order the CPU backend, the reference, has always run them, so its
// messages are unchanged; what only one backend can check stays in its do_<op> (backend.hpp).
#include <span>
#include <string_view>

#include <fmt/format.h>

#include "backend/arg_check.hpp"
#include "backend/backend.hpp"

namespace trainctl::backend {

namespace {

// Refuses an op of a family the backend does not declare; returns the backend's checker.
ArgCheck begin(const Backend& be, OpFamily family, std::string_view op) {
  const ArgCheck check(be);
  if (!be.supports(family))
    check.fail(op, fmt::format("the {} backend does not implement the {} op family "
                               "(capabilities().supports(OpFamily::{}) is false)",
                               be.name(), op_family_name(family), op_family_name(family)));
  return check;
}

// out's dtype and element count are those of ref.
void check_same(const ArgCheck& check, std::string_view op, std::string_view name, const Tensor& t,
                const Tensor& ref) {
  check.dtype(op, name, t, ref.dtype);
  check.numel(op, name, t, ref.numel());
}

void check_stats(const ArgCheck& check, std::string_view op, std::string_view name, const Tensor& t,
                 DType storage, int64_t count) {
  check.dtype(op, name, t, stats_dtype(storage));
  check.numel(op, name, t, count);
}

struct NormDims {
  int64_t N, C;
};

// x [N, C] with C = weight.numel(), weight of x's dtype.
NormDims check_norm(const ArgCheck& check, std::string_view op, const Tensor& x,
                    const Tensor& weight) {
  check.present(op, "x", x);
  check.dtype(op, "weight", weight, x.dtype);
  const int64_t C = weight.numel();
  return {check.rows(op, "x", x, C), C};
}

// The norms' backward: dx and dout like x, dweight (and dbias) [C] G, the statistics [N] A.
void check_norm_backward(const ArgCheck& check, std::string_view op, const NormDims& dims,
                         const Tensor& dx, const Tensor& dout, const Tensor& x,
                         const Tensor& dweight) {
  check.dtype(op, "dx", dx, x.dtype);
  check.numel(op, "dx", dx, dims.N * dims.C);
  check.dtype(op, "dout", dout, x.dtype);
  check.numel(op, "dout", dout, dims.N * dims.C);
  check.dtype(op, "dweight", dweight, grad_dtype(x.dtype));
  check.numel(op, "dweight", dweight, dims.C);
}

// The token table [V, C] (wte or dwte), the rows [N, C] (out or dout) of N = tokens.numel() i32
// tokens, whole sequences of T. Token values are the backend's to check where it can read them.
int64_t check_embedding(const ArgCheck& check, std::string_view op, std::string_view table_name,
                        const Tensor& table, std::string_view rows_name, const Tensor& rows,
                        const Tensor& tokens, int64_t T) {
  check.dtype(op, "tokens", tokens, DType::i32);
  check.present(op, table_name, table);
  if (table.shape.rank != 2)
    check.fail(op, fmt::format("the token table must be [V, C], got {}", table.shape.to_string()));
  const int64_t C = table.shape[1];
  const int64_t N = tokens.numel();
  check.numel(op, rows_name, rows, N * C);
  if (T <= 0 || N % T != 0)
    check.fail(op, fmt::format("{} tokens are not whole sequences of T={}", N, T));
  return C;
}

void check_positions(const ArgCheck& check, std::string_view op, std::string_view name,
                     const Tensor& wpe, DType dtype, int64_t T, int64_t C) {
  check.dtype(op, name, wpe, dtype);
  if (wpe.numel() < T * C)
    check.fail(op, fmt::format("{} has shape {}, fewer than T={} positions of C={}", name,
                               wpe.shape.to_string(), T, C));
}

void check_embedding_forward(const ArgCheck& check, std::string_view op, const Tensor& out,
                             const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                             int64_t T) {
  const int64_t C = check_embedding(check, op, "wte", wte, "out", out, tokens, T);
  check.dtype(op, "out", out, wte.dtype);
  if (!wpe.empty()) check_positions(check, op, "wpe", wpe, wte.dtype, T, C);
}

void check_embedding_backward(const ArgCheck& check, std::string_view op, const Tensor& dwte,
                              const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                              int64_t T) {
  check.present(op, "dout", dout);
  const int64_t C = check_embedding(check, op, "dwte", dwte, "dout", dout, tokens, T);
  check.dtype(op, "dwte", dwte, grad_dtype(dout.dtype));
  if (!dwpe.empty()) check_positions(check, op, "dwpe", dwpe, grad_dtype(dout.dtype), T, C);
}

// logits [N, V] with N = targets.numel() i32 targets; returns N. Target values are the backend's
// to check where it can read them.
int64_t check_targets(const ArgCheck& check, std::string_view op, const Tensor& logits,
                      const Tensor& targets) {
  check.present(op, "logits", logits);
  check.dtype(op, "targets", targets, DType::i32);
  const int64_t N = targets.numel();
  if (N <= 0) check.fail(op, "targets is empty");
  const int64_t V = logits.numel() / N;
  if (V <= 0 || logits.numel() != N * V)
    check.fail(op, fmt::format("logits {} is not [N={}, V]", logits.shape.to_string(), N));
  return N;
}

void check_cross_entropy_backward(const ArgCheck& check, std::string_view op, const Tensor& dlogits,
                                  const Tensor& logits, const Tensor& lse, const Tensor& targets) {
  const int64_t N = check_targets(check, op, logits, targets);
  check_same(check, op, "dlogits", dlogits, logits);
  check_stats(check, op, "lse", lse, logits.dtype, N);
}

}  // namespace

// ---- elementwise and reductions ----------------------------------------------------------------

void Backend::cast(const Tensor& dst, const Tensor& src) {
  constexpr std::string_view op = "cast";
  const ArgCheck check = begin(*this, OpFamily::elementwise, op);
  check.numel(op, "dst", dst, src.numel());
  if (!tensor::is_floating(dst.dtype) || !tensor::is_floating(src.dtype))
    check.fail(op, fmt::format("only floating dtypes convert (dst {}, src {})",
                               tensor::dtype_name(dst.dtype), tensor::dtype_name(src.dtype)));
  check.present(op, "src", src);
  do_cast(dst, src);
}

void Backend::copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                           int64_t cols) {
  constexpr std::string_view op = "copy_columns";
  const ArgCheck check = begin(*this, OpFamily::elementwise, op);
  check.present(op, "src", src);
  check.present(op, "dst", dst);
  check.dtype(op, "dst", dst, src.dtype);
  if (dst.shape.rank != 2 || src.shape.rank != 2 || dst.shape[0] != src.shape[0])
    check.fail(op, fmt::format("dst {} and src {} must be matrices with as many rows",
                               dst.shape.to_string(), src.shape.to_string()));
  if (cols < 0 || dst_col < 0 || src_col < 0 || dst_col + cols > dst.shape[1] ||
      src_col + cols > src.shape[1])
    check.fail(op, fmt::format("columns [{}, {}) of dst {} or [{}, {}) of src {} out of range",
                               dst_col, dst_col + cols, dst.shape.to_string(), src_col,
                               src_col + cols, src.shape.to_string()));
  do_copy_columns(dst, dst_col, src, src_col, cols);
}

void Backend::fill(const Tensor& dst, double value) {
  begin(*this, OpFamily::elementwise, "fill").present("fill", "dst", dst);
  do_fill(dst, value);
}

void Backend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  constexpr std::string_view op = "add";
  const ArgCheck check = begin(*this, OpFamily::elementwise, op);
  check.present(op, "out", out);
  check.numel(op, "a", a, out.numel());
  check.numel(op, "b", b, out.numel());
  do_add(out, a, b);
}

void Backend::accumulate(const Tensor& dst, const Tensor& src) {
  constexpr std::string_view op = "accumulate";
  const ArgCheck check = begin(*this, OpFamily::elementwise, op);
  check.present(op, "dst", dst);
  check.numel(op, "src", src, dst.numel());
  do_accumulate(dst, src);
}

void Backend::scale(const Tensor& dst, double factor) {
  begin(*this, OpFamily::elementwise, "scale").present("scale", "dst", dst);
  do_scale(dst, factor);
}

double Backend::sum(const Tensor& src) {
  begin(*this, OpFamily::reduction, "sum").present("sum", "src", src);
  return do_sum(src);
}

double Backend::sum_squares(const Tensor& src) {
  begin(*this, OpFamily::reduction, "sum_squares").present("sum_squares", "src", src);
  return do_sum_squares(src);
}

bool Backend::all_finite(const Tensor& src) {
  begin(*this, OpFamily::reduction, "all_finite").present("all_finite", "src", src);
  return do_all_finite(src);
}

void Backend::amax(const Tensor& out, const Tensor& src) {
  begin(*this, OpFamily::reduction, "amax").amax(out, src);
  do_amax(out, src);
}

// ---- GEMM --------------------------------------------------------------------------------------

void Backend::gemm(const GemmArgs& args) {
  const ArgCheck check = begin(*this, OpFamily::gemm, "gemm");
  if (args.fp8_a || args.fp8_b) (void)begin(*this, OpFamily::fp8, "gemm");
  check.gemm(args);
  do_gemm(args);
}

void Backend::bias_backward(const Tensor& dbias, const Tensor& dout) {
  constexpr std::string_view op = "bias_backward";
  const ArgCheck check = begin(*this, OpFamily::gemm, op);
  check.present(op, "dout", dout);
  check.dtype(op, "dbias", dbias, grad_dtype(dout.dtype));
  (void)check.rows(op, "dout", dout, dbias.numel());
  do_bias_backward(dbias, dout);
}

// ---- norms -------------------------------------------------------------------------------------

void Backend::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                const Tensor& x, const Tensor& weight, const Tensor& bias,
                                double eps) {
  constexpr std::string_view op = "layernorm_forward";
  const ArgCheck check = begin(*this, OpFamily::norm, op);
  const auto [N, C] = check_norm(check, op, x, weight);
  check.dtype(op, "out", out, x.dtype);
  check.numel(op, "out", out, N * C);
  check_stats(check, op, "mean", mean, x.dtype, N);
  check_stats(check, op, "rstd", rstd, x.dtype, N);
  if (!bias.empty()) {
    check.dtype(op, "bias", bias, x.dtype);
    check.numel(op, "bias", bias, C);
  }
  do_layernorm_forward(out, mean, rstd, x, weight, bias, eps);
}

void Backend::layernorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                 const Tensor& dout, const Tensor& x, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd) {
  constexpr std::string_view op = "layernorm_backward";
  const ArgCheck check = begin(*this, OpFamily::norm, op);
  const NormDims dims = check_norm(check, op, x, weight);
  check_norm_backward(check, op, dims, dx, dout, x, dweight);
  if (!dbias.empty()) {
    check.dtype(op, "dbias", dbias, grad_dtype(x.dtype));
    check.numel(op, "dbias", dbias, dims.C);
  }
  check_stats(check, op, "mean", mean, x.dtype, dims.N);
  check_stats(check, op, "rstd", rstd, x.dtype, dims.N);
  do_layernorm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd);
}

void Backend::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x,
                              const Tensor& weight, double eps) {
  constexpr std::string_view op = "rmsnorm_forward";
  const ArgCheck check = begin(*this, OpFamily::norm, op);
  const auto [N, C] = check_norm(check, op, x, weight);
  check.dtype(op, "out", out, x.dtype);
  check.numel(op, "out", out, N * C);
  check_stats(check, op, "rstd", rstd, x.dtype, N);
  do_rmsnorm_forward(out, rstd, x, weight, eps);
}

void Backend::rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                               const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  constexpr std::string_view op = "rmsnorm_backward";
  const ArgCheck check = begin(*this, OpFamily::norm, op);
  const NormDims dims = check_norm(check, op, x, weight);
  check_norm_backward(check, op, dims, dx, dout, x, dweight);
  check_stats(check, op, "rstd", rstd, x.dtype, dims.N);
  do_rmsnorm_backward(dx, dweight, dout, x, weight, rstd);
}

// ---- activations -------------------------------------------------------------------------------

void Backend::gelu_forward(const Tensor& out, const Tensor& x) {
  constexpr std::string_view op = "gelu_forward";
  const ArgCheck check = begin(*this, OpFamily::activation, op);
  check.present(op, "x", x);
  check_same(check, op, "out", out, x);
  do_gelu_forward(out, x);
}

void Backend::gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  constexpr std::string_view op = "gelu_backward";
  const ArgCheck check = begin(*this, OpFamily::activation, op);
  check.present(op, "x", x);
  check_same(check, op, "dx", dx, x);
  check_same(check, op, "dout", dout, x);
  do_gelu_backward(dx, dout, x);
}

void Backend::swiglu_forward(const Tensor& out, const Tensor& gate_up) {
  constexpr std::string_view op = "swiglu_forward";
  const ArgCheck check = begin(*this, OpFamily::activation, op);
  check.present(op, "gate_up", gate_up);
  check.dtype(op, "out", out, gate_up.dtype);
  if (out.shape.rank == 0) check.fail(op, "out must be [N, F]");
  const int64_t F = out.shape[out.shape.rank - 1];
  const int64_t N = check.rows(op, "out", out, F);
  check.numel(op, "gate_up", gate_up, N * 2 * F);
  do_swiglu_forward(out, gate_up);
}

void Backend::swiglu_backward(const Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) {
  constexpr std::string_view op = "swiglu_backward";
  const ArgCheck check = begin(*this, OpFamily::activation, op);
  check.present(op, "gate_up", gate_up);
  check.dtype(op, "dout", dout, gate_up.dtype);
  check_same(check, op, "dgate_up", dgate_up, gate_up);
  if (dout.shape.rank == 0) check.fail(op, "dout must be [N, F]");
  const int64_t F = dout.shape[dout.shape.rank - 1];
  const int64_t N = check.rows(op, "dout", dout, F);
  check.numel(op, "gate_up", gate_up, N * 2 * F);
  do_swiglu_backward(dgate_up, dout, gate_up);
}

// ---- RoPE --------------------------------------------------------------------------------------

void Backend::rope(const Tensor& out, const Tensor& x, int64_t T, int64_t rotated_heads, int64_t D,
                   double theta, bool inverse, const Tensor& positions) {
  constexpr std::string_view op = "rope";
  const ArgCheck check = begin(*this, OpFamily::rope, op);
  check.present(op, "x", x);
  check_same(check, op, "out", out, x);
  if (x.shape.rank < 2)
    check.fail(op, fmt::format("x must be [B*T, width], got {}", x.shape.to_string()));
  const int64_t N = x.shape[0];
  const int64_t width = N > 0 ? x.numel() / N : 0;
  if (T <= 0 || N % T != 0)
    check.fail(op, fmt::format("{} rows are not a whole number of sequences of T={}", N, T));
  if (D <= 0 || D % 2 != 0)
    check.fail(op, fmt::format("head size D={} must be even and positive", D));
  if (rotated_heads < 0 || rotated_heads * D > width)
    check.fail(op, fmt::format("{} rotated heads of D={} exceed the row width {}", rotated_heads, D,
                               width));
  if (!(theta > 0)) check.fail(op, fmt::format("theta={} must be positive", theta));
  if (!positions.empty()) {
    check.dtype(op, "positions", positions, DType::i32);
    check.numel(op, "positions", positions, T);
  }
  do_rope(out, x, T, rotated_heads, D, theta, inverse, positions);
}

// ---- attention ---------------------------------------------------------------------------------

void Backend::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                const AttentionShape& shape) {
  constexpr std::string_view op = "attention_forward";
  const ArgCheck check = begin(*this, OpFamily::attention, op);
  check.attention(op, shape);
  const auto [B, T, H, KV, D] = shape;
  check.present(op, "qkv", qkv);
  check.numel(op, "qkv", qkv, B * T * shape.qkv_width());
  check.dtype(op, "out", out, qkv.dtype);
  check.numel(op, "out", out, B * T * H * D);
  check_stats(check, op, "lse", lse, qkv.dtype, B * H * T);
  do_attention_forward(out, lse, qkv, shape);
}

void Backend::attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                 const Tensor& out, const Tensor& lse,
                                 const AttentionShape& shape) {
  constexpr std::string_view op = "attention_backward";
  const ArgCheck check = begin(*this, OpFamily::attention, op);
  check.attention(op, shape);
  const auto [B, T, H, KV, D] = shape;
  check.present(op, "qkv", qkv);
  check.numel(op, "qkv", qkv, B * T * shape.qkv_width());
  check_same(check, op, "dqkv", dqkv, qkv);
  check.dtype(op, "out", out, qkv.dtype);
  check.numel(op, "out", out, B * T * H * D);
  check.dtype(op, "dout", dout, qkv.dtype);
  check.numel(op, "dout", dout, B * T * H * D);
  check_stats(check, op, "lse", lse, qkv.dtype, B * H * T);
  do_attention_backward(dqkv, dout, qkv, out, lse, shape);
}

namespace {

// The operands every attention block op shares: the queries' qkv and the block's kv in one
// storage type, the positions i32, and out and lse in the stats type.
void check_attention_block(const ArgCheck& check, std::string_view op, const Tensor& out,
                           const Tensor& lse, const Tensor& qkv, const Tensor& kv,
                           const Tensor& q_pos, const Tensor& k_pos, const AttentionBlockShape& s) {
  check.attention_block(op, s);
  check.present(op, "qkv", qkv);
  check.numel(op, "qkv", qkv, s.B * s.Tq * s.qkv_width());
  check.dtype(op, "kv", kv, qkv.dtype);
  check.numel(op, "kv", kv, s.B * s.Tk * s.kv_width());
  check.dtype(op, "q_pos", q_pos, DType::i32);
  check.numel(op, "q_pos", q_pos, s.Tq);
  check.dtype(op, "k_pos", k_pos, DType::i32);
  check.numel(op, "k_pos", k_pos, s.Tk);
  check_stats(check, op, "out", out, qkv.dtype, s.B * s.Tq * s.H * s.D);
  check_stats(check, op, "lse", lse, qkv.dtype, s.B * s.H * s.Tq);
}

}  // namespace

void Backend::attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                      const Tensor& kv, const Tensor& q_pos, const Tensor& k_pos,
                                      const AttentionBlockShape& shape) {
  constexpr std::string_view op = "attention_block_forward";
  const ArgCheck check = begin(*this, OpFamily::attention, op);
  check_attention_block(check, op, out, lse, qkv, kv, q_pos, k_pos, shape);
  do_attention_block_forward(out, lse, qkv, kv, q_pos, k_pos, shape);
}

void Backend::attention_block_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout,
                                       const Tensor& qkv, const Tensor& kv, const Tensor& out,
                                       const Tensor& lse, const Tensor& q_pos, const Tensor& k_pos,
                                       const AttentionBlockShape& shape) {
  constexpr std::string_view op = "attention_block_backward";
  const ArgCheck check = begin(*this, OpFamily::attention, op);
  check_attention_block(check, op, out, lse, qkv, kv, q_pos, k_pos, shape);
  check.dtype(op, "dout", dout, qkv.dtype);
  check.numel(op, "dout", dout, shape.B * shape.Tq * shape.H * shape.D);
  check_stats(check, op, "dq", dq, qkv.dtype, shape.B * shape.Tq * shape.H * shape.D);
  check_stats(check, op, "dkv", dkv, qkv.dtype, shape.B * shape.Tk * shape.kv_width());
  do_attention_block_backward(dq, dkv, dout, qkv, kv, out, lse, q_pos, k_pos, shape);
}

// ---- embeddings --------------------------------------------------------------------------------

void Backend::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                const Tensor& wpe, int64_t T) {
  check_embedding_forward(begin(*this, OpFamily::embedding, "embedding_forward"),
                          "embedding_forward", out, tokens, wte, wpe, T);
  do_embedding_forward(out, tokens, wte, wpe, T);
}

void Backend::embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                 const Tensor& tokens, int64_t T) {
  check_embedding_backward(begin(*this, OpFamily::embedding, "embedding_backward"),
                           "embedding_backward", dwte, dwpe, dout, tokens, T);
  do_embedding_backward(dwte, dwpe, dout, tokens, T);
}

void Backend::embedding_forward_shard(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                      const Tensor& wpe, int64_t T, int64_t vocab_begin) {
  check_embedding_forward(begin(*this, OpFamily::embedding, "embedding_forward_shard"),
                          "embedding_forward_shard", out, tokens, wte, wpe, T);
  do_embedding_forward_shard(out, tokens, wte, wpe, T, vocab_begin);
}

void Backend::embedding_backward_shard(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                       const Tensor& tokens, int64_t T, int64_t vocab_begin) {
  check_embedding_backward(begin(*this, OpFamily::embedding, "embedding_backward_shard"),
                           "embedding_backward_shard", dwte, dwpe, dout, tokens, T);
  do_embedding_backward_shard(dwte, dwpe, dout, tokens, T, vocab_begin);
}

// ---- loss --------------------------------------------------------------------------------------

void Backend::cross_entropy_forward(const Tensor& losses, const Tensor& lse, const Tensor& logits,
                                    const Tensor& targets) {
  constexpr std::string_view op = "cross_entropy_forward";
  const ArgCheck check = begin(*this, OpFamily::loss, op);
  const int64_t N = check_targets(check, op, logits, targets);
  check_stats(check, op, "losses", losses, logits.dtype, N);
  check_stats(check, op, "lse", lse, logits.dtype, N);
  do_cross_entropy_forward(losses, lse, logits, targets);
}

void Backend::cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                     const Tensor& targets, double grad_scale) {
  constexpr std::string_view op = "cross_entropy_backward";
  check_cross_entropy_backward(begin(*this, OpFamily::loss, op), op, dlogits, logits, lse, targets);
  do_cross_entropy_backward(dlogits, logits, lse, targets, grad_scale);
}

void Backend::cross_entropy_backward_shard(const Tensor& dlogits, const Tensor& logits,
                                           const Tensor& lse, const Tensor& targets,
                                           int64_t vocab_begin, double grad_scale) {
  constexpr std::string_view op = "cross_entropy_backward_shard";
  check_cross_entropy_backward(begin(*this, OpFamily::loss, op), op, dlogits, logits, lse, targets);
  do_cross_entropy_backward_shard(dlogits, logits, lse, targets, vocab_begin, grad_scale);
}

// ---- mixture of experts ------------------------------------------------------------------------

RouterLosses Backend::moe_router_forward(const RouterArgs& args) {
  (void)begin(*this, OpFamily::moe, "moe_router_forward").router("moe_router_forward", args);
  return do_moe_router_forward(args);
}

void Backend::moe_router_backward(const Tensor& dlogits, const Tensor& dgates,
                                  const RouterArgs& args, double aux_coef, double z_coef,
                                  double grad_scale) {
  constexpr std::string_view op = "moe_router_backward";
  const ArgCheck check = begin(*this, OpFamily::moe, op);
  const auto [N, E, K] = check.router(op, args);
  check.dtype(op, "dlogits", dlogits, args.logits.dtype);
  check.numel(op, "dlogits", dlogits, N * E);
  check_stats(check, op, "dgates", dgates, args.logits.dtype, N * K);
  do_moe_router_backward(dlogits, dgates, args, aux_coef, z_coef, grad_scale);
}

void Backend::moe_permute(const Tensor& expert_in, const Tensor& x, const Tensor& slot) {
  constexpr std::string_view op = "moe_permute";
  (void)begin(*this, OpFamily::moe, op).permute(op, "x", x, "expert_in", expert_in, slot);
  do_moe_permute(expert_in, x, slot);
}

void Backend::moe_permute_backward(const Tensor& dx, const Tensor& dexpert_in, const Tensor& slot) {
  constexpr std::string_view op = "moe_permute_backward";
  (void)begin(*this, OpFamily::moe, op).permute(op, "dx", dx, "dexpert_in", dexpert_in, slot);
  do_moe_permute_backward(dx, dexpert_in, slot);
}

void Backend::moe_unpermute(const Tensor& out, const Tensor& expert_out, const Tensor& gates,
                            const Tensor& slot) {
  constexpr std::string_view op = "moe_unpermute";
  const ArgCheck check = begin(*this, OpFamily::moe, op);
  const auto [N, K, C, R] = check.permute(op, "out", out, "expert_out", expert_out, slot);
  check_stats(check, op, "gates", gates, out.dtype, N * K);
  do_moe_unpermute(out, expert_out, gates, slot);
}

void Backend::moe_unpermute_backward(const Tensor& dexpert_out, const Tensor& dgates,
                                     const Tensor& dout, const Tensor& expert_out,
                                     const Tensor& gates, const Tensor& slot) {
  constexpr std::string_view op = "moe_unpermute_backward";
  const ArgCheck check = begin(*this, OpFamily::moe, op);
  const auto [N, K, C, R] = check.permute(op, "dout", dout, "expert_out", expert_out, slot);
  check.dtype(op, "dexpert_out", dexpert_out, dout.dtype);
  check.numel(op, "dexpert_out", dexpert_out, R * C);
  check_stats(check, op, "gates", gates, dout.dtype, N * K);
  check_stats(check, op, "dgates", dgates, dout.dtype, N * K);
  do_moe_unpermute_backward(dexpert_out, dgates, dout, expert_out, gates, slot);
}

// ---- optimizer ---------------------------------------------------------------------------------

namespace {

// The optimizer state's type: G, or bf16 beside f32 G (optimizer.state_dtype: bf16).
DType moment_dtype(const ArgCheck& check, std::string_view op, DType g_type, const Tensor& m) {
  if (m.dtype == DType::bf16 && g_type == DType::f32) return DType::bf16;
  check.dtype(op, "m", m, g_type);
  return g_type;
}

}  // namespace

void Backend::adamw(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
                    const Tensor& v, std::span<const AdamWRange> ranges, const AdamW& hyper) {
  constexpr std::string_view op = "adamw";
  const ArgCheck check = begin(*this, OpFamily::optimizer, op);
  check.present(op, "param", param);
  const int64_t count = param.numel();
  const DType g_type = grad_dtype(param.dtype);
  check.dtype(op, "grad", grad, g_type);
  check.numel(op, "grad", grad, count);
  const DType m_type = moment_dtype(check, op, g_type, m);
  for (const auto& [name, t] : {std::pair<std::string_view, const Tensor*>{"m", &m},
                                std::pair<std::string_view, const Tensor*>{"v", &v}}) {
    check.dtype(op, name, *t, m_type);
    check.numel(op, name, *t, count);
  }
  if (!master.empty()) {
    check.dtype(op, "master", master, g_type);
    check.numel(op, "master", master, count);
  }
  check.adamw_ranges(op, count, ranges);
  if (hyper.step < 1) check.fail(op, fmt::format("step={} must count from 1", hyper.step));
  do_adamw(param, master, grad, m, v, ranges, hyper);
}

void Backend::adamw(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
                    const Tensor& v, const AdamW& hyper) {
  const AdamWRange whole{0, param.numel(), true};
  adamw(param, master, grad, m, v, std::span<const AdamWRange>(&whole, 1), hyper);
}

void Backend::momentum_update(const Tensor& param, const Tensor& master, const Tensor& grad,
                              const Tensor& m, const Tensor& out,
                              std::span<const AdamWRange> ranges, const Momentum& hyper) {
  constexpr std::string_view op = "momentum_update";
  const ArgCheck check = begin(*this, OpFamily::optimizer, op);
  check.present(op, "param", param);
  const int64_t count = param.numel();
  const DType g_type = grad_dtype(param.dtype);
  check.present(op, "grad", grad);
  check.dtype(op, "grad", grad, g_type);
  check.numel(op, "grad", grad, count);
  const bool needs_m = hyper.rule != MomentumRule::sgd || hyper.beta1 != 0;
  if (needs_m || !m.empty()) {
    check.present(op, "m", m);
    moment_dtype(check, op, g_type, m);
    check.numel(op, "m", m, count);
  }
  if (hyper.rule == MomentumRule::muon) {
    check.present(op, "out", out);
    check.dtype(op, "out", out, g_type);
    check.numel(op, "out", out, count);
  }
  if (!master.empty()) {
    check.dtype(op, "master", master, g_type);
    check.numel(op, "master", master, count);
  }
  check.adamw_ranges(op, count, ranges);
  do_momentum_update(param, master, grad, m, out, ranges, hyper);
}

void Backend::apply_update(const Tensor& param, const Tensor& master, const Tensor& update,
                           std::span<const AdamWRange> ranges, double lr, double weight_decay) {
  constexpr std::string_view op = "apply_update";
  const ArgCheck check = begin(*this, OpFamily::optimizer, op);
  check.present(op, "param", param);
  const int64_t count = param.numel();
  const DType g_type = grad_dtype(param.dtype);
  check.present(op, "update", update);
  check.dtype(op, "update", update, g_type);
  check.numel(op, "update", update, count);
  if (!master.empty()) {
    check.dtype(op, "master", master, g_type);
    check.numel(op, "master", master, count);
  }
  check.adamw_ranges(op, count, ranges);
  do_apply_update(param, master, update, ranges, lr, weight_decay);
}

}  // namespace trainctl::backend
