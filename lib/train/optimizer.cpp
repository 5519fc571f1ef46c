#include "train/optimizer.hpp"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "model/zero_partition.hpp"

namespace trainctl::train {

using backend::Backend;
using Range = Backend::AdamWRange;
using tensor::DType;
using tensor::Tensor;

namespace {
constexpr std::pair<OptimizerName, std::string_view> kNames[] = {{OptimizerName::adamw, "adamw"},
                                                                 {OptimizerName::sgd, "sgd"},
                                                                 {OptimizerName::lion, "lion"},
                                                                 {OptimizerName::muon, "muon"}};
}  // namespace

std::string optimizer_name(OptimizerName name) {
  for (const auto& [value, spelling] : kNames)
    if (value == name) return std::string(spelling);
  return "?";
}

std::optional<OptimizerName> optimizer_of(std::string_view name) {
  for (const auto& [value, spelling] : kNames)
    if (spelling == name) return value;
  return std::nullopt;
}

model::MomentNames moment_names(const OptimizerConfig& config) {
  // How many: optimizer_moments (train/config.hpp, which the planner counts by); their names:
  std::array<const char*, 2> names{};
  switch (config.name) {
    case OptimizerName::adamw:
      names = {"adam_m", "adam_v"};
      break;
    case OptimizerName::sgd:
      names = {"momentum", nullptr};
      break;
    case OptimizerName::lion:
      names = {"lion_m", nullptr};
      break;
    case OptimizerName::muon:  // muon_m: Muon's momentum, and Adam's m for the AdamW group
      names = {"muon_m", "adam_v"};
      break;
  }
  return {optimizer_moments(config), names};
}

bool muon_matrix(const model::ParamSpec& spec) {
  using model::ParamRole;
  switch (spec.role) {
    case ParamRole::qkv:
    case ParamRole::attn_proj:
    case ParamRole::fc1:
    case ParamRole::fc2:
      return spec.shape.rank == 2;  // the weight, not the bias
    case ParamRole::expert_fc1:
    case ParamRole::expert_fc2:
      return spec.shape.rank == 3;  // the stacked weights [E, rows, cols], not the biases [E, n]
    default:
      return false;
  }
}

namespace {

// The first shape.numel() elements of `t` seen with `shape` (t holds at least that many).
Tensor leading(const Tensor& t, tensor::Shape shape) {
  Tensor v = t;
  v.shape = shape;
  return v;
}

}  // namespace

void newton_schulz(Backend& be, const Tensor& x, int steps, const NewtonSchulzScratch& scratch) {
  constexpr double a = 3.4445, b = -4.7750, c = 2.0315;
  const int64_t rows = x.shape[0], cols = x.shape[1];
  const double norm = std::sqrt(be.sum_squares(x));
  be.scale(x, 1.0 / (norm + 1e-7));
  const int64_t small = std::min(rows, cols);
  const bool wide = rows <= cols;  // A = X X^T ([rows, rows]); else X^T X ([cols, cols])
  Tensor cur = x;
  Tensor next = leading(scratch.next, {rows, cols});
  const Tensor gram = leading(scratch.gram, {small, small});
  const Tensor poly = leading(scratch.poly, {small, small});
  for (int s = 0; s < steps; ++s) {
    backend::GemmArgs g;
    // gram = X X^T (wide) or X^T X
    g.a = cur;
    g.b = cur;
    g.c = gram;
    g.trans_a = !wide;
    g.trans_b = wide;
    g.m = small;
    g.n = small;
    g.k = wide ? cols : rows;
    be.gemm(g);
    // poly = c gram gram + b gram
    be.cast(poly, gram);
    backend::GemmArgs p;
    p.a = gram;
    p.b = gram;
    p.c = poly;
    p.m = p.n = p.k = small;
    p.alpha = c;
    p.beta = b;
    be.gemm(p);
    // next = poly X + a X (wide) or X poly + a X
    be.cast(next, cur);
    backend::GemmArgs n;
    n.a = wide ? poly : cur;
    n.b = wide ? cur : poly;
    n.c = next;
    n.m = rows;
    n.n = cols;
    n.k = small;
    n.alpha = 1.0;
    n.beta = a;
    be.gemm(n);
    std::swap(cur, next);
  }
  if (cur.data != x.data) be.cast(x, cur);
}

// Muon's working state: which parameters it updates, where their matrices are, and the buffers
// the orthogonalisation runs in.
struct Optimizer::Muon {
  // One matrix inside a parameter's global tensor: its first element and shape.
  struct Matrix {
    int64_t offset = 0, rows = 0, cols = 0;
  };
  struct Entry {
    size_t spec = 0;  // index into the store's table
    std::vector<Matrix> matrices;
    bool local_is_global = false;  // the local tensor is the whole (not split over tp or ep)
  };
  std::vector<Entry> entries;
  std::vector<Range> muon, adamw;  // part-relative ranges of the two groups
  backend::Allocation update;      // G, the part: u, then the scaled orthogonal update
  backend::Allocation whole;       // G, the table (ZeRO: u gathered over dp_cp); else unused
  backend::Allocation global;      // G, the largest split parameter's global tensor
  backend::Allocation next, gram, poly;
  std::vector<int64_t> bounds;  // ZeRO: the partition over dp_cp; empty without
  const comm::Mesh* mesh = nullptr;
  int ns_steps = 5;
};

namespace {

// The part-relative ranges of the parameters for which `take` holds, joined where they share
// their decay.
template <class Take>
std::vector<Range> part_ranges(const model::ParamStore& params, Take take) {
  const int64_t first = params.optimizer_begin(), last = params.optimizer_end();
  std::vector<Range> ranges;
  for (const model::ParamSpec& spec : params.table().specs()) {
    if (!take(spec)) continue;
    const int64_t begin = std::max(spec.offset, first);
    const int64_t end = std::min(spec.offset + spec.shape.numel(), last);
    model::append_joined(ranges, Range{begin - first, end - first, spec.weight_decay},
                         [](const Range& a, const Range& b) { return a.decay == b.decay; });
  }
  return ranges;
}

Tensor flat_view(const Tensor& t, int64_t begin, int64_t count) {
  Tensor v = t;
  v.data = static_cast<char*>(t.data) + static_cast<size_t>(begin) * tensor::dtype_size(t.dtype);
  v.shape = {count};
  return v;
}

// Host element copies between a parameter's local tensor and its global one, in elements of
// `item` bytes: whole innermost runs where the last dimension is not split.
void map_elements(const model::ParamSpec& spec, size_t item, int64_t first, int64_t last,
                  const std::byte* from, std::byte* to, bool to_global) {
  for (int64_t i = first; i < last; ++i) {
    const auto g = static_cast<size_t>(spec.global_index(i));
    const auto l = static_cast<size_t>(i);
    if (to_global)
      std::memcpy(to + g * item, from + l * item, item);
    else
      std::memcpy(to + l * item, from + g * item, item);
  }
}

}  // namespace

Optimizer::Optimizer(const OptimizerConfig& config, Backend& be, const model::ParamStore& params,
                     const model::ModelConfig& model, bool zero_sharded, const comm::Mesh* mesh)
    : config_(config), be_(be) {
  all_ = part_ranges(params, [](const model::ParamSpec&) { return true; });
  if (params.moment_names() != moment_names(config).list())
    throw std::invalid_argument(fmt::format(
        "optimizer: the parameter store keeps the moment buffers [{}], the optimizer needs [{}] "
        "(model::ModelParallel::optimizer_moments = train::moment_names)",
        fmt::join(params.moment_names(), ", "), fmt::join(moment_names(config).list(), ", ")));
  if (config.name != OptimizerName::muon) return;
  muon_ = std::make_unique<Muon>();
  Muon& mu = *muon_;
  mu.mesh = mesh;
  mu.ns_steps = config.ns_steps;
  mu.muon = part_ranges(params, muon_matrix);
  mu.adamw = part_ranges(params, [](const model::ParamSpec& s) { return !muon_matrix(s); });
  const DType G = params.grad_dtype();
  const size_t item = tensor::dtype_size(G);
  const int64_t part = params.optimizer_end() - params.optimizer_begin();
  mu.update = be.allocate(static_cast<size_t>(std::max<int64_t>(part, 1)) * item);
  if (zero_sharded && mesh && mesh->dp_cp().size() > 1) {
    mu.bounds = model::zero_partition(params.table(), mesh->dp_cp().size());
    mu.whole = be.allocate(static_cast<size_t>(params.table().numel()) * item);
  }
  const int64_t D = model.head_dim();
  int64_t largest_global = 1, largest_matrix = 1, largest_gram = 1;
  const std::vector<model::ParamSpec>& specs = params.table().specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    const model::ParamSpec& spec = specs[i];
    if (!muon_matrix(spec)) continue;
    Muon::Entry entry;
    entry.spec = i;
    const tensor::Shape global =
        spec.global_shape.rank == spec.shape.rank ? spec.global_shape : spec.shape;
    entry.local_is_global = global.numel() == spec.shape.numel();
    if (!entry.local_is_global) largest_global = std::max(largest_global, global.numel());
    const int64_t rows = global[global.rank - 2], cols = global[global.rank - 1];
    if (global.rank == 3) {  // stacked experts: each of this rank's experts is a matrix
      for (const model::IndexRange& experts :
           spec.pieces.empty() ? std::vector<model::IndexRange>{{0, global[0]}} : spec.pieces[0])
        for (int64_t e = experts.begin; e < experts.end; ++e)
          entry.matrices.push_back({e * rows * cols, rows, cols});
    } else if (spec.role == model::ParamRole::qkv) {  // q, k and v on their own
      const int64_t q = static_cast<int64_t>(model.heads) * D;
      const int64_t kv = static_cast<int64_t>(model.kv_heads) * D;
      entry.matrices = {{0, q, cols}, {q * cols, kv, cols}, {(q + kv) * cols, kv, cols}};
    } else {
      entry.matrices = {{0, rows, cols}};
    }
    for (const Muon::Matrix& m : entry.matrices) {
      largest_matrix = std::max(largest_matrix, m.rows * m.cols);
      largest_gram = std::max(largest_gram, std::min(m.rows, m.cols) * std::min(m.rows, m.cols));
    }
    mu.entries.push_back(std::move(entry));
  }
  mu.global = be.allocate(static_cast<size_t>(largest_global) * item);
  mu.next = be.allocate(static_cast<size_t>(largest_matrix) * item);
  mu.gram = be.allocate(static_cast<size_t>(largest_gram) * item);
  mu.poly = be.allocate(static_cast<size_t>(largest_gram) * item);
}

Optimizer::~Optimizer() = default;

size_t Optimizer::bytes() const {
  if (!muon_) return 0;
  const Muon& mu = *muon_;
  return mu.update.bytes() + mu.whole.bytes() + mu.global.bytes() + mu.next.bytes() +
         mu.gram.bytes() + mu.poly.bytes();
}

void Optimizer::adamw(model::ParamStore& params, double lr, double grad_scale,
                      const std::vector<Range>& ranges) const {
  if (ranges.empty()) return;
  const Backend::AdamW hyper{lr,          config_.betas[0],     config_.betas[1],
                             config_.eps, config_.weight_decay, grad_scale,
                             updates_};
  be_.adamw(params.value_part(), params.master(), params.grad_part(), params.moment1(),
            params.moment2(), ranges, hyper);
}

void Optimizer::step(model::ParamStore& params, double lr, double grad_scale) {
  ++updates_;
  if (config_.name == OptimizerName::adamw) {
    adamw(params, lr, grad_scale, all_);
    return;
  }
  if (config_.name == OptimizerName::sgd || config_.name == OptimizerName::lion) {
    if (all_.empty()) return;
    Backend::Momentum hyper;
    hyper.rule = config_.name == OptimizerName::sgd ? Backend::MomentumRule::sgd
                                                    : Backend::MomentumRule::lion;
    hyper.lr = lr;
    hyper.beta1 = config_.name == OptimizerName::sgd ? config_.momentum : config_.betas[0];
    hyper.beta2 = config_.betas[1];
    hyper.weight_decay = config_.weight_decay;
    hyper.grad_scale = grad_scale;
    hyper.nesterov = config_.nesterov;
    be_.momentum_update(params.value_part(), params.master(), params.grad_part(), params.moment1(),
                        {}, all_, hyper);
    return;
  }
  // Muon: AdamW for its group, then the momentum of the matrices into mu.update.
  Muon& mu = *muon_;
  adamw(params, lr, grad_scale, mu.adamw);
  const DType G = params.grad_dtype();
  const size_t item = tensor::dtype_size(G);
  const int64_t begin = params.optimizer_begin(), end = params.optimizer_end();
  const Tensor update = mu.update.view(G, {std::max<int64_t>(end - begin, 1)});
  const Tensor part_update = flat_view(update, 0, end - begin);
  if (!mu.muon.empty()) {
    Backend::Momentum hyper;
    hyper.rule = Backend::MomentumRule::muon;
    hyper.beta1 = config_.momentum;
    hyper.grad_scale = grad_scale;
    hyper.nesterov = config_.nesterov;
    be_.momentum_update(params.value_part(), params.master(), params.grad_part(), params.moment1(),
                        part_update, mu.muon, hyper);
  }
  // The whole table's u on every rank of the ZeRO group (its elements outside the Muon group are
  // not read).
  const int64_t numel = params.table().numel();
  Tensor source = part_update;  // element i: flat element base + i
  int64_t base = begin;
  if (!mu.bounds.empty()) {
    source = mu.whole.view(G, {numel});
    base = 0;
    std::vector<size_t> bytes = model::zero_shares(mu.bounds, 0, numel);
    for (size_t& count : bytes)
      count *= item;
    mu.mesh->dp_cp().all_gather_v(part_update.data, source.data, bytes);
  }
  const NewtonSchulzScratch scratch{
      mu.next.view(G, {static_cast<int64_t>(mu.next.bytes() / item)}),
      mu.gram.view(G, {static_cast<int64_t>(mu.gram.bytes() / item)}),
      mu.poly.view(G, {static_cast<int64_t>(mu.poly.bytes() / item)})};
  const double scale_base = 0.2;
  std::vector<std::byte> local_host, global_host, part_host;
  for (const Muon::Entry& entry : mu.entries) {
    const model::ParamSpec& spec = params.table().specs()[entry.spec];
    const int64_t n = spec.shape.numel();
    // This rank's elements of the parameter: [lo, hi) of its local flat indices.
    const int64_t lo = std::max<int64_t>(begin - spec.offset, 0);
    const int64_t hi = std::min<int64_t>(end - spec.offset, n);
    const Tensor local = flat_view(source, spec.offset - base, n);
    Tensor whole_param;  // the parameter's global tensor on this rank's device
    if (entry.local_is_global) {
      whole_param = local;
    } else {
      const tensor::Shape gshape = spec.global_shape;
      whole_param = mu.global.view(G, {gshape.numel()});
      local_host.resize(static_cast<size_t>(n) * item);
      global_host.assign(static_cast<size_t>(gshape.numel()) * item, std::byte{0});
      be_.copy_to_host(local_host.data(), local);
      map_elements(spec, item, 0, n, local_host.data(), global_host.data(), true);
      be_.copy_from_host(whole_param, global_host.data());
      // Each tp rank holds other rows or columns, zero elsewhere: the sum is the whole matrix.
      if (spec.tp_sharded && mu.mesh && mu.mesh->tp().size() > 1)
        mu.mesh->tp().all_reduce_sum(whole_param.data, static_cast<size_t>(gshape.numel()), G);
    }
    for (const Muon::Matrix& m : entry.matrices) {
      const Tensor x = flat_view(whole_param, m.offset, m.rows * m.cols).reshaped({m.rows, m.cols});
      newton_schulz(be_, x, mu.ns_steps, scratch);
      be_.scale(x, scale_base * std::sqrt(static_cast<double>(std::max(m.rows, m.cols))));
    }
    if (hi <= lo) continue;
    // This rank's elements of the orthogonalised update into its part.
    const Tensor mine = flat_view(part_update, spec.offset + lo - begin, hi - lo);
    if (entry.local_is_global) {
      if (!mu.bounds.empty()) be_.cast(mine, flat_view(local, lo, hi - lo));  // else in place
    } else {
      be_.copy_to_host(global_host.data(), whole_param);
      part_host.resize(static_cast<size_t>(n) * item);
      map_elements(spec, item, lo, hi, global_host.data(), part_host.data(), false);
      be_.copy_from_host(mine, part_host.data() + static_cast<size_t>(lo) * item);
    }
  }
  if (!mu.muon.empty())
    be_.apply_update(params.value_part(), params.master(), part_update, mu.muon, lr,
                     config_.weight_decay);
}

}  // namespace trainctl::train
