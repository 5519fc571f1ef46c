#include "model/layers.hpp"

#include <cmath>

namespace trainctl::model {

using backend::GemmArgs;

// ---- Linear ---------------------------------------------------------------------------------

void Linear::forward(Backend& be, const Tensor& y, const Tensor& x) const {
  GemmArgs g;
  g.a = x;
  g.b = weight.value;
  g.c = y;
  g.trans_b = true;
  g.m = x.shape[0];
  g.k = weight.value.shape[1];
  g.n = weight.value.shape[0];
  g.bias = bias.value;
  be.gemm(g);
}

void Linear::backward(Backend& be, const Tensor& dx, const Tensor& dy, const Tensor& x) const {
  const int64_t rows = x.shape[0], in = weight.value.shape[1], out = weight.value.shape[0];
  if (!dx.empty()) {  // dx[N, in] = dy[N, out] W[out, in]
    GemmArgs g;
    g.a = dy;
    g.b = weight.value;
    g.c = dx;
    g.m = rows;
    g.n = in;
    g.k = out;
    be.gemm(g);
  }
  {  // dW[out, in] += dy^T x
    GemmArgs g;
    g.a = dy;
    g.b = x;
    g.c = weight.grad;
    g.trans_a = true;
    g.m = out;
    g.n = in;
    g.k = rows;
    g.beta = 1.0;
    be.gemm(g);
  }
  if (!bias.value.empty()) be.bias_backward(bias.grad, dy);
}

// ---- Norm -----------------------------------------------------------------------------------

void Norm::forward(Backend& be, const Tensor& out, const Saved& s, const Tensor& x) const {
  if (kind == NormKind::layernorm)
    be.layernorm_forward(out, s.mean, s.rstd, x, weight.value, bias.value, eps);
  else
    be.rmsnorm_forward(out, s.rstd, x, weight.value, eps);
}

void Norm::backward(Backend& be, const Tensor& dx, const Tensor& dout, const Tensor& x,
                    const Saved& s) const {
  if (kind == NormKind::layernorm)
    be.layernorm_backward(dx, weight.grad, bias.grad, dout, x, weight.value, s.mean, s.rstd);
  else
    be.rmsnorm_backward(dx, weight.grad, dout, x, weight.value, s.rstd);
}

// ---- Attention ------------------------------------------------------------------------------

void Attention::forward(Backend& be, const Tensor& out, const Tensor& x, int64_t B, int64_t T,
                        const Saved& s, const Scratch& scratch) const {
  if (rope) {
    qkv.forward(be, scratch.qkv_raw, x);
    be.rope(s.qkv, scratch.qkv_raw, T, heads + kv_heads, head_dim, rope_theta, false);
  } else {
    qkv.forward(be, s.qkv, x);
  }
  be.attention_forward(s.attn_out, s.lse, s.qkv, shape(B, T));
  proj.forward(be, out, s.attn_out);
}

void Attention::backward(Backend& be, const Tensor& dx, const Tensor& dout, const Tensor& x,
                         int64_t B, int64_t T, const Saved& s, const Scratch& scratch) const {
  proj.backward(be, scratch.dattn, dout, s.attn_out);
  be.attention_backward(scratch.dqkv, scratch.dattn, s.qkv, s.attn_out, s.lse, shape(B, T));
  if (rope) {
    be.rope(scratch.dqkv_raw, scratch.dqkv, T, heads + kv_heads, head_dim, rope_theta, true);
    qkv.backward(be, dx, scratch.dqkv_raw, x);
  } else {
    qkv.backward(be, dx, scratch.dqkv, x);
  }
}

// ---- MLP ------------------------------------------------------------------------------------

void Mlp::activate(Backend& be, const Saved& s) const {
  if (activation == ActivationKind::gelu)
    be.gelu_forward(s.act_out, s.fc1_out);
  else
    be.swiglu_forward(s.act_out, s.fc1_out);
}

void Mlp::forward(Backend& be, const Tensor& out, const Tensor& x, const Saved& s) const {
  fc1.forward(be, s.fc1_out, x);
  activate(be, s);
  fc2.forward(be, out, s.act_out);
}

void Mlp::backward(Backend& be, const Tensor& dx, const Tensor& dout, const Tensor& x,
                   const Saved& s, const Scratch& scratch) const {
  fc2.backward(be, scratch.dact, dout, s.act_out);
  if (activation == ActivationKind::gelu)
    be.gelu_backward(scratch.dfc1, scratch.dact, s.fc1_out);
  else
    be.swiglu_backward(scratch.dfc1, scratch.dact, s.fc1_out);
  fc1.backward(be, dx, scratch.dfc1, x);
}

// ---- MoE ------------------------------------------------------------------------------------

int64_t Moe::capacity(int64_t tokens) const {
  if (capacity_factor <= 0) return tokens;  // unlimited: every token fits
  const double slots =
      capacity_factor * static_cast<double>(tokens * top_k) / static_cast<double>(num_experts());
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(slots)));
}

namespace {
// The rows of expert e inside an [E*cap, ...] buffer, limited to the tokens it received.
Tensor expert_rows(const Tensor& t, int64_t e, int64_t cap, int64_t count) {
  return t.rows(e * cap, count);
}
Mlp::Saved expert_saved(const Mlp::Saved& s, int64_t e, int64_t cap, int64_t count) {
  return {expert_rows(s.fc1_out, e, cap, count), expert_rows(s.act_out, e, cap, count)};
}
}  // namespace

backend::RouterLosses Moe::forward(Backend& be, const Tensor& out, const Tensor& x,
                                   Saved& s) const {
  router.forward(be, s.route.logits, x);
  const backend::RouterLosses losses = be.moe_router_forward(s.route);
  s.counts.resize(static_cast<size_t>(num_experts()));
  be.copy_to_host(s.counts.data(), s.route.counts);
  be.moe_permute(s.expert_in, x, s.route.slot);
  const int64_t cap = s.route.capacity;
  for (int64_t e = 0; e < num_experts(); ++e) {
    const int64_t count = s.counts[static_cast<size_t>(e)];
    if (count == 0) continue;
    experts[static_cast<size_t>(e)].forward(be, expert_rows(s.expert_out, e, cap, count),
                                            expert_rows(s.expert_in, e, cap, count),
                                            expert_saved(s.expert, e, cap, count));
  }
  be.moe_unpermute(out, s.expert_out, s.route.gates, s.route.slot);
  return losses;
}

void Moe::activate(Backend& be, const Saved& s) const {
  const int64_t cap = s.route.capacity;
  for (int64_t e = 0; e < num_experts(); ++e) {
    const int64_t count = s.counts[static_cast<size_t>(e)];
    if (count > 0)
      experts[static_cast<size_t>(e)].activate(be, expert_saved(s.expert, e, cap, count));
  }
}

void Moe::backward(Backend& be, const Tensor& dx, const Tensor& dout, const Tensor& x,
                   const Saved& s, const Scratch& scratch, double loss_grad_scale) const {
  be.moe_unpermute_backward(scratch.dexpert_out, scratch.dgates, dout, s.expert_out, s.route.gates,
                            s.route.slot);
  const int64_t cap = s.route.capacity;
  for (int64_t e = 0; e < num_experts(); ++e) {
    const int64_t count = s.counts[static_cast<size_t>(e)];
    if (count == 0) continue;
    const Mlp::Scratch rows{expert_rows(scratch.expert.dact, e, cap, count),
                            expert_rows(scratch.expert.dfc1, e, cap, count)};
    experts[static_cast<size_t>(e)].backward(be, expert_rows(scratch.dexpert_in, e, cap, count),
                                             expert_rows(scratch.dexpert_out, e, cap, count),
                                             expert_rows(s.expert_in, e, cap, count),
                                             expert_saved(s.expert, e, cap, count), rows);
  }
  be.moe_permute_backward(dx, scratch.dexpert_in, s.route.slot);
  be.moe_router_backward(scratch.dlogits, scratch.dgates, s.route, aux_loss_coef, z_loss_coef,
                         loss_grad_scale);
  router.backward(be, scratch.dx_router, scratch.dlogits, x);
  be.accumulate(dx, scratch.dx_router);
}

}  // namespace trainctl::model
