#include "model/params.hpp"

#include <cmath>
#include <stdexcept>

#include "tensor/rng.hpp"

namespace trainctl::model {

const ParamSpec& ParamTable::add(std::string name, Shape shape, Init init, double std, bool decay) {
  if (index_.count(name)) throw std::logic_error("ParamTable: duplicate parameter " + name);
  ParamSpec spec{std::move(name), shape, init, std, decay, numel_};
  numel_ += shape.numel();
  index_[spec.name] = specs_.size();
  specs_.push_back(std::move(spec));
  return specs_.back();
}

const ParamSpec& ParamTable::find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw std::out_of_range("no parameter named '" + name + "'");
  return specs_[it->second];
}

ParamTable build_param_table(const ModelConfig& c) {
  ParamTable t;
  const int64_t C = c.hidden, V = c.vocab, D = c.head_dim();
  const double std = c.init_std;
  // GPT-2: residual projections scaled by 1/sqrt(2 * layers) so the residual stream's variance
  // does not grow with depth.
  const double residual_std = std / std::sqrt(2.0 * c.layers);
  const bool norm_bias = c.bias && c.norm == NormKind::layernorm;

  auto add_norm = [&](const std::string& prefix) {
    t.add(prefix + ".weight", {C}, Init::ones, 0, false);
    if (norm_bias) t.add(prefix + ".bias", {C}, Init::zeros, 0, false);
  };
  auto add_linear = [&](const std::string& prefix, Shape weight, Shape bias, double init_std) {
    t.add(prefix + ".weight", weight, Init::normal, init_std, true);
    if (c.bias) t.add(prefix + ".bias", bias, Init::zeros, 0, false);
  };

  t.add("embed.wte", {V, C}, Init::normal, std, true);
  if (c.position == PositionKind::learned)
    t.add("embed.wpe", {c.seq_len, C}, Init::normal, std, true);
  for (int i = 0; i < c.layers; ++i) {
    const std::string l = "layers." + std::to_string(i);
    const int64_t qkv = (int64_t{c.heads} + 2 * c.kv_heads) * D;
    add_norm(l + ".attn_norm");
    add_linear(l + ".attn.qkv", {qkv, C}, {qkv}, std);
    add_linear(l + ".attn.proj", {C, c.heads * D}, {C}, residual_std);
    add_norm(l + ".mlp_norm");
    if (c.is_moe_layer(i)) {
      const int64_t E = c.moe.experts, F = c.expert_ffn(), F1 = c.fc1_rows(c.expert_ffn());
      t.add(l + ".moe.router.weight", {E, C}, Init::normal, std, true);
      add_linear(l + ".moe.fc1", {E, F1, C}, {E, F1}, std);
      add_linear(l + ".moe.fc2", {E, C, F}, {E, C}, residual_std);
    } else {
      const int64_t F = c.ffn_hidden, F1 = c.fc1_rows(c.ffn_hidden);
      add_linear(l + ".mlp.fc1", {F1, C}, {F1}, std);
      add_linear(l + ".mlp.fc2", {C, F}, {C}, residual_std);
    }
  }
  add_norm("final_norm");
  if (!c.tied_embeddings) t.add("lm_head.weight", {V, C}, Init::normal, std, true);
  return t;
}

namespace {
DType moment_dtype(DType storage) {
  return storage == DType::f64 ? DType::f64 : DType::f32;
}
bool needs_master(DType storage) {
  return storage == DType::bf16 || storage == DType::f16;
}
}  // namespace

ParamStore::ParamStore(Backend& be, ParamTable table, DType storage)
    : backend_(be), table_(std::move(table)), storage_(storage) {
  if (!be.capabilities().supports(storage))
    throw std::invalid_argument("backend '" + std::string(be.name()) +
                                "' cannot store parameters in " +
                                std::string(tensor::dtype_name(storage)));
  const size_t n = static_cast<size_t>(table_.numel());
  values_ = be.allocate(n * tensor::dtype_size(storage));
  grads_ = be.allocate(n * tensor::dtype_size(backend::grad_dtype(storage)));
  if (needs_master(storage)) master_ = be.allocate(n * sizeof(float));
  m_ = be.allocate(n * tensor::dtype_size(moment_dtype(storage)));
  v_ = be.allocate(n * tensor::dtype_size(moment_dtype(storage)));
}

Tensor ParamStore::values() const {
  return values_.view(storage_, {table_.numel()});
}
Tensor ParamStore::grads() const {
  return grads_.view(backend::grad_dtype(storage_), {table_.numel()});
}
Tensor ParamStore::master() const {
  return master_.data() ? master_.view(DType::f32, {table_.numel()}) : Tensor{};
}
Tensor ParamStore::moment1() const {
  return m_.view(moment_dtype(storage_), {table_.numel()});
}
Tensor ParamStore::moment2() const {
  return v_.view(moment_dtype(storage_), {table_.numel()});
}

Tensor ParamStore::slice(const Tensor& whole, const ParamSpec& spec) {
  if (whole.empty()) return {};
  Tensor t = whole;
  t.data = static_cast<char*>(whole.data) +
           static_cast<size_t>(spec.offset) * tensor::dtype_size(whole.dtype);
  t.shape = spec.shape;
  return t;
}

Param ParamStore::param(const std::string& name) const {
  const ParamSpec& spec = table_.find(name);
  return Param{slice(values(), spec), slice(grads(), spec)};
}

void ParamStore::initialize(uint64_t seed) {
  // Generate in f64 on the host, then store through one cast per parameter.
  for (const ParamSpec& spec : table_.specs()) {
    const int64_t n = spec.shape.numel();
    std::vector<double> host(static_cast<size_t>(n));
    const tensor::CounterRng rng(seed, tensor::stream_key(spec.name));
    for (int64_t i = 0; i < n; ++i) {
      double v = spec.init == Init::ones ? 1.0 : 0.0;
      if (spec.init == Init::normal) v = rng.normal(static_cast<uint64_t>(i)) * spec.std;
      host[static_cast<size_t>(i)] = v;
    }
    // copy_from_host takes the destination dtype's bytes: convert on the host first.
    const Tensor value = slice(values(), spec);
    if (storage_ == DType::f64) {
      backend_.copy_from_host(value, host.data());
    } else {
      std::vector<float> f32(host.begin(), host.end());
      const Tensor master_slice = slice(master(), spec);
      if (!master_slice.empty()) backend_.copy_from_host(master_slice, f32.data());
      // Storage copy = rounding of the f32 value.
      std::vector<uint16_t> narrow;
      if (storage_ == DType::f32) {
        backend_.copy_from_host(value, f32.data());
      } else {
        narrow.resize(f32.size());
        for (size_t i = 0; i < f32.size(); ++i)
          narrow[i] =
              storage_ == DType::bf16 ? tensor::to_bf16(f32[i]).bits : tensor::to_f16(f32[i]).bits;
        backend_.copy_from_host(value, narrow.data());
      }
    }
  }
  zero_grads();
  backend_.fill(moment1(), 0.0);
  backend_.fill(moment2(), 0.0);
}

void ParamStore::zero_grads() {
  backend_.fill(grads(), 0.0);
}

ParamStore::Bytes ParamStore::bytes() const {
  Bytes b;
  b.params = values_.bytes();
  b.grads = grads_.bytes();
  b.optimizer = master_.bytes() + m_.bytes() + v_.bytes();
  return b;
}

}  // namespace trainctl::model
