// Float64 finite-difference checks of every layer type of lib/model (embedding, LayerNorm,
// RMSNorm, attention with and without GQA and RoPE, GELU and SwiGLU MLPs, MoE with router and
// capacity dropping, LM head + cross-entropy). Each layer's forward output is projected on a fixed
// random tensor R, L = sum(out * R) (+ the MoE auxiliary losses), so backward(dout = R) must give
// dL/d(parameter) and dL/d(input). Max relative error (over a tensor, relative to its largest
// analytic entry) must stay below 1e-6.
#include <catch2/catch.hpp>

#include "backend_test_util.hpp"
#include "model/layers.hpp"

namespace {

using namespace trainctl;
using backend_test::cpu;
using backend_test::fd_error;
using backend_test::random_values;
using backend_test::read;
using backend_test::Values;
using backend_test::write;
using model::Init;
using model::Param;
using model::ParamStore;
using model::ParamTable;
using tensor::DType;
using tensor::OwnedTensor;
using tensor::Tensor;

constexpr double kTolerance = 1e-6;

// A store of f64 parameters with random values (norm weights around 1).
struct Params {
  std::unique_ptr<ParamStore> store;
  explicit Params(ParamTable table) {
    store = std::make_unique<ParamStore>(cpu(), std::move(table), DType::f64);
    uint64_t stream = 100;
    for (const auto& spec : store->table().specs()) {
      Values v = random_values(static_cast<size_t>(spec.shape.numel()), ++stream, 0.5);
      if (spec.init == Init::ones)
        for (double& x : v)
          x = 1.0 + 0.2 * x;
      write(store->param(spec.name).value, v);
    }
  }
  Param operator[](const std::string& name) const { return store->param(name); }
  Param optional(const std::string& name) const {
    return store->table().contains(name) ? store->param(name) : Param{};
  }
};

OwnedTensor random_tensor(tensor::Shape shape, uint64_t stream, double scale = 1.0) {
  return backend_test::make(DType::f64, shape,
                            random_values(static_cast<size_t>(shape.numel()), stream, scale));
}

// Checks every parameter of `params` and every listed (input, input-gradient) pair.
// `loss` runs forward and returns L; `backward` zeroes nothing itself: gradients are zeroed here.
void check_layer(const Params& params, const std::function<double()>& loss,
                 const std::function<void()>& backward,
                 const std::vector<std::pair<Tensor, Tensor>>& inputs) {
  params.store->zero_grads();
  loss();
  backward();
  for (const auto& spec : params.store->table().specs()) {
    const Param p = params[spec.name];
    const double err = fd_error(p.value, read(p.grad), loss);
    INFO("parameter " << spec.name);
    CHECK(err < kTolerance);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Values analytic = read(inputs[i].second);
    const double err = fd_error(inputs[i].first, analytic, loss);
    INFO("input " << i);
    CHECK(err < kTolerance);
  }
}

double project(const Tensor& out, const Tensor& r) {
  return backend_test::dot(read(out), read(r));
}

}  // namespace

TEST_CASE("embedding: token and position embedding gradients", "[model][gradcheck]") {
  const int64_t V = 11, C = 6, B = 2, T = 5, N = B * T;
  ParamTable table;
  table.add("wte", {V, C}, Init::normal, 0.02, true);
  table.add("wpe", {T, C}, Init::normal, 0.02, true);
  Params params(std::move(table));
  const OwnedTensor tokens = backend_test::make_i32({N}, {1, 3, 3, 0, 10, 7, 3, 2, 2, 9});
  OwnedTensor out(DType::f64, {N, C});
  const OwnedTensor r = random_tensor({N, C}, 7);
  auto loss = [&] {
    cpu().embedding_forward(out, tokens, params["wte"].value, params["wpe"].value, T);
    return project(out, r);
  };
  auto backward = [&] {
    cpu().embedding_backward(params["wte"].grad, params["wpe"].grad, r, tokens, T);
  };
  check_layer(params, loss, backward, {});
}

TEST_CASE("norm: LayerNorm and RMSNorm layers", "[model][gradcheck]") {
  const int64_t N = 7, C = 9;
  for (const auto kind : {model::NormKind::layernorm, model::NormKind::rmsnorm}) {
    DYNAMIC_SECTION((kind == model::NormKind::layernorm ? "layernorm" : "rmsnorm")) {
      ParamTable table;
      table.add("w", {C}, Init::ones, 0, false);
      if (kind == model::NormKind::layernorm) table.add("b", {C}, Init::zeros, 0, false);
      Params params(std::move(table));
      const model::Norm norm{kind, params["w"], params.optional("b"), 1e-5};
      const OwnedTensor x = random_tensor({N, C}, 3, 2.0), r = random_tensor({N, C}, 4);
      OwnedTensor out(DType::f64, {N, C}), dx(DType::f64, {N, C}), mean(DType::f64, {N}),
          rstd(DType::f64, {N});
      const model::Norm::Saved saved{mean, rstd};
      auto loss = [&] {
        norm.forward(cpu(), out, saved, x);
        return project(out, r);
      };
      auto backward = [&] { norm.backward(cpu(), dx, r, x, saved); };
      check_layer(params, loss, backward, {{x, dx}});
    }
  }
}

TEST_CASE("attention: MHA, GQA, MQA, with and without RoPE and biases", "[model][gradcheck]") {
  struct Variant {
    const char* name;
    int64_t heads, kv_heads;
    bool rope, bias;
  };
  const Variant variants[] = {{"mha learned-positions bias", 4, 4, false, true},
                              {"gqa rope", 4, 2, true, false},
                              {"mqa rope bias", 4, 1, true, true}};
  for (const Variant& v : variants) {
    DYNAMIC_SECTION(v.name) {
      const int64_t B = 2, T = 5, D = 4, C = v.heads * D, N = B * T;
      const int64_t W = (v.heads + 2 * v.kv_heads) * D;
      ParamTable table;
      table.add("qkv.weight", {W, C}, Init::normal, 0, true);
      if (v.bias) table.add("qkv.bias", {W}, Init::zeros, 0, false);
      table.add("proj.weight", {C, C}, Init::normal, 0, true);
      if (v.bias) table.add("proj.bias", {C}, Init::zeros, 0, false);
      Params params(std::move(table));
      const model::Attention attn{{params["qkv.weight"], params.optional("qkv.bias")},
                                  {params["proj.weight"], params.optional("proj.bias")},
                                  v.heads,
                                  v.kv_heads,
                                  D,
                                  v.rope,
                                  10000.0};
      const OwnedTensor x = random_tensor({N, C}, 5), r = random_tensor({N, C}, 6);
      OwnedTensor out(DType::f64, {N, C}), dx(DType::f64, {N, C}), qkv(DType::f64, {N, W}),
          attn_out(DType::f64, {N, C}), lse(DType::f64, {B, v.heads, T}),
          qkv_raw(DType::f64, {N, W}), dattn(DType::f64, {N, C}), dqkv(DType::f64, {N, W}),
          dqkv_raw(DType::f64, {N, W});
      const model::Attention::Saved saved{qkv, attn_out, lse};
      const model::Attention::Scratch scratch{qkv_raw, dattn, dqkv, dqkv_raw};
      auto loss = [&] {
        attn.forward(cpu(), out, x, B, T, saved, scratch);
        return project(out, r);
      };
      auto backward = [&] { attn.backward(cpu(), dx, r, x, B, T, saved, scratch); };
      check_layer(params, loss, backward, {{x, dx}});
    }
  }
}

TEST_CASE("mlp: GELU with biases and SwiGLU without", "[model][gradcheck]") {
  for (const auto act : {model::ActivationKind::gelu, model::ActivationKind::swiglu}) {
    DYNAMIC_SECTION((act == model::ActivationKind::gelu ? "gelu" : "swiglu")) {
      const bool bias = act == model::ActivationKind::gelu;
      const int64_t N = 6, C = 5, F = 8, F1 = act == model::ActivationKind::swiglu ? 2 * F : F;
      ParamTable table;
      table.add("fc1.weight", {F1, C}, Init::normal, 0, true);
      if (bias) table.add("fc1.bias", {F1}, Init::zeros, 0, false);
      table.add("fc2.weight", {C, F}, Init::normal, 0, true);
      if (bias) table.add("fc2.bias", {C}, Init::zeros, 0, false);
      Params params(std::move(table));
      const model::Mlp mlp{{params["fc1.weight"], params.optional("fc1.bias")},
                           {params["fc2.weight"], params.optional("fc2.bias")},
                           act};
      const OwnedTensor x = random_tensor({N, C}, 8), r = random_tensor({N, C}, 9);
      OwnedTensor out(DType::f64, {N, C}), dx(DType::f64, {N, C}), fc1(DType::f64, {N, F1}),
          a(DType::f64, {N, F}), dact(DType::f64, {N, F}), dfc1(DType::f64, {N, F1});
      const model::Mlp::Saved saved{fc1, a};
      const model::Mlp::Scratch scratch{dact, dfc1};
      auto loss = [&] {
        mlp.forward(cpu(), out, x, saved);
        return project(out, r);
      };
      auto backward = [&] { mlp.backward(cpu(), dx, r, x, saved, scratch); };
      check_layer(params, loss, backward, {{x, dx}});
    }
  }
}

TEST_CASE("moe: router, top-2, capacity dropping, aux and z losses", "[model][gradcheck]") {
  const int64_t N = 12, C = 5, F = 6, E = 4, k = 2;
  for (const auto act : {model::ActivationKind::gelu, model::ActivationKind::swiglu}) {
    DYNAMIC_SECTION((act == model::ActivationKind::gelu ? "gelu experts" : "swiglu experts")) {
      const int64_t F1 = act == model::ActivationKind::swiglu ? 2 * F : F;
      ParamTable table;
      table.add("router", {E, C}, Init::normal, 0, true);
      table.add("fc1.weight", {E, F1, C}, Init::normal, 0, true);
      table.add("fc1.bias", {E, F1}, Init::zeros, 0, false);
      table.add("fc2.weight", {E, C, F}, Init::normal, 0, true);
      table.add("fc2.bias", {E, C}, Init::zeros, 0, false);
      Params params(std::move(table));
      auto slice = [](const Param& p, int64_t e, tensor::Shape s) {
        return Param{p.value.rows(e, 1).reshaped(s), p.grad.rows(e, 1).reshaped(s)};
      };
      model::Moe moe;
      moe.router = {params["router"], Param{}};
      for (int64_t e = 0; e < E; ++e)
        moe.experts.push_back(model::Mlp{
            {slice(params["fc1.weight"], e, {F1, C}), slice(params["fc1.bias"], e, {F1})},
            {slice(params["fc2.weight"], e, {C, F}), slice(params["fc2.bias"], e, {C})},
            act});
      moe.top_k = k;
      moe.capacity_factor = 0.75;  // 12 tokens * 2 / 4 experts * 0.75 = 4.5 -> 5 slots: drops
      moe.aux_loss_coef = 0.3;
      moe.z_loss_coef = 0.2;
      const int64_t cap = moe.capacity(N);
      REQUIRE(cap == 5);
      const OwnedTensor x = random_tensor({N, C}, 10), r = random_tensor({N, C}, 11);
      OwnedTensor out(DType::f64, {N, C}), dx(DType::f64, {N, C}), logits(DType::f64, {N, E}),
          probs(DType::f64, {N, E}), idx(DType::i32, {N, k}), gates(DType::f64, {N, k}),
          slot(DType::i32, {N, k}), counts(DType::i32, {E}), load(DType::f64, {E}),
          ein(DType::f64, {E * cap, C}), eout(DType::f64, {E * cap, C}),
          efc1(DType::f64, {E * cap, F1}), eact(DType::f64, {E * cap, F}),
          dein(DType::f64, {E * cap, C}), deout(DType::f64, {E * cap, C}),
          dgates(DType::f64, {N, k}), dlogits(DType::f64, {N, E}), dxr(DType::f64, {N, C}),
          deact(DType::f64, {E * cap, F}), defc1(DType::f64, {E * cap, F1});
      model::Moe::Saved saved;
      saved.route = {logits, probs, idx, gates, slot, counts, load, k, cap};
      saved.slot = slot;  // one rank routes its own tokens: the route's slots, gates, capacity
      saved.gates = gates;
      saved.capacity = cap;
      saved.expert_in = ein;
      saved.expert_out = eout;
      saved.expert = {efc1, eact};
      const model::Moe::Scratch scratch{dein, deout, dgates, dlogits, dxr, {deact, defc1}, {}, {}};
      auto loss = [&] {
        const auto l = moe.forward(cpu(), out, x, saved, scratch);
        return project(out, r) + moe.aux_loss_coef * l.aux_loss + moe.z_loss_coef * l.z_loss;
      };
      loss();
      int64_t kept = 0;
      for (int32_t c : saved.counts)
        kept += c;
      CHECK(kept < N * k);  // some assignments were dropped: the check covers dropping
      auto backward = [&] { moe.backward(cpu(), dx, r, x, saved, scratch, 1.0); };
      check_layer(params, loss, backward, {{x, dx}});
    }
  }
}

TEST_CASE("lm head: logits and mean cross-entropy", "[model][gradcheck]") {
  const int64_t N = 6, C = 5, V = 9;
  ParamTable table;
  table.add("head", {V, C}, Init::normal, 0, true);
  Params params(std::move(table));
  const model::Linear head{params["head"], Param{}};
  const OwnedTensor x = random_tensor({N, C}, 12);
  const OwnedTensor targets = backend_test::make_i32({N}, {0, 8, 3, 3, -1, 5});  // -1: ignored
  OwnedTensor logits(DType::f64, {N, V}), lse(DType::f64, {N}), losses(DType::f64, {N}),
      dlogits(DType::f64, {N, V}), dx(DType::f64, {N, C});
  const double valid = 5;
  auto loss = [&] {
    head.forward(cpu(), logits, x);
    cpu().cross_entropy_forward(losses, lse, logits, targets);
    return cpu().sum(losses) / valid;
  };
  auto backward = [&] {
    cpu().cross_entropy_backward(dlogits, logits, lse, targets, 1.0 / valid);
    head.backward(cpu(), dx, dlogits, x);
  };
  check_layer(params, loss, backward, {{x, dx}});
}
