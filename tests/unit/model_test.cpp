// Whole-model checks of lib/model: float64 finite differences of the full objective (cross-entropy
// + MoE auxiliary losses) for small gpt, llama and MoE models; recompute modes giving
// bit-identical gradients; initialisation that depends only on (seed, name, index); the forward's
// params-needed hook.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "backend_test_util.hpp"
#include "model/model.hpp"

namespace {

using namespace trainctl;
using backend_test::cpu;
using tensor::DType;

// One rank whose layout asks for `mode` (recomputation is part of the layout).
model::ModelParallel recomputing(trainctl::Recompute mode) {
  model::ModelParallel one_rank;
  one_rank.layout.recompute = mode;
  return one_rank;
}

model::ModelConfig small(model::ModelConfig c) {
  c.layers = 2;
  c.hidden = 16;
  c.heads = 4;
  c.ffn_hidden = 24;
  c.vocab = 13;
  c.seq_len = 6;
  c.init_std = 0.3;  // large enough that every nonlinearity is exercised
  c.kv_heads = c.heads;
  return c;
}

model::ModelConfig gpt() {
  return small(model::gpt_preset());
}
model::ModelConfig llama() {
  model::ModelConfig c = small(model::llama_preset());
  c.kv_heads = 2;  // grouped-query attention
  return c;
}
model::ModelConfig moe(model::ModelConfig c) {
  c.moe.experts = 4;
  c.moe.top_k = 2;
  c.moe.every = 2;
  c.moe.capacity_factor = 0.75;  // forces dropping
  c.moe.aux_loss_coef = 0.1;
  c.moe.z_loss_coef = 0.05;
  c.moe.expert_ffn_hidden = 12;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};
Batch random_batch(const model::ModelConfig& c, int64_t B, uint64_t stream) {
  tensor::CounterRng rng(77, stream);
  Batch b;
  for (int64_t i = 0; i < B * c.seq_len; ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng.bits(2 * i) % static_cast<uint32_t>(c.vocab)));
    b.targets.push_back(static_cast<int32_t>(rng.bits(2 * i + 1) % static_cast<uint32_t>(c.vocab)));
  }
  return b;
}

// Finite differences on a sample of elements of every parameter tensor (all of them for small
// tensors): max over tensors of max|numeric - analytic| / max|analytic|.
void check_model_gradients(const model::ModelConfig& config) {
  model::Transformer m(config, cpu(), 2);
  m.params().initialize(5);
  const Batch batch = random_batch(config, 2, 1);
  m.params().zero_grads();
  const model::ForwardResult first = m.forward(batch.tokens.data(), batch.targets.data());
  m.backward(1.0);
  if (config.moe.experts > 0) {
    int64_t dropped = 0;
    for (int64_t d : first.dropped_tokens)
      dropped += d;
    CHECK(dropped > 0);  // the check covers capacity dropping
  }
  auto objective = [&] { return m.forward(batch.tokens.data(), batch.targets.data()).objective; };
  const double eps = 1e-6;
  for (const auto& spec : m.params().table().specs()) {
    const model::Param p = m.params().param(spec.name);
    const int64_t n = spec.shape.numel();
    const int64_t stride = std::max<int64_t>(1, n / 24);  // <= ~24 samples per tensor
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; ++i)
      scale = std::max(scale, std::abs(tensor::get_element(p.grad, i)));
    for (int64_t i = (spec.name.size() * 7) % stride; i < n; i += stride) {
      double* x = p.value.as<double>() + i;
      const double x0 = *x;
      *x = x0 + eps;
      const double plus = objective();
      *x = x0 - eps;
      const double minus = objective();
      *x = x0;
      diff = std::max(diff, std::abs((plus - minus) / (2 * eps) - tensor::get_element(p.grad, i)));
    }
    INFO("parameter " << spec.name << " max|grad| " << scale);
    CHECK(diff / std::max(scale, 1e-30) < 1e-6);
  }
}

std::vector<unsigned char> grad_bytes(model::Transformer& m) {
  const tensor::Tensor g = m.params().grads();
  std::vector<unsigned char> out(g.bytes());
  std::memcpy(out.data(), g.data, g.bytes());
  return out;
}

}  // namespace

TEST_CASE("gpt model: float64 gradient check of the whole model", "[model][gradcheck]") {
  model::ModelConfig c = gpt();
  c.storage = DType::f64;
  check_model_gradients(c);
}

TEST_CASE("llama model (RMSNorm, SwiGLU, RoPE, GQA, untied): float64 gradient check",
          "[model][gradcheck]") {
  model::ModelConfig c = llama();
  c.storage = DType::f64;
  check_model_gradients(c);
}

TEST_CASE("MoE gpt and llama models with dropping: float64 gradient check", "[model][gradcheck]") {
  for (model::ModelConfig c : {moe(gpt()), moe(llama())}) {
    c.storage = DType::f64;
    check_model_gradients(c);
  }
}

TEST_CASE("recompute none / selective / full give bit-identical gradients", "[model][recompute]") {
  for (const DType storage : {DType::f32, DType::bf16, DType::f16}) {
    for (model::ModelConfig base : {gpt(), llama(), moe(gpt()), moe(llama())}) {
      base.storage = storage;
      base.init_std = 0.05;
      std::vector<unsigned char> reference;
      double reference_loss = 0;
      for (const auto mode :
           {trainctl::Recompute::none, trainctl::Recompute::selective, trainctl::Recompute::full}) {
        const model::ModelConfig& c = base;
        model::Transformer m(c, cpu(), 3, recomputing(mode));
        m.params().initialize(9);
        m.params().zero_grads();
        const Batch batch = random_batch(c, 3, 2);
        double loss = 0;
        for (int micro = 0; micro < 2; ++micro) {  // accumulation over two micro-batches
          loss += m.forward(batch.tokens.data(), batch.targets.data()).loss;
          m.backward(0.5);
        }
        const auto bytes = grad_bytes(m);
        if (mode == trainctl::Recompute::none) {
          reference = bytes;
          reference_loss = loss;
        } else {
          INFO("storage " << tensor::dtype_name(storage) << ", " << model::describe(c)
                          << ", recompute " << static_cast<int>(mode));
          CHECK(loss == reference_loss);
          CHECK(bytes == reference);
        }
      }
    }
  }
}

// The ZB-H1 schedule's split backward: B (input gradients; the GEMMs' output gradients kept) then
// W (the GEMMs' weight gradients) for two micro-batches in flight in two slots, W in the order of
// the micro-batches, gives backward()'s bits, fp8 GEMMs included (their per-tensor scales come
// from the same operands). The W pass only reads what B kept: the slot's activations and copies.
// Untied: a tied head is the embedding's own tensor only when one stage holds both, which a
// zb-h1 pipeline (pp >= 2) never does; here its two gradients would be added in another order.
TEST_CASE("a split backward (input, then weight gradients) gives backward's bits",
          "[model][zero-bubble]") {
  using model::Fp8Mode;
  for (const Fp8Mode fp8 : {Fp8Mode::none, Fp8Mode::hybrid}) {
    for (model::ModelConfig c : {gpt(), llama(), moe(gpt()), moe(llama())}) {
      c.storage = fp8 == Fp8Mode::none ? DType::f32 : DType::bf16;
      c.init_std = 0.05;
      c.fp8 = fp8;
      c.tied_embeddings = false;
      INFO(model::describe(c));
      const Batch first = random_batch(c, 3, 2), second = random_batch(c, 3, 5);
      model::ModelParallel two_slots;
      two_slots.activation_slots = 2;
      model::Transformer whole(c, cpu(), 3, two_slots);
      two_slots.split_backward = true;
      model::Transformer split(c, cpu(), 3, two_slots);
      CHECK(split.activation_bytes().kept > whole.activation_bytes().kept);
      for (model::Transformer* m : {&whole, &split}) {
        m->params().initialize(9);
        m->params().zero_grads();
        m->forward(first.tokens.data(), first.targets.data(), 0);
        m->forward(second.tokens.data(), second.targets.data(), 1);
      }
      whole.backward(0.5, 0);
      whole.backward(0.5, 1);
      split.backward_input(0.5, 0);
      CHECK_THROWS_WITH(split.forward(first.tokens.data(), first.targets.data(), 0),
                        Catch::Contains("still waits for backward_weights"));
      split.backward_input(0.5, 1);  // B of the next micro-batch before the first one's W
      split.backward_weights(0);
      split.backward_weights(1);
      CHECK_THROWS_WITH(split.backward_weights(1), Catch::Contains("no input-gradient pass"));
      CHECK(grad_bytes(split) == grad_bytes(whole));
    }
  }
}

TEST_CASE("recompute modes keep fewer activations", "[model][recompute]") {
  size_t previous = SIZE_MAX;
  for (const auto mode :
       {trainctl::Recompute::none, trainctl::Recompute::selective, trainctl::Recompute::full}) {
    model::ModelConfig c = gpt();
    c.layers = 4;
    model::Transformer m(c, cpu(), 2, recomputing(mode));
    const size_t kept = m.activation_bytes().kept;
    CHECK(kept < previous);
    previous = kept;
  }
}

TEST_CASE("initial weights depend only on seed, name and index", "[model][init]") {
  model::ModelConfig c = gpt();
  model::Transformer a(c, cpu(), 1), b(c, cpu(), 2);
  a.params().initialize(42);
  b.params().initialize(42);
  const auto& wa = a.params().values();
  const auto& wb = b.params().values();
  CHECK(std::memcmp(wa.data, wb.data, wa.bytes()) == 0);
  // One layer more: the shared tensors keep their values (no dependence on table position).
  model::ModelConfig deeper = c;
  deeper.layers = 3;
  model::Transformer d(deeper, cpu(), 1);
  d.params().initialize(42);
  for (const char* name : {"embed.wte", "layers.1.attn.qkv.weight", "final_norm.weight"}) {
    const auto pa = a.params().param(name).value, pd = d.params().param(name).value;
    INFO(name);
    CHECK(std::memcmp(pa.data, pd.data, pa.bytes()) == 0);
  }
  // bf16 storage is the rounding of the same f32 master values.
  model::ModelConfig half = c;
  half.storage = DType::bf16;
  model::Transformer h(half, cpu(), 1);
  h.params().initialize(42);
  const auto master = h.params().master();
  const auto values = h.params().values();
  const auto f32 = a.params().values();
  for (int64_t i = 0; i < f32.numel(); i += 97) {
    CHECK(tensor::get_element(master, i) == tensor::get_element(f32, i));
    CHECK(tensor::get_element(values, i) ==
          tensor::to_float(tensor::to_bf16(static_cast<float>(tensor::get_element(f32, i)))));
  }
}

// The params-needed hook (ZeRO-1's parameter gather waits in it): every parameter a forward reads
// must be announced before the read. The values start as NaN and the hook restores exactly the
// announced ranges, so a read before its announcement turns the loss (or the stage output) into
// NaN; the result must equal a plain forward's bit for bit, and every element must be announced
// exactly once per forward. Whole models and both stages of pp2 (the last one holds the tied copy).
TEST_CASE("forward announces every parameter once, before reading it", "[model][hook]") {
  for (const model::ModelConfig& c : {gpt(), llama(), moe(gpt()), moe(llama())}) {
    for (const auto& [pp_rank, pp_size] : {std::pair{0, 1}, std::pair{0, 2}, std::pair{1, 2}}) {
      INFO(model::describe(c) << ", stage " << pp_rank << " of " << pp_size);
      model::ModelParallel parallel;
      parallel.layout.pp = pp_size;
      parallel.at.pp = pp_rank;
      const Batch batch = random_batch(c, 2, 5);
      // One stage's result: the loss on the last stage, the stage output's bytes elsewhere.
      auto run = [&](model::Transformer& m) {
        if (!parallel.first_stage()) {
          const tensor::Tensor in = m.stage_input(0);
          REQUIRE(in.dtype == DType::f32);
          std::vector<float> x(static_cast<size_t>(in.numel()));
          for (size_t i = 0; i < x.size(); ++i)
            x[i] = 0.1f * static_cast<float>(static_cast<int>(i % 17) - 8);
          cpu().copy_from_host(in, x.data());
        }
        const double loss = m.forward(batch.tokens.data(), batch.targets.data()).loss;
        if (parallel.last_stage())
          return std::vector<unsigned char>(
              reinterpret_cast<const unsigned char*>(&loss),
              reinterpret_cast<const unsigned char*>(&loss) + sizeof loss);
        const tensor::Tensor out = m.stage_output(0);
        const auto* bytes = static_cast<const unsigned char*>(out.data);
        return std::vector<unsigned char>(bytes, bytes + out.bytes());
      };
      model::Transformer plain(c, cpu(), 2, parallel);
      plain.params().initialize(9);
      const std::vector<unsigned char> expected = run(plain);

      model::Transformer hooked(c, cpu(), 2, parallel);
      hooked.params().initialize(9);
      const tensor::Tensor values = hooked.params().values();
      const size_t item = tensor::dtype_size(values.dtype);
      std::vector<unsigned char> saved(values.bytes());
      std::memcpy(saved.data(), values.data, values.bytes());
      std::memset(values.data, 0xFF, values.bytes());  // NaN in every float format
      std::vector<int> announced(static_cast<size_t>(values.numel()), 0);
      hooked.set_params_needed_hook([&](const std::vector<model::IndexRange>& ranges) {
        for (const model::IndexRange& r : ranges) {
          for (int64_t i = r.begin; i < r.end; ++i)
            ++announced[static_cast<size_t>(i)];
          std::memcpy(static_cast<unsigned char*>(values.data) + r.begin * item,
                      saved.data() + r.begin * item, static_cast<size_t>(r.size()) * item);
        }
      });
      CHECK(run(hooked) == expected);
      CHECK(std::all_of(announced.begin(), announced.end(), [](int n) { return n == 1; }));
      run(hooked);  // announced again by the next forward
      CHECK(std::all_of(announced.begin(), announced.end(), [](int n) { return n == 2; }));
      hooked.set_params_needed_hook({});
      run(hooked);
      CHECK(std::all_of(announced.begin(), announced.end(), [](int n) { return n == 2; }));
    }
  }
}
