#include "model/layers.hpp"

#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

namespace trainctl::model {

using backend::GemmArgs;

// ---- TensorParallel -------------------------------------------------------------------------

void TensorParallel::all_reduce(const Tensor& t) const {
  if (comm) comm->all_reduce_sum(t.data, static_cast<size_t>(t.numel()), t.dtype);
}

Tensor TensorParallel::local_rows(const Tensor& whole) const {
  const int64_t n = whole.shape[0] / comm->size();
  return whole.rows(comm->rank() * n, n);
}

Tensor TensorParallel::gather(const Tensor& local) const {
  if (!split_rows()) return local;
  const Tensor whole = gathered.rows(0, local.shape[0] * comm->size());
  comm->all_gather(local.data, whole.data, local.bytes());
  return whole;
}

Tensor TensorParallel::partial_for(const Tensor& out) const {
  return split_rows() ? partial.rows(0, out.shape[0] * comm->size()) : out;
}

void TensorParallel::reduce(const Tensor& out) const {
  if (!active()) return;
  if (split_rows())
    comm->reduce_scatter_sum(partial_for(out).data, out.data, static_cast<size_t>(out.numel()),
                             out.dtype);
  else
    all_reduce(out);
}

void TensorParallel::add_bias(Backend& be, const Tensor& y, const Tensor& bias) const {
  if (bias.empty()) return;
  GemmArgs g;  // y[rows, n] += ones[rows, 1] bias[1, n]: every element gets exactly bias[n]
  g.a = ones.rows(0, y.shape[0]);
  g.b = bias;
  g.c = y;
  g.m = y.shape[0];
  g.n = bias.numel();
  g.k = 1;
  g.beta = 1.0;
  be.gemm(g);
}

void TensorParallel::group_amax(Backend& be, std::initializer_list<Tensor> operands) const {
  int i = 0;
  for (const Tensor& t : operands)
    be.amax(amax_of(i++), t);
  comm->all_reduce_max(amax.data, operands.size(), DType::f32);
}

namespace {
// A row-parallel layer: the local partial product, summed over tp, then the bias.
void row_parallel_forward(Backend& be, const Linear& layer, const TensorParallel& tp,
                          const Tensor& y, const Tensor& x) {
  Linear{layer.weight, Param{}, layer.fp8, layer.tp}.forward(be, tp.partial_for(y), x);
  tp.reduce(y);
  tp.add_bias(be, y, layer.bias.value);
}
bool tp_active(const TensorParallel* tp) {
  return tp != nullptr && tp->active();
}

// The fp8 formats of a Linear's operands: inputs and weights, and output gradients.
std::optional<DType> fp8_input(Fp8Mode mode) {
  if (mode == Fp8Mode::none) return std::nullopt;
  return DType::e4m3;
}
std::optional<DType> fp8_grad(Fp8Mode mode) {
  if (mode == Fp8Mode::none) return std::nullopt;
  return mode == Fp8Mode::hybrid ? DType::e5m2 : DType::e4m3;
}
}  // namespace

// ---- Linear ---------------------------------------------------------------------------------

namespace {
// y = x W^T + b as one GEMM.
GemmArgs forward_args(const Linear& layer, const Tensor& y, const Tensor& x) {
  GemmArgs g;
  g.a = x;
  g.b = layer.weight.value;
  g.c = y;
  g.trans_b = true;
  g.m = x.shape[0];
  g.k = layer.weight.value.shape[1];
  g.n = layer.weight.value.shape[0];
  g.bias = layer.bias.value;
  return g;
}

// fp8 on a tp-sharded layer: the operands' scales come from the group (TensorParallel).
bool group_scaled(const Linear& layer) {
  return layer.fp8 != Fp8Mode::none && tp_active(layer.tp);
}
}  // namespace

void Linear::forward(Backend& be, const Tensor& y, const Tensor& x) const {
  GemmArgs g = forward_args(*this, y, x);
  g.fp8_a = g.fp8_b = fp8_input(fp8);
  if (group_scaled(*this)) {
    tp->group_amax(be, {x, weight.value});
    g.amax_a = tp->amax_of(0);
    g.amax_b = tp->amax_of(1);
  }
  be.gemm(g);
}

void Linear::forward_gelu(Backend& be, const Tensor& y, const Tensor& pre, const Tensor& x) const {
  GemmArgs g = forward_args(*this, y, x);
  g.epilogue = backend::Epilogue::gelu;
  g.pre_gelu = pre;
  be.gemm(g);
}

// dx[N, in] = dy[N, out] W[out, in]; the fp8 group amaxes of dy and W given (tp), or none.
void Linear::input_gemm(Backend& be, const Tensor& dx, const Tensor& dy, const Tensor& amax_dy,
                        const Tensor& amax_w) const {
  GemmArgs g;
  g.a = dy;
  g.b = weight.value;
  g.c = dx;
  g.m = dy.shape[0];
  g.n = weight.value.shape[1];
  g.k = weight.value.shape[0];
  g.fp8_a = fp8_grad(fp8);
  g.fp8_b = fp8_input(fp8);
  g.amax_a = amax_dy;
  g.amax_b = amax_w;
  be.gemm(g);
}

// dW[out, in] += dy^T x, db += the column sums of dy; the fp8 group amaxes of dy and x, or none.
void Linear::weight_gemm(Backend& be, const Tensor& dy, const Tensor& x, const Tensor& amax_dy,
                         const Tensor& amax_x) const {
  GemmArgs g;
  g.a = dy;
  g.b = x;
  g.c = weight.grad;
  g.trans_a = true;
  g.m = weight.value.shape[0];
  g.n = weight.value.shape[1];
  g.k = x.shape[0];
  g.beta = 1.0;
  g.fp8_a = fp8_grad(fp8);
  g.fp8_b = fp8_input(fp8);
  g.amax_a = amax_dy;
  g.amax_b = amax_x;
  be.gemm(g);
  if (!bias.value.empty()) be.bias_backward(bias.grad, dy);
}

void Linear::backward(Backend& be, const Tensor& dx, const Tensor& dy, const Tensor& x) const {
  const bool grouped = group_scaled(*this);
  if (grouped) tp->group_amax(be, {dy, weight.value, x});
  const Tensor amax_dy = grouped ? tp->amax_of(0) : Tensor{};
  if (!dx.empty()) input_gemm(be, dx, dy, amax_dy, grouped ? tp->amax_of(1) : Tensor{});
  weight_gemm(be, dy, x, amax_dy, grouped ? tp->amax_of(2) : Tensor{});
}

// The same group amaxes as backward()'s (each entry is the max of one operand over the group).
void Linear::backward_input(Backend& be, const Tensor& dx, const Tensor& dy) const {
  const bool grouped = group_scaled(*this);
  if (grouped) tp->group_amax(be, {dy, weight.value});
  input_gemm(be, dx, dy, grouped ? tp->amax_of(0) : Tensor{}, grouped ? tp->amax_of(1) : Tensor{});
}

void Linear::backward_weights(Backend& be, const Tensor& dy, const Tensor& x) const {
  const bool grouped = group_scaled(*this);
  if (grouped) tp->group_amax(be, {dy, x});
  weight_gemm(be, dy, x, grouped ? tp->amax_of(0) : Tensor{}, grouped ? tp->amax_of(1) : Tensor{});
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
  const bool split = tp != nullptr && tp->split_rows();
  Tensor dweight = weight.grad, dbias = bias.grad, both;
  if (split) {  // this rank's rows' gradients, summed over tp, then added
    const int64_t C = weight.grad.numel();
    both = tp->norm_grads.rows(0, bias.grad.empty() ? C : 2 * C);
    be.fill(both, 0.0);
    dweight = both.rows(0, C);
    if (!bias.grad.empty()) dbias = both.rows(C, C);
  }
  if (kind == NormKind::layernorm)
    be.layernorm_backward(dx, dweight, dbias, dout, x, weight.value, s.mean, s.rstd);
  else
    be.rmsnorm_backward(dx, dweight, dout, x, weight.value, s.rstd);
  if (!split) return;
  tp->all_reduce(both);
  be.accumulate(weight.grad, dweight);
  if (!bias.grad.empty()) be.accumulate(bias.grad, dbias);
}

// ---- Attention ------------------------------------------------------------------------------

std::shared_ptr<comm::Work> ContextParallel::pass(const Tensor& send, const Tensor& receive) const {
  const int P = comm->size(), r = comm->rank();
  std::vector<size_t> sent(static_cast<size_t>(P), 0), received(sent);
  sent[static_cast<size_t>((r + 1) % P)] = send.bytes();
  received[static_cast<size_t>((r + P - 1) % P)] = receive.bytes();
  if (ring) {
    std::function<void()> ready;
    if (backend) {
      std::shared_ptr<Backend::Fence> written = backend->fence();
      ready = [written] { written->wait(); };
    }
    return ring->start_all_to_allv(send.data, std::move(sent), receive.data, std::move(received),
                                   std::move(ready));
  }
  const auto start = std::chrono::steady_clock::now();
  comm->all_to_allv(send.data, sent, receive.data, received);
  waited_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return nullptr;
}

void ContextParallel::finish(const std::shared_ptr<comm::Work>& work) const {
  if (!work) return;
  const auto start = std::chrono::steady_clock::now();
  work->wait();
  waited_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

namespace {

// Context parallel: the rank's queries against every rank's key/value block, one ring step at a
// time (the block held is passed on, the next one received), merged into the running output
// and lse (A); the output rounded to S once at the end.
void ring_forward(Backend& be, const Attention& a, const ContextParallel& cp,
                  const Attention::Saved& s, int64_t B, int64_t T) {
  const int P = cp.comm->size(), r = cp.comm->rank();
  const int64_t HD = a.heads * a.head_dim, KVW = 2 * a.kv_heads * a.head_dim;
  const backend::AttentionBlockShape shape{B, T, T, a.heads, a.kv_heads, a.head_dim};
  be.fill(cp.out, 0.0);
  be.fill(s.lse, -INFINITY);
  be.copy_columns(cp.kv[0], 0, s.qkv, HD, KVW);
  for (int step = 0; step < P; ++step) {
    // The next block travels while this one's attention computes (both only read `held`).
    const Tensor& held = cp.kv[step % 2];
    const std::shared_ptr<comm::Work> next =
        step + 1 < P ? cp.pass(held, cp.kv[(step + 1) % 2]) : nullptr;
    be.attention_block_forward(cp.out, s.lse, s.qkv, held, cp.positions,
                               cp.ring_positions[static_cast<size_t>((r - step + P) % P)], shape);
    cp.finish(next);
  }
  be.cast(s.attn_out, cp.out);
}

// Its backward: each block travels the ring again with its key/value gradients, every rank adding
// its queries' share; after the last step the gradients go back to their owner. A rank computes
// its share into dkv_local while both the next block's keys and values and the held block's
// gradients so far are still arriving, then adds them (ring-flash-attention's order, the same
// with blocking passes). dqkv (S) gets the rank's dq and its own block's dk, dv.
void ring_backward(Backend& be, const Attention& a, const ContextParallel& cp,
                   const Attention::Saved& s, const Tensor& dattn, const Tensor& dqkv, int64_t B,
                   int64_t T) {
  const int P = cp.comm->size(), r = cp.comm->rank();
  const int64_t HD = a.heads * a.head_dim, KVW = 2 * a.kv_heads * a.head_dim;
  const backend::AttentionBlockShape shape{B, T, T, a.heads, a.kv_heads, a.head_dim};
  be.cast(cp.out, s.attn_out);
  be.fill(cp.dq, 0.0);
  be.copy_columns(cp.kv[0], 0, s.qkv, HD, KVW);
  int at = 0;
  std::shared_ptr<comm::Work> arriving;  // the held block's gradients from the ranks before
  for (int step = 0; step < P; ++step) {
    at = step % 2;
    const std::shared_ptr<comm::Work> next =
        step + 1 < P ? cp.pass(cp.kv[at], cp.kv[1 - at]) : nullptr;
    be.fill(cp.dkv_local, 0.0);
    be.attention_block_backward(cp.dq, cp.dkv_local, dattn, s.qkv, cp.kv[at], cp.out, s.lse,
                                cp.positions,
                                cp.ring_positions[static_cast<size_t>((r - step + P) % P)], shape);
    cp.finish(next);
    cp.finish(arriving);
    if (step == 0)
      be.cast(cp.dkv[at], cp.dkv_local);  // the rank's own block: nobody added to it yet
    else
      be.accumulate(cp.dkv[at], cp.dkv_local);
    // On to the next rank, which needs them only after its own share of that block; at the last
    // step the block held is rank r + 1's, so its gradients go home and rank r - 1 returns ours.
    arriving = P > 1 ? cp.pass(cp.dkv[at], cp.dkv[1 - at]) : nullptr;
  }
  cp.finish(arriving);
  const Tensor own = P > 1 ? cp.dkv[1 - at] : cp.dkv[at];
  be.copy_columns(cp.dqkv, 0, cp.dq, 0, HD);
  be.copy_columns(cp.dqkv, HD, own, 0, KVW);
  be.cast(dqkv, cp.dqkv);
}

bool cp_active(const ContextParallel* cp) {
  return cp != nullptr && cp->active();
}

}  // namespace

void Attention::forward(Backend& be, const Tensor& out, const Tensor& x, int64_t B, int64_t T,
                        const Saved& s, const Scratch& scratch) const {
  const Tensor whole = tp_active(tp) ? tp->gather(x) : x;
  const Tensor positions = cp_active(cp) ? cp->positions : Tensor{};
  if (rope) {
    qkv.forward(be, scratch.qkv_raw, whole);
    be.rope(s.qkv, scratch.qkv_raw, T, heads + kv_heads, head_dim, rope_theta, false, positions);
  } else {
    qkv.forward(be, s.qkv, whole);
  }
  if (cp_active(cp))
    ring_forward(be, *this, *cp, s, B, T);
  else
    be.attention_forward(s.attn_out, s.lse, s.qkv, shape(B, T));
  if (tp_active(tp))
    row_parallel_forward(be, proj, *tp, out, s.attn_out);
  else
    proj.forward(be, out, s.attn_out);
}

void Attention::backward(Backend& be, const Tensor& dx, const Tensor& dout, const Tensor& x,
                         int64_t B, int64_t T, const Saved& s, const Scratch& scratch,
                         const Deferred* defer) const {
  const bool sharded = tp_active(tp);
  const Tensor dproj = sharded ? tp->gather(dout) : dout;
  if (defer) {
    be.cast(defer->dproj, dproj);
    proj.backward_input(be, scratch.dattn, dproj);
  } else {
    proj.backward(be, scratch.dattn, dproj, s.attn_out);
  }
  if (cp_active(cp))
    ring_backward(be, *this, *cp, s, scratch.dattn, scratch.dqkv, B, T);
  else
    be.attention_backward(scratch.dqkv, scratch.dattn, s.qkv, s.attn_out, s.lse, shape(B, T));
  if (rope)
    be.rope(scratch.dqkv_raw, scratch.dqkv, T, heads + kv_heads, head_dim, rope_theta, true,
            cp_active(cp) ? cp->positions : Tensor{});
  const Tensor dqkv = rope ? scratch.dqkv_raw : scratch.dqkv;
  const Tensor din = sharded ? tp->partial_for(dx) : dx;
  if (defer) {
    be.cast(s.qkv, dqkv);  // read by the attention backward above, dead since
    qkv.backward_input(be, din, dqkv);
  } else {
    qkv.backward(be, din, dqkv, sharded ? tp->gather(x) : x);
  }
  if (sharded) tp->reduce(dx);
}

void Attention::backward_weights(Backend& be, const Tensor& x, const Saved& s,
                                 const Deferred& defer) const {
  proj.backward_weights(be, defer.dproj, s.attn_out);
  qkv.backward_weights(be, s.qkv, tp_active(tp) ? tp->gather(x) : x);
}

// ---- MLP ------------------------------------------------------------------------------------

void Mlp::activate(Backend& be, const Saved& s) const {
  if (activation == ActivationKind::gelu)
    be.gelu_forward(s.act_out, s.fc1_out);
  else
    be.swiglu_forward(s.act_out, s.fc1_out);
}

void Mlp::forward(Backend& be, const Tensor& out, const Tensor& x, const Saved& s) const {
  const Tensor whole = tp_active(tp) ? tp->gather(x) : x;
  if (activation == ActivationKind::gelu && fc1.fp8 == Fp8Mode::none) {
    fc1.forward_gelu(be, s.act_out, s.fc1_out, whole);  // one GEMM with the GELU epilogue
  } else {
    fc1.forward(be, s.fc1_out, whole);
    activate(be, s);
  }
  if (tp_active(tp))
    row_parallel_forward(be, fc2, *tp, out, s.act_out);
  else
    fc2.forward(be, out, s.act_out);
}

void Mlp::backward(Backend& be, const Tensor& dx, const Tensor& dout, const Tensor& x,
                   const Saved& s, const Scratch& scratch, const Deferred* defer) const {
  const bool sharded = tp_active(tp);
  const Tensor dfc2 = sharded ? tp->gather(dout) : dout;
  if (defer) {
    be.cast(defer->dfc2, dfc2);
    fc2.backward_input(be, scratch.dact, dfc2);
  } else {
    fc2.backward(be, scratch.dact, dfc2, s.act_out);
  }
  if (activation == ActivationKind::gelu)
    be.gelu_backward(scratch.dfc1, scratch.dact, s.fc1_out);
  else
    be.swiglu_backward(scratch.dfc1, scratch.dact, s.fc1_out);
  const Tensor din = sharded ? tp->partial_for(dx) : dx;
  if (defer) {
    be.cast(s.fc1_out, scratch.dfc1);  // read by the activation's backward above, dead since
    fc1.backward_input(be, din, scratch.dfc1);
  } else {
    fc1.backward(be, din, scratch.dfc1, sharded ? tp->gather(x) : x);
  }
  if (sharded) tp->reduce(dx);
}

void Mlp::backward_weights(Backend& be, const Tensor& x, const Saved& s,
                           const Deferred& defer) const {
  fc2.backward_weights(be, defer.dfc2, s.act_out);
  fc1.backward_weights(be, s.fc1_out, tp_active(tp) ? tp->gather(x) : x);
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

namespace {
// Exchanges an [E*cap, ...] buffer between layouts: chunk r (the rows of rank r's experts, or of
// source r) goes to rank r.
void exchange(comm::Communicator& ep, const Tensor& from, const Tensor& to) {
  ep.all_to_all(from.data, to.data, from.bytes() / static_cast<size_t>(ep.size()));
}
}  // namespace

void Moe::run_experts(Backend& be, const Tensor& out, const Saved& s) const {
  const int64_t cap = s.capacity, local = static_cast<int64_t>(experts.size());
  for (int64_t b = 0; b < static_cast<int64_t>(s.block_counts.size()); ++b) {
    const int64_t count = s.block_counts[static_cast<size_t>(b)];
    if (count == 0) continue;
    experts[static_cast<size_t>(b % local)].forward(be, expert_rows(out, b, cap, count),
                                                    expert_rows(s.expert_in, b, cap, count),
                                                    expert_saved(s.expert, b, cap, count));
  }
  if (!tp_active(tp)) return;
  tp->all_reduce(out);
  for (int64_t b = 0; b < static_cast<int64_t>(s.block_counts.size()); ++b) {
    const int64_t count = s.block_counts[static_cast<size_t>(b)];
    if (count > 0)
      tp->add_bias(be, expert_rows(out, b, cap, count),
                   fc2_bias[static_cast<size_t>(b % local)].value);
  }
}

backend::RouterLosses Moe::forward(Backend& be, const Tensor& out_rows, const Tensor& x_rows,
                                   Saved& s, const Scratch& scratch) const {
  // Sequence parallel: the layer runs on the whole micro-batch (gathered; the router and the
  // exchange are then exactly those of plain tp) and keeps its rows of the output.
  const bool split = tp_active(tp) && tp->split_rows();
  const Tensor x = split ? tp->gather(x_rows) : x_rows;
  const Tensor out = split ? tp->partial_for(out_rows) : out_rows;
  const bool context = cp != nullptr && cp->active();
  const size_t E = static_cast<size_t>(num_experts());
  backend::RouterLosses losses;
  s.counts.resize(E);
  if (!context) {
    router.forward(be, s.route.logits, x);
    losses = be.moe_router_forward(s.route);
    be.copy_to_host(s.counts.data(), s.route.counts);
    s.own_counts = s.counts;
  } else {
    // The micro-batch's logits in its order (scratch.dlogits holds this rank's meanwhile), routed
    // here as on every cp rank; then this rank's assignments, renumbered per expert in order.
    router.forward(be, scratch.dlogits, x);
    cp->comm->all_gather(scratch.dlogits.data, cp->logits.data, scratch.dlogits.bytes());
    be.moe_permute(s.route.logits, cp->logits, cp->to_whole);
    losses = be.moe_router_forward(s.route);
    be.copy_to_host(s.counts.data(), s.route.counts);
    const int64_t k = top_k, n = static_cast<int64_t>(cp->own_host.size());
    cp->slot_host.resize(static_cast<size_t>(s.route.slot.numel()));
    be.copy_to_host(cp->slot_host.data(), s.route.slot);
    cp->own_slot_host.assign(static_cast<size_t>(n * k), -1);
    s.own_counts.assign(E, 0);
    for (int64_t j = 0; j < k; ++j)  // slot j, then token: the order the route filled them in
      for (int64_t i = 0; i < n; ++i) {
        const int32_t routed =
            cp->slot_host[static_cast<size_t>(cp->own_host[static_cast<size_t>(i)] * k + j)];
        if (routed < 0) continue;
        const size_t e = static_cast<size_t>(routed / s.route.capacity);
        cp->own_slot_host[static_cast<size_t>(i * k + j)] =
            static_cast<int32_t>(static_cast<int64_t>(e) * s.capacity + s.own_counts[e]++);
      }
    be.copy_from_host(s.slot, cp->own_slot_host.data());
    be.moe_permute_backward(s.gates, s.route.gates, cp->own);
  }
  if (ep == nullptr) {
    be.moe_permute(s.expert_in, x, s.slot);
    s.block_counts = s.own_counts;
    run_experts(be, s.expert_out, s);
  } else {
    be.moe_permute(scratch.send, x, s.slot);
    exchange(*ep, scratch.send, s.expert_in);
    s.block_counts.resize(E);
    ep->all_to_all(s.own_counts.data(), s.block_counts.data(),
                   E / static_cast<size_t>(ep->size()) * sizeof(int32_t));
    run_experts(be, scratch.recv, s);
    exchange(*ep, scratch.recv, s.expert_out);
  }
  be.moe_unpermute(out, s.expert_out, s.gates, s.slot);
  if (split) be.cast(out_rows, tp->local_rows(out));
  return losses;
}

void Moe::activate(Backend& be, const Saved& s) const {
  const int64_t cap = s.capacity, local = static_cast<int64_t>(experts.size());
  for (int64_t b = 0; b < static_cast<int64_t>(s.block_counts.size()); ++b) {
    const int64_t count = s.block_counts[static_cast<size_t>(b)];
    if (count > 0)
      experts[static_cast<size_t>(b % local)].activate(be, expert_saved(s.expert, b, cap, count));
  }
}

void Moe::backward(Backend& be, const Tensor& dx_rows, const Tensor& dout_rows,
                   const Tensor& x_rows, const Saved& s, const Scratch& scratch,
                   double loss_grad_scale, const Deferred* defer) const {
  // Sequence parallel: as forward, on the whole micro-batch; the input gradient comes out whole
  // (summed over tp inside) and the rank keeps its rows.
  const bool split = tp_active(tp) && tp->split_rows();
  const Tensor dx = split ? tp->partial_for(dx_rows) : dx_rows;
  be.moe_unpermute_backward(scratch.dexpert_out, scratch.dgates,
                            split ? tp->gather(dout_rows) : dout_rows, s.expert_out, s.gates,
                            s.slot);
  // The execution-layout gradients: the source-layout buffers themselves on one ep rank.
  const Tensor exec_dout = ep ? scratch.recv : scratch.dexpert_out;
  const Tensor exec_din = ep ? scratch.send : scratch.dexpert_in;
  if (ep) exchange(*ep, scratch.dexpert_out, exec_dout);
  const int64_t cap = s.capacity, local = static_cast<int64_t>(experts.size());
  for (int64_t b = 0; b < static_cast<int64_t>(s.block_counts.size()); ++b) {
    const int64_t count = s.block_counts[static_cast<size_t>(b)];
    if (count == 0) continue;
    const Mlp::Scratch rows{expert_rows(scratch.expert.dact, b, cap, count),
                            expert_rows(scratch.expert.dfc1, b, cap, count)};
    const Tensor block_dout = expert_rows(exec_dout, b, cap, count);
    const Mlp::Deferred block_defer = defer ? defer->expert_block(b, cap, count) : Mlp::Deferred{};
    experts[static_cast<size_t>(b % local)].backward(
        be, expert_rows(exec_din, b, cap, count), block_dout,
        expert_rows(s.expert_in, b, cap, count), expert_saved(s.expert, b, cap, count), rows,
        defer ? &block_defer : nullptr);
    // Deferred: from the copy of block_dout (the expert's fc2 output gradient).
    if (!defer && tp_active(tp) && !fc2_bias[static_cast<size_t>(b % local)].value.empty())
      be.bias_backward(fc2_bias[static_cast<size_t>(b % local)].grad, block_dout);
  }
  if (tp_active(tp)) tp->all_reduce(exec_din);
  if (ep) exchange(*ep, exec_din, scratch.dexpert_in);
  be.moe_permute_backward(dx, scratch.dexpert_in, s.slot);
  if (cp == nullptr || !cp->active()) {
    be.moe_router_backward(scratch.dlogits, scratch.dgates, s.route, aux_loss_coef, z_loss_coef,
                           loss_grad_scale);
  } else {  // the micro-batch's gate gradients in its order, and this rank's rows of the result
    cp->comm->all_gather(scratch.dgates.data, cp->dgates.data, scratch.dgates.bytes());
    be.moe_permute(cp->dgates_whole, cp->dgates, cp->to_whole);
    be.moe_router_backward(cp->dlogits_whole, cp->dgates_whole, s.route, aux_loss_coef, z_loss_coef,
                           loss_grad_scale);
    be.moe_permute_backward(scratch.dlogits, cp->dlogits_whole, cp->own);
  }
  if (defer) {
    // The logits were read by the router's backward above, dead since.
    be.cast(s.route.logits.rows(0, scratch.dlogits.shape[0]), scratch.dlogits);
    router.backward_input(be, scratch.dx_router, scratch.dlogits);
  } else {
    router.backward(be, scratch.dx_router, scratch.dlogits, split ? tp->gather(x_rows) : x_rows);
  }
  be.accumulate(dx, scratch.dx_router);
  if (split) be.cast(dx_rows, tp->local_rows(dx));
}

Mlp::Deferred Moe::Deferred::expert_block(int64_t block, int64_t cap, int64_t count) const {
  return {expert_rows(dfc2, block, cap, count)};
}

void Moe::backward_weights(Backend& be, const Tensor& x_rows, const Saved& s,
                           const Deferred& defer) const {
  const int64_t cap = s.capacity, local = static_cast<int64_t>(experts.size());
  for (int64_t b = 0; b < static_cast<int64_t>(s.block_counts.size()); ++b) {
    const int64_t count = s.block_counts[static_cast<size_t>(b)];
    if (count == 0) continue;
    const Mlp::Deferred block = defer.expert_block(b, cap, count);
    experts[static_cast<size_t>(b % local)].backward_weights(
        be, expert_rows(s.expert_in, b, cap, count), expert_saved(s.expert, b, cap, count), block);
    if (tp_active(tp) && !fc2_bias[static_cast<size_t>(b % local)].value.empty())
      be.bias_backward(fc2_bias[static_cast<size_t>(b % local)].grad, block.dfc2);
  }
  const bool split = tp_active(tp) && tp->split_rows();
  const Tensor x = split ? tp->gather(x_rows) : x_rows;
  router.backward_weights(be, s.route.logits.rows(0, x.shape[0]), x);
}

}  // namespace trainctl::model
