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
#include "tensor/rng.hpp"
#include "tensor/stochastic_round.hpp"

namespace trainctl::train {

using backend::Backend;
using Range = Backend::AdamWRange;
using tensor::DType;
using tensor::Tensor;

namespace {
constexpr std::pair<OptimizerName, std::string_view> kNames[] = {
    {OptimizerName::adamw, "adamw"},
    {OptimizerName::sgd, "sgd"},
    {OptimizerName::lion, "lion"},
    {OptimizerName::muon, "muon"},
    {OptimizerName::adafactor, "adafactor"}};
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
    case OptimizerName::adafactor:  // none: its factored state is Optimizer::state
      break;
  }
  return {optimizer_moments(config), names, config.state_dtype == StateDtype::bf16};
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

// A parameter's local elements [begin, end) (its own flat indices) as rows in its global tensor:
// local element begin + r * local_width + c is global element global_begin + r * global_width + c
// (Backend::AdamWRange's placement).
struct Placement {
  int64_t begin = 0, end = 0, global_begin = 0, local_width = 1, global_width = 1;
};

// The placements of all of `spec`'s local elements: the runs of local elements that are contiguous
// in the global tensor (the dimensions after the last split one, times one piece of it), joined
// where they follow at a fixed global stride. An unsplit parameter is one run; a column-split
// matrix one placement of rows; a tensor-parallel qkv one per head group (q, k, v).
std::vector<Placement> placements(const model::ParamSpec& spec) {
  const int64_t n = spec.shape.numel();
  const int rank = spec.shape.rank;
  int d = rank - 1;
  int64_t inner = 1;
  const auto whole = [&](int dim) {
    const auto& p = spec.pieces[static_cast<size_t>(dim)];
    return p.size() == 1 && p[0].begin == 0 && p[0].end == spec.global_shape[dim];
  };
  if (!spec.pieces.empty())
    while (d >= 0 && whole(d))
      inner *= spec.shape[d--];
  if (spec.pieces.empty() || d < 0)
    return {Placement{0, n, 0, std::max<int64_t>(n, 1), std::max<int64_t>(n, 1)}};
  int64_t outer = 1;
  for (int k = 0; k < d; ++k)
    outer *= spec.shape[k];
  std::vector<Placement> out;
  int64_t local = 0;
  for (int64_t o = 0; o < outer; ++o)
    for (const model::IndexRange& piece : spec.pieces[static_cast<size_t>(d)]) {
      const int64_t len = piece.size() * inner;
      if (len == 0) continue;
      const int64_t global = spec.global_index(local);
      if (!out.empty()) {
        Placement& p = out.back();
        const int64_t runs = (p.end - p.begin) / p.local_width;
        if (p.end == local && p.local_width == len && global > p.global_begin &&
            (runs == 1 || global == p.global_begin + runs * p.global_width)) {
          if (runs == 1) p.global_width = global - p.global_begin;
          p.end += len;
          local += len;
          continue;
        }
      }
      out.push_back(Placement{local, local + len, global, len, len});
      local += len;
    }
  return out;
}

// The part-relative ranges of the parameters for which `take` holds. With `rounded` (bf16
// moments) each range carries its parameter's rounding key (from `seed` and the name) and the
// global placement of its elements, one range per placement cut to the part; else ranges are
// joined where they share their decay.
template <class Take>
std::vector<Range> part_ranges(const model::ParamStore& params, Take take, bool rounded = false,
                               uint64_t seed = 0) {
  const int64_t first = params.optimizer_begin(), last = params.optimizer_end();
  std::vector<Range> ranges;
  for (const model::ParamSpec& spec : params.table().specs()) {
    if (!take(spec)) continue;
    const int64_t begin = std::max(spec.offset, first);
    const int64_t end = std::min(spec.offset + spec.shape.numel(), last);
    if (!rounded) {
      model::append_joined(ranges, Range{begin - first, end - first, spec.weight_decay},
                           [](const Range& a, const Range& b) { return a.decay == b.decay; });
      continue;
    }
    const uint64_t key = tensor::rounding_key(seed, tensor::stream_key(spec.name));
    const int64_t lo = begin - spec.offset, hi = end - spec.offset;  // the parameter's own indices
    const auto add = [&](int64_t a, int64_t b, int64_t global, int64_t lw, int64_t gw) {
      ranges.push_back(Range{spec.offset + a - first, spec.offset + b - first, spec.weight_decay,
                             key, global, lw, gw});
    };
    for (const Placement& p : placements(spec)) {
      int64_t a = std::max(p.begin, lo);
      const int64_t b = std::min(p.end, hi);
      if (a >= b) continue;
      int64_t row = (a - p.begin) / p.local_width;
      const int64_t phase = (a - p.begin) % p.local_width;
      if (phase != 0) {  // the part starts inside a row: that row's rest on its own
        const int64_t head_end = std::min(b, a + (p.local_width - phase));
        add(a, head_end, p.global_begin + row * p.global_width + phase, head_end - a, head_end - a);
        a = head_end;
        ++row;
        if (a >= b) continue;
      }
      add(a, b, p.global_begin + row * p.global_width, p.local_width, p.global_width);
    }
  }
  return ranges;
}

Tensor flat_view(const Tensor& t, int64_t begin, int64_t count) {
  Tensor v = t;
  v.data = static_cast<char*>(t.data) + static_cast<size_t>(begin) * tensor::dtype_size(t.dtype);
  v.shape = {count};
  return v;
}

// Host copies of local elements [first, last) of a parameter to their places in its global tensor
// (to_global) or back, element by element (ParamSpec::global_index), in elements of `item` bytes.
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

// The flat table's elements of `part` (this rank's ZeRO part [begin, end), G) on every rank of
// the ZeRO group: all-gathered over dp_cp into `whole` when the store is one part of several
// (bounds not empty); else `part` itself. Returns the table's tensor and the flat index of its
// element 0.
std::pair<Tensor, int64_t> gather_table(const Tensor& part, int64_t begin, int64_t numel,
                                        const std::vector<int64_t>& bounds,
                                        const backend::Allocation& whole, const comm::Mesh* mesh) {
  if (bounds.empty()) return {part, begin};
  const Tensor table = whole.view(part.dtype, {numel});
  std::vector<size_t> bytes = model::zero_shares(bounds, 0, numel);
  for (size_t& count : bytes)
    count *= tensor::dtype_size(part.dtype);
  mesh->dp_cp().all_gather_v(part.data, table.data, bytes);
  return {table, 0};
}

// The global tensor of `spec` (G) on the device, from `local` (its local elements): `local`
// itself when the local tensor is the whole; else placed at its global indices in `global`
// (zeros elsewhere) and, when split over tp, summed over the tp ranks (each holds other rows or
// columns: the sum is exact).
Tensor global_tensor(Backend& be, const comm::Mesh* mesh, const model::ParamSpec& spec,
                     const Tensor& local, bool local_is_global, const backend::Allocation& global,
                     std::vector<std::byte>& local_host, std::vector<std::byte>& global_host) {
  if (local_is_global) return local;
  const size_t item = tensor::dtype_size(local.dtype);
  const int64_t n = spec.shape.numel(), total = spec.global_shape.numel();
  const Tensor out = global.view(local.dtype, {total});
  local_host.resize(static_cast<size_t>(n) * item);
  global_host.assign(static_cast<size_t>(total) * item, std::byte{0});
  be.copy_to_host(local_host.data(), local);
  map_elements(spec, item, 0, n, local_host.data(), global_host.data(), true);
  be.copy_from_host(out, global_host.data());
  if (spec.tp_sharded && mesh && mesh->tp().size() > 1)
    mesh->tp().all_reduce_sum(out.data, static_cast<size_t>(total), local.dtype);
  return out;
}

// Host values of a G tensor's bytes as doubles, and back.
std::vector<double> to_doubles(const std::vector<std::byte>& bytes, DType dtype) {
  std::vector<double> out;
  if (dtype == DType::f64) {
    out.resize(bytes.size() / sizeof(double));
    std::memcpy(out.data(), bytes.data(), bytes.size());
  } else {
    std::vector<float> f(bytes.size() / sizeof(float));
    std::memcpy(f.data(), bytes.data(), bytes.size());
    out.assign(f.begin(), f.end());
  }
  return out;
}

void from_doubles(const std::vector<double>& values, DType dtype, std::byte* out) {
  if (dtype == DType::f64) {
    std::memcpy(out, values.data(), values.size() * sizeof(double));
  } else {
    for (size_t i = 0; i < values.size(); ++i) {
      const auto f = static_cast<float>(values[i]);
      std::memcpy(out + i * sizeof f, &f, sizeof f);
    }
  }
}

}  // namespace

// Adafactor's statistics and working buffers (see optimizer.hpp for the rule).
struct Optimizer::Adafactor {
  // One parameter: `subs` parameters of `rows` x `cols` (experts: one per local expert, from
  // global expert `first_expert`; else the whole global tensor as [rows, cols], rows = 1 for a
  // vector). Its statistics at `offset` of the state: factored, subs * rows row values then
  // subs * cols column values; else subs * cols values.
  struct Entry {
    size_t spec = 0;
    int64_t subs = 1, first_expert = 0, rows = 1, cols = 1, offset = 0;
    bool factored = false, local_is_global = true, expert = false;
    int64_t numel() const { return rows * cols; }  // of one sub-parameter
  };
  std::vector<Entry> entries;
  std::vector<StateTensor> tensors;
  backend::Allocation state;   // G, the statistics
  backend::Allocation update;  // G, the part: the step's update
  backend::Allocation whole;   // G, the table (ZeRO: the gradients gathered over dp_cp)
  backend::Allocation global;  // G, the largest split parameter's global tensor
  int64_t state_numel = 0;
  std::vector<int64_t> bounds;
  const comm::Mesh* mesh = nullptr;
};

Optimizer::Optimizer(const OptimizerConfig& config, Backend& be, const model::ParamStore& params,
                     const model::ModelConfig& model, bool zero_sharded, const comm::Mesh* mesh,
                     uint64_t seed)
    : config_(config), be_(be), grad_dtype_(params.grad_dtype()) {
  const bool rounded = config.state_dtype == StateDtype::bf16;
  all_ = part_ranges(
      params, [](const model::ParamSpec&) { return true; }, rounded, seed);
  if (params.moments() > 0 &&
      params.moment_dtype() != (rounded ? DType::bf16 : params.grad_dtype()))
    throw std::invalid_argument(fmt::format(
        "optimizer: the parameter store keeps {} moments, optimizer.state_dtype wants {}",
        tensor::dtype_name(params.moment_dtype()), rounded ? "bf16" : "the gradient type"));
  if (params.moment_names() != moment_names(config).list())
    throw std::invalid_argument(fmt::format(
        "optimizer: the parameter store keeps the moment buffers [{}], the optimizer needs [{}] "
        "(model::ModelParallel::optimizer_moments = train::moment_names)",
        fmt::join(params.moment_names(), ", "), fmt::join(moment_names(config).list(), ", ")));
  if (config.name == OptimizerName::adafactor) {
    adafactor_ = std::make_unique<Adafactor>();
    Adafactor& af = *adafactor_;
    af.mesh = mesh;
    const DType G = params.grad_dtype();
    const size_t item = tensor::dtype_size(G);
    const int64_t part = params.optimizer_end() - params.optimizer_begin();
    af.update = be.allocate(static_cast<size_t>(std::max<int64_t>(part, 1)) * item);
    if (zero_sharded && mesh && mesh->dp_cp().size() > 1) {
      af.bounds = model::zero_partition(params.table(), mesh->dp_cp().size());
      af.whole = be.allocate(static_cast<size_t>(params.table().numel()) * item);
    }
    int64_t largest_global = 1;
    const std::vector<model::ParamSpec>& specs = params.table().specs();
    for (size_t i = 0; i < specs.size(); ++i) {
      const model::ParamSpec& spec = specs[i];
      const tensor::Shape global =
          spec.global_shape.rank == spec.shape.rank ? spec.global_shape : spec.shape;
      Adafactor::Entry e;
      e.spec = i;
      e.expert = spec.expert && global.rank >= 2;
      e.local_is_global = global.numel() == spec.shape.numel();
      if (!e.local_is_global) largest_global = std::max(largest_global, global.numel());
      const int first_dim = e.expert ? 1 : 0;  // experts: each one a parameter of its own
      const int sub_rank = global.rank - first_dim;
      if (e.expert) {
        const model::IndexRange experts =
            spec.pieces.empty() ? model::IndexRange{0, global[0]} : spec.pieces[0][0];
        e.first_expert = experts.begin;
        e.subs = spec.shape[0];
        if (!spec.pieces.empty() && (spec.pieces[0].size() != 1 || experts.size() != e.subs))
          throw std::logic_error("adafactor: " + spec.name +
                                 " holds experts that are not one contiguous range");
      }
      e.cols = sub_rank >= 1 ? global[global.rank - 1] : 1;
      e.rows = 1;
      for (int d = first_dim; d + 1 < global.rank; ++d)
        e.rows *= global[d];
      e.factored = sub_rank >= 2;
      e.offset = af.state_numel;
      const int64_t E = e.expert ? global[0] : 1;
      auto shape_of = [&](int64_t n) {
        return e.expert ? std::vector<int64_t>{E, n} : std::vector<int64_t>{n};
      };
      auto box_of = [&](int64_t n) {
        std::vector<std::pair<int64_t, int64_t>> box;
        if (e.expert) box.emplace_back(e.first_expert, e.first_expert + e.subs);
        box.emplace_back(0, n);
        return box;
      };
      if (e.factored) {
        af.tensors.push_back(
            {"adafactor_row/" + spec.name, shape_of(e.rows), box_of(e.rows), e.offset, &spec});
        af.tensors.push_back({"adafactor_col/" + spec.name, shape_of(e.cols), box_of(e.cols),
                              e.offset + e.subs * e.rows, &spec});
        af.state_numel += e.subs * (e.rows + e.cols);
      } else {
        af.tensors.push_back(
            {"adafactor_v/" + spec.name, shape_of(e.numel()), box_of(e.numel()), e.offset, &spec});
        af.state_numel += e.subs * e.numel();
      }
      af.entries.push_back(e);
    }
    af.state = be.allocate(static_cast<size_t>(std::max<int64_t>(af.state_numel, 1)) * item);
    af.global = be.allocate(static_cast<size_t>(largest_global) * item);
    return;
  }
  if (config.name != OptimizerName::muon) return;
  muon_ = std::make_unique<Muon>();
  Muon& mu = *muon_;
  mu.mesh = mesh;
  mu.ns_steps = config.ns_steps;
  mu.muon = part_ranges(params, muon_matrix, rounded, seed);
  mu.adamw = part_ranges(
      params, [](const model::ParamSpec& s) { return !muon_matrix(s); }, rounded, seed);
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

Tensor Optimizer::state() const {
  if (!adafactor_) return {};
  return adafactor_->state.view(grad_dtype_, {adafactor_->state_numel});
}

const std::vector<Optimizer::StateTensor>& Optimizer::state_tensors() const {
  static const std::vector<StateTensor> none;
  return adafactor_ ? adafactor_->tensors : none;
}

size_t Optimizer::bytes() const {
  if (adafactor_) {
    const Adafactor& af = *adafactor_;
    return af.state.bytes() + af.update.bytes() + af.whole.bytes() + af.global.bytes();
  }
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

void Optimizer::adafactor_step(model::ParamStore& params, double lr, double grad_scale) {
  Adafactor& af = *adafactor_;
  const DType G = params.grad_dtype();
  const size_t item = tensor::dtype_size(G);
  const int64_t begin = params.optimizer_begin(), end = params.optimizer_end();
  const int64_t part = end - begin;
  const auto t = static_cast<double>(updates_);
  const double one_minus_beta2 = std::pow(t, config_.beta2_decay);
  const double rho = std::min(lr, 1.0 / std::sqrt(t));
  constexpr double eps1 = 1.1920928955078125e-07;  // f32's machine epsilon (PyTorch's default)
  constexpr double eps2 = 1e-3;
  const std::vector<model::ParamSpec>& specs = params.table().specs();

  // The weights of the part (the master when kept), for RMS(w) of each (sub-)parameter: partial
  // sums of squares over the part, summed over the ZeRO group and, for tp-split parameters, over
  // tp (the others are whole on every tp rank: only tp rank 0 contributes them).
  std::vector<std::byte> bytes(static_cast<size_t>(part) * item);
  const Tensor weights = params.has_master() ? params.master() : params.value_part();
  if (part > 0) be_.copy_to_host(bytes.data(), weights);
  const std::vector<double> w = to_doubles(bytes, G);
  std::vector<double> squares;  // per entry and sub-parameter
  std::vector<size_t> first_square;
  const int tp_rank = af.mesh ? af.mesh->tp().rank() : 0;
  for (const Adafactor::Entry& e : af.entries) {
    const model::ParamSpec& spec = specs[e.spec];
    first_square.push_back(squares.size());
    squares.resize(squares.size() + static_cast<size_t>(e.subs), 0.0);
    if (!spec.tp_sharded && tp_rank != 0) continue;
    const int64_t per_sub = spec.shape.numel() / e.subs;  // local elements of one sub-parameter
    const int64_t lo = std::max<int64_t>(begin - spec.offset, 0);
    const int64_t hi = std::min<int64_t>(end - spec.offset, spec.shape.numel());
    for (int64_t i = lo; i < hi; ++i) {
      const double x = w[static_cast<size_t>(spec.offset + i - begin)];
      squares[first_square.back() + static_cast<size_t>(i / per_sub)] += x * x;
    }
  }
  if (af.mesh && !squares.empty()) {
    if (!af.bounds.empty())
      af.mesh->dp_cp().all_reduce_sum(squares.data(), squares.size(), DType::f64);
    if (af.mesh->tp().size() > 1)
      af.mesh->tp().all_reduce_sum(squares.data(), squares.size(), DType::f64);
  }

  // The gradients of the whole table on every rank of the ZeRO group, each parameter's global
  // tensor from them, its statistics and update (the same on every rank holding part of it), and
  // this rank's elements of the update into its part.
  const auto [table, base] = gather_table(flat_view(params.grad_part(), 0, part), begin,
                                          params.table().numel(), af.bounds, af.whole, af.mesh);
  std::vector<std::byte> state_bytes(static_cast<size_t>(af.state_numel) * item);
  if (af.state_numel > 0) be_.copy_to_host(state_bytes.data(), state());
  std::vector<double> stats = to_doubles(state_bytes, G);
  std::vector<double> delta(static_cast<size_t>(part), 0.0);
  std::vector<std::byte> local_host, global_host;
  for (size_t k = 0; k < af.entries.size(); ++k) {
    const Adafactor::Entry& e = af.entries[k];
    const model::ParamSpec& spec = specs[e.spec];
    const int64_t n = spec.shape.numel();
    const Tensor global = global_tensor(be_, af.mesh, spec, flat_view(table, spec.offset - base, n),
                                        e.local_is_global, af.global, local_host, global_host);
    std::vector<std::byte> grad_bytes(static_cast<size_t>(global.numel()) * item);
    be_.copy_to_host(grad_bytes.data(), global);
    std::vector<double> g = to_doubles(grad_bytes, G);
    for (double& x : g)
      x *= grad_scale;
    // The update of every element of the global tensor this rank holds sub-parameters of.
    std::vector<double> u(g.size(), 0.0);
    const int64_t R = e.rows, C = e.cols, N = e.numel();
    for (int64_t s = 0; s < e.subs; ++s) {
      const int64_t at = (e.expert ? e.first_expert + s : 0) * N;  // in the global tensor
      const double* gs = g.data() + at;
      double* us = u.data() + at;
      if (e.factored) {
        double* row = stats.data() + e.offset + s * R;
        double* col = stats.data() + e.offset + e.subs * R + s * C;
        for (int64_t i = 0; i < R; ++i) {
          double sum = 0;
          for (int64_t j = 0; j < C; ++j)
            sum += gs[i * C + j] * gs[i * C + j];
          row[i] += (sum / static_cast<double>(C) - row[i]) * one_minus_beta2;
        }
        for (int64_t j = 0; j < C; ++j) {
          double sum = 0;
          for (int64_t i = 0; i < R; ++i)
            sum += gs[i * C + j] * gs[i * C + j];
          col[j] += (sum / static_cast<double>(R) - col[j]) * one_minus_beta2;
        }
        double row_mean = 0;
        for (int64_t i = 0; i < R; ++i)
          row_mean += row[i];
        row_mean = std::max(row_mean / static_cast<double>(R), eps1);
        for (int64_t i = 0; i < R; ++i)
          for (int64_t j = 0; j < C; ++j)
            us[i * C + j] =
                gs[i * C + j] / std::sqrt(std::max(row[i] * col[j] / row_mean, eps1 * eps1));
      } else {
        double* v = stats.data() + e.offset + s * N;
        for (int64_t i = 0; i < N; ++i) {
          v[i] += (gs[i] * gs[i] - v[i]) * one_minus_beta2;
          us[i] = gs[i] / std::sqrt(std::max(v[i], eps1 * eps1));
        }
      }
      double sum = 0;
      for (int64_t i = 0; i < N; ++i)
        sum += us[i] * us[i];
      const double rms_update = std::sqrt(sum / static_cast<double>(N));
      const double rms_weight =
          std::sqrt(squares[first_square[k] + static_cast<size_t>(s)] / static_cast<double>(N));
      const double step =
          std::max(eps2, rms_weight) * rho / std::max(1.0, rms_update / config_.clip_threshold);
      for (int64_t i = 0; i < N; ++i)
        us[i] *= step;
    }
    const int64_t lo = std::max<int64_t>(begin - spec.offset, 0);
    const int64_t hi = std::min<int64_t>(end - spec.offset, n);
    for (int64_t i = lo; i < hi; ++i)
      delta[static_cast<size_t>(spec.offset + i - begin)] =
          u[static_cast<size_t>(spec.global_index(i))];
  }
  if (af.state_numel > 0) {
    from_doubles(stats, G, state_bytes.data());
    be_.copy_from_host(state(), state_bytes.data());
  }
  if (part == 0) return;
  std::vector<std::byte> delta_bytes(static_cast<size_t>(part) * item);
  from_doubles(delta, G, delta_bytes.data());
  const Tensor update = af.update.view(G, {part});
  be_.copy_from_host(update, delta_bytes.data());
  // w = w (1 - lr wd) - update: apply_update's lr 1 and weight decay lr wd.
  be_.apply_update(params.value_part(), params.master(), update, all_, 1.0,
                   lr * config_.weight_decay);
}

void Optimizer::step(model::ParamStore& params, double lr, double grad_scale) {
  ++updates_;
  if (adafactor_) {
    adafactor_step(params, lr, grad_scale);
    return;
  }
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
    hyper.step = updates_;
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
    hyper.step = updates_;
    be_.momentum_update(params.value_part(), params.master(), params.grad_part(), params.moment1(),
                        part_update, mu.muon, hyper);
  }
  // The whole table's u on every rank of the ZeRO group (its elements outside the Muon group are
  // not read).
  const auto [source, base] =
      gather_table(part_update, begin, params.table().numel(), mu.bounds, mu.whole, mu.mesh);
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
    // The parameter's global tensor on this rank's device (`local` itself when whole: in place).
    const Tensor whole_param = global_tensor(be_, mu.mesh, spec, local, entry.local_is_global,
                                             mu.global, local_host, global_host);
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
