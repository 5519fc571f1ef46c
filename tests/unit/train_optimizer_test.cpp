// The optimizers beside AdamW (train/optimizer.hpp) against float64 references written from their
// papers, on random tensors: the backend's momentum rules (SGD, Lion, Muon's momentum, the update
// Muon applies), Newton-Schulz, and whole Muon steps of a model (the orthogonalised 2-D weights,
// q, k and v apart, and AdamW for the rest) and Adafactor steps (PyTorch's algorithm). fp32 against
// float64: within 1e-6 of each value. With bf16 state (optimizer.state_dtype) the same steps, the
// stored moments a stochastically rounded neighbour of the float64 value, and a split matrix
// rounded as the whole.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend_test_util.hpp"
#include "model/model.hpp"
#include "small_models.hpp"
#include "tensor/rng.hpp"
#include "tensor/stochastic_round.hpp"
#include "train/optimizer.hpp"

namespace {

using namespace trainctl;
using backend::Backend;
using tensor::DType;

std::vector<double> random_values(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v)
    x = static_cast<double>(static_cast<float>(dist(gen)));  // representable in f32
  return v;
}

void fill(const tensor::Tensor& t, const std::vector<double>& values) {
  for (size_t i = 0; i < values.size(); ++i)
    tensor::set_element(t, static_cast<int64_t>(i), values[i]);
}

std::vector<double> read(const tensor::Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = tensor::get_element(t, static_cast<int64_t>(i));
  return v;
}

// Largest |got - want| over the elements, relative to the largest |want| (an element near zero
// is only as exact as its neighbours' magnitude allows in f32).
double worst_relative(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return worst / scale;
}

// |a - b| / |b| over the whole vectors (L2).
double norm_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    ref += b[i] * b[i];
  }
  return std::sqrt(diff / ref);
}

// ---- float64 references, written from the papers ----

using Matrix = std::vector<double>;  // row-major

Matrix matmul(const Matrix& a, const Matrix& b, int64_t m, int64_t k, int64_t n, bool ta = false,
              bool tb = false) {
  Matrix c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += a[static_cast<size_t>(ta ? p * m + i : i * k + p)] *
             b[static_cast<size_t>(tb ? j * k + p : p * n + j)];
      c[static_cast<size_t>(i * n + j)] = s;
    }
  return c;
}

// Keller Jordan's Newton-Schulz: X / (|X|_F + 1e-7), then X = a X + (b A + c A^2) X with
// A = X X^T, on the transpose when rows > cols.
Matrix newton_schulz_reference(Matrix x, int64_t rows, int64_t cols, int steps) {
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  const bool tall = rows > cols;
  if (tall) {  // work on X^T
    Matrix t(x.size());
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        t[static_cast<size_t>(j * rows + i)] = x[static_cast<size_t>(i * cols + j)];
    x = t;
    std::swap(rows, cols);
  }
  double norm = 0;
  for (double v : x)
    norm += v * v;
  norm = std::sqrt(norm) + 1e-7;
  for (double& v : x)
    v /= norm;
  for (int s = 0; s < steps; ++s) {
    const Matrix A = matmul(x, x, rows, cols, rows, false, true);
    const Matrix AA = matmul(A, A, rows, rows, rows);
    Matrix B(A.size());
    for (size_t i = 0; i < B.size(); ++i)
      B[i] = b * A[i] + c * AA[i];
    const Matrix BX = matmul(B, x, rows, rows, cols);
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = a * x[i] + BX[i];
  }
  if (tall) {
    Matrix t(x.size());
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        t[static_cast<size_t>(j * rows + i)] = x[static_cast<size_t>(i * cols + j)];
    x = t;
  }
  return x;
}

}  // namespace

TEST_CASE("train: sgd, lion and muon's momentum against float64 references") {
  Backend& be = backend_test::cpu();
  const size_t n = 1000;
  const auto N = static_cast<int64_t>(n);
  const std::vector<double> w0 = random_values(n, 1, 0.05), m0 = random_values(n, 2, 0.01);
  // Two ranges: the first decays, the second not (a norm or a bias).
  const std::vector<Backend::AdamWRange> ranges{{0, 600, true}, {600, 1000, false}};
  const double lr = 0.03, wd = 0.1, gs = 0.7;
  for (int step = 0; step < 3; ++step) {
    const std::vector<double> g = random_values(n, 10 + static_cast<uint32_t>(step));
    for (const auto& [rule, beta1, beta2, nesterov] :
         {std::tuple{Backend::MomentumRule::sgd, 0.9, 0.0, false},
          std::tuple{Backend::MomentumRule::sgd, 0.9, 0.0, true},
          std::tuple{Backend::MomentumRule::sgd, 0.0, 0.0, false},
          std::tuple{Backend::MomentumRule::lion, 0.9, 0.99, false},
          std::tuple{Backend::MomentumRule::muon, 0.95, 0.0, true},
          std::tuple{Backend::MomentumRule::muon, 0.95, 0.0, false}}) {
      INFO("rule " << static_cast<int>(rule) << " beta1 " << beta1 << " nesterov " << nesterov);
      const tensor::OwnedTensor w(DType::f32, {N}), grad(DType::f32, {N}), m(DType::f32, {N}),
          out(DType::f32, {N});
      fill(w.view(), w0);
      fill(grad.view(), g);
      fill(m.view(), m0);
      const bool without_m = rule == Backend::MomentumRule::sgd && beta1 == 0;
      Backend::Momentum hyper{rule, lr, beta1, beta2, wd, gs, nesterov};
      be.momentum_update(w.view(), {}, grad.view(), without_m ? tensor::Tensor{} : m.view(),
                         rule == Backend::MomentumRule::muon ? out.view() : tensor::Tensor{},
                         ranges, hyper);
      std::vector<double> want_w = w0, want_m = m0, want_out(n, 0.0);
      for (size_t i = 0; i < n; ++i) {
        const double decay = i < 600 ? wd : 0.0;
        const double gi = g[i] * gs;
        switch (rule) {
          case Backend::MomentumRule::sgd: {  // PyTorch's SGD (dampening 0)
            const double d_p = gi + decay * w0[i];
            if (beta1 == 0) {
              want_w[i] = w0[i] - lr * d_p;
              break;
            }
            want_m[i] = beta1 * m0[i] + d_p;
            want_w[i] = w0[i] - lr * (nesterov ? d_p + beta1 * want_m[i] : want_m[i]);
            break;
          }
          case Backend::MomentumRule::lion: {  // Chen et al. 2023, Algorithm 2
            const double c = beta1 * m0[i] + (1 - beta1) * gi;
            const double sign = c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0);
            want_w[i] = w0[i] * (1 - lr * decay) - lr * sign;
            want_m[i] = beta2 * m0[i] + (1 - beta2) * gi;
            break;
          }
          case Backend::MomentumRule::muon:  // Moonlight's Algorithm 1, lines 4-5
            want_m[i] = beta1 * m0[i] + gi;
            want_out[i] = nesterov ? gi + beta1 * want_m[i] : want_m[i];
            break;
        }
      }
      CHECK(worst_relative(read(w.view()), want_w) <= 1e-6);
      if (!without_m) CHECK(worst_relative(read(m.view()), want_m) <= 1e-6);
      if (rule == Backend::MomentumRule::muon) {
        CHECK(worst_relative(read(out.view()), want_out) <= 1e-6);
        CHECK(read(w.view()) == w0);  // the parameters wait for the orthogonalised update
      }
    }
  }
  // apply_update: w = w (1 - lr wd) - lr u in decayed ranges, w - lr u elsewhere.
  const tensor::OwnedTensor w(DType::f32, {N}), u(DType::f32, {N});
  fill(w.view(), w0);
  const std::vector<double> update = random_values(n, 5, 0.1);
  fill(u.view(), update);
  be.apply_update(w.view(), {}, u.view(), ranges, lr, wd);
  std::vector<double> want(n);
  for (size_t i = 0; i < n; ++i)
    want[i] = w0[i] * (1 - lr * (i < 600 ? wd : 0.0)) - lr * update[i];
  CHECK(worst_relative(read(w.view()), want) <= 1e-6);
}

TEST_CASE("train: Newton-Schulz against a float64 reference, wide and tall") {
  Backend& be = backend_test::cpu();
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{16, 48}, {48, 16}, {32, 32}}) {
    INFO(rows << " x " << cols);
    const std::vector<double> x0 = random_values(static_cast<size_t>(rows * cols), 7, 0.3);
    const tensor::OwnedTensor x(DType::f32, {rows * cols}), next(DType::f32, {rows * cols}),
        gram(DType::f32, {rows * rows + cols * cols}),
        poly(DType::f32, {rows * rows + cols * cols});
    fill(x.view(), x0);
    const tensor::Tensor matrix = x.view().reshaped({rows, cols});
    train::newton_schulz(be, matrix, 5, {next.view(), gram.view(), poly.view()});
    const std::vector<double> want = newton_schulz_reference(x0, rows, cols, 5);
    const std::vector<double> got = read(x.view());
    // Five fp32 iterations of GEMMs (measured: 1.1e-6 to 1.9e-6 per element, 9.5e-7 over the
    // matrix); the Muon step below, whose update this is, lands within 1e-6.
    CHECK(worst_relative(got, want) <= 1e-5);
    CHECK(norm_relative(got, want) <= 5e-6);
    // Orthogonalised: the singular values land near 1 (Keller's quintic: within about [0.7,
    // 1.2]), so X X^T (the smaller side) has its diagonal there.
    const int64_t small = std::min(rows, cols);
    const Matrix gram_want = rows <= cols ? matmul(want, want, rows, cols, rows, false, true)
                                          : matmul(want, want, cols, rows, cols, true, false);
    for (int64_t i = 0; i < small; ++i) {
      CHECK(gram_want[static_cast<size_t>(i * small + i)] > 0.4);
      CHECK(gram_want[static_cast<size_t>(i * small + i)] < 1.5);
    }
  }
}

TEST_CASE("train: muon steps of a model against a float64 reference") {
  Backend& be = backend_test::cpu();
  model::ModelConfig config = small_models::gpt(2);
  config.kv_heads = 2;              // q, k and v of different heights
  const int want_matrices = 2 * 4;  // qkv, proj, fc1, fc2 of each block (dense or experts)
  SECTION("gpt") {}
  SECTION("moe: each expert a matrix, the expert biases AdamW's") {
    config.moe.experts = 4;
    config.moe.top_k = 2;
    config.moe.every = 2;  // layer 1: experts; layer 0 dense
  }
  REQUIRE(config.bias);
  model::ModelParallel parallel;
  parallel.optimizer_moments = {2, {"muon_m", "adam_v"}};
  model::Transformer transformer(config, be, 1, parallel);
  transformer.params().initialize(3);
  // Muon's group by name, independently of muon_matrix: the weights of qkv, proj, fc1 and fc2
  // (dense or experts); not their biases (1-D, or [E, n] for experts), norms, router, embedding.
  for (const model::ParamSpec& spec : transformer.params().table().specs()) {
    const bool weight = spec.name.ends_with(".weight");
    const bool linear = spec.name.find(".qkv.") != std::string::npos ||
                        spec.name.find(".proj.") != std::string::npos ||
                        spec.name.find(".fc1.") != std::string::npos ||
                        spec.name.find(".fc2.") != std::string::npos;
    INFO(spec.name);
    CHECK(train::muon_matrix(spec) == (weight && linear));
  }
  train::OptimizerConfig oc;
  oc.name = train::OptimizerName::muon;
  oc.weight_decay = 0.1;
  oc.betas = {0.9, 0.95};
  train::Optimizer optimizer(oc, be, transformer.params(), config, false, nullptr);
  const model::ParamStore& params = transformer.params();
  const size_t n = static_cast<size_t>(params.table().numel());
  std::vector<double> w = read(params.values()), m(n, 0.0), v(n, 0.0);
  const double lr = 0.02, gs = 0.5;
  const int64_t D = config.head_dim();
  int muon_tensors = 0;
  for (int step = 1; step <= 3; ++step) {
    const std::vector<double> g = random_values(n, 100 + static_cast<uint32_t>(step), 0.02);
    fill(params.grads(), g);
    const std::vector<double> before = w;
    optimizer.step(transformer.params(), lr, gs);
    muon_tensors = 0;
    for (const model::ParamSpec& spec : params.table().specs()) {
      const auto off = static_cast<size_t>(spec.offset);
      const auto count = static_cast<size_t>(spec.shape.numel());
      const double decay = spec.weight_decay ? oc.weight_decay : 0.0;
      if (!train::muon_matrix(spec)) {  // AdamW (PyTorch's form)
        for (size_t i = off; i < off + count; ++i) {
          const double gi = g[i] * gs;
          m[i] = oc.betas[0] * m[i] + (1 - oc.betas[0]) * gi;
          v[i] = oc.betas[1] * v[i] + (1 - oc.betas[1]) * gi * gi;
          const double mhat = m[i] / (1 - std::pow(oc.betas[0], step));
          const double vhat = v[i] / (1 - std::pow(oc.betas[1], step));
          w[i] = w[i] * (1 - lr * decay) - lr * mhat / (std::sqrt(vhat) + oc.eps);
        }
        continue;
      }
      ++muon_tensors;
      // Moonlight, Algorithm 1: M = mu M + G; Nesterov; O = NS(.) 0.2 sqrt(max(A, B));
      // W = W - lr (O + wd W).
      Matrix u(count);
      for (size_t i = 0; i < count; ++i) {
        const double gi = g[off + i] * gs;
        m[off + i] = oc.momentum * m[off + i] + gi;
        u[i] = gi + oc.momentum * m[off + i];
      }
      // Row ranges of [rows, cols] matrices; stacked experts [E, r, c] are E matrices of r rows.
      const bool stacked = spec.shape.rank == 3;
      const int64_t cols = spec.shape[spec.shape.rank - 1];
      const int64_t rows = spec.shape.numel() / cols;
      std::vector<std::pair<int64_t, int64_t>> blocks{{0, rows}};
      if (stacked) {
        blocks.clear();
        for (int64_t e = 0; e < spec.shape[0]; ++e)
          blocks.emplace_back(e * spec.shape[1], (e + 1) * spec.shape[1]);
      }
      if (spec.role == model::ParamRole::qkv) {
        const int64_t q = config.heads * D, kv = config.kv_heads * D;
        blocks = {{0, q}, {q, q + kv}, {q + kv, q + 2 * kv}};
      }
      for (const auto& [first, last] : blocks) {
        const Matrix block(u.begin() + first * cols, u.begin() + last * cols);
        const Matrix o = newton_schulz_reference(block, last - first, cols, oc.ns_steps);
        const double scale = 0.2 * std::sqrt(static_cast<double>(std::max(last - first, cols)));
        for (size_t i = 0; i < o.size(); ++i) {
          const size_t at = off + static_cast<size_t>(first * cols) + i;
          w[at] = w[at] * (1 - lr * decay) - lr * scale * o[i];
        }
      }
    }
    const std::vector<double> got = read(params.values());
    INFO("step " << step);
    CHECK(worst_relative(got, w) <= 1e-6);  // measured 6e-8
    std::vector<double> moved(n), moved_want(n);
    for (size_t i = 0; i < n; ++i) {
      moved[i] = got[i] - before[i];
      moved_want[i] = w[i] - before[i];
    }
    // The update itself, not only the weights (measured 4.7e-7 to 8.1e-7).
    CHECK(norm_relative(moved, moved_want) <= 2e-6);
    w = got;  // the next step starts from the same f32 values
  }
  CHECK(muon_tensors == want_matrices);
}

TEST_CASE("train: adafactor steps of a model against a float64 reference") {
  // PyTorch's torch.optim.Adafactor (Shazeer & Stern 2018), each expert of a stacked weight or
  // bias a parameter of its own, weight decay on matrices and embeddings only.
  Backend& be = backend_test::cpu();
  model::ModelConfig config = small_models::gpt(2);
  SECTION("gpt") {}
  SECTION("moe") {
    config.moe.experts = 4;
    config.moe.top_k = 2;
    config.moe.every = 2;
  }
  model::ModelParallel parallel;
  parallel.optimizer_moments = {0, {}};
  model::Transformer transformer(config, be, 1, parallel);
  transformer.params().initialize(5);
  train::OptimizerConfig oc;
  oc.name = train::OptimizerName::adafactor;
  oc.weight_decay = 0.1;
  train::Optimizer optimizer(oc, be, transformer.params(), config, false, nullptr);
  CHECK(transformer.params().moments() == 0);
  const model::ParamStore& params = transformer.params();
  const size_t n = static_cast<size_t>(params.table().numel());
  std::vector<double> w = read(params.values());
  // Per parameter (and expert): the row and column statistics, or the full one of a vector.
  std::map<std::string, std::vector<std::vector<double>>> row_stats, col_stats, full_stats;
  const double lr = 0.05, gs = 0.5, eps1 = 1.1920928955078125e-07, eps2 = 1e-3;
  size_t state_numbers = 0;
  for (int step = 1; step <= 3; ++step) {
    const std::vector<double> g = random_values(n, 200 + static_cast<uint32_t>(step), 0.02);
    fill(params.grads(), g);
    const std::vector<double> before = w;
    optimizer.step(transformer.params(), lr, gs);
    const double one_minus_beta2 = std::pow(step, oc.beta2_decay);
    const double rho = std::min(lr, 1.0 / std::sqrt(step));
    state_numbers = 0;
    for (const model::ParamSpec& spec : params.table().specs()) {
      const bool stacked = spec.expert;
      const int64_t subs = stacked ? spec.shape[0] : 1;
      const int64_t numel = spec.shape.numel() / subs;
      const int64_t cols = spec.shape[spec.shape.rank - 1];
      const bool factored = spec.shape.rank - (stacked ? 1 : 0) >= 2;
      const int64_t R = factored ? numel / cols : 1;
      auto& row_of = row_stats[spec.name];
      auto& col_of = col_stats[spec.name];
      auto& full_of = full_stats[spec.name];
      row_of.resize(static_cast<size_t>(subs), std::vector<double>(static_cast<size_t>(R), 0.0));
      col_of.resize(static_cast<size_t>(subs), std::vector<double>(static_cast<size_t>(cols), 0.0));
      full_of.resize(static_cast<size_t>(subs),
                     std::vector<double>(static_cast<size_t>(numel), 0.0));
      state_numbers += static_cast<size_t>(subs * (factored ? R + cols : numel));
      for (int64_t s = 0; s < subs; ++s) {
        const size_t off = static_cast<size_t>(spec.offset + s * numel);
        std::vector<double> gg(static_cast<size_t>(numel)), u(static_cast<size_t>(numel));
        double w_squares = 0;
        for (size_t i = 0; i < gg.size(); ++i) {
          gg[i] = g[off + i] * gs;
          w_squares += before[off + i] * before[off + i];
        }
        const double alpha =
            std::max(eps2, std::sqrt(w_squares / static_cast<double>(numel))) * rho;
        if (factored) {
          std::vector<double>& r = row_of[static_cast<size_t>(s)];
          std::vector<double>& c = col_of[static_cast<size_t>(s)];
          for (int64_t i = 0; i < R; ++i) {
            double mean = 0;
            for (int64_t j = 0; j < cols; ++j)
              mean += gg[static_cast<size_t>(i * cols + j)] * gg[static_cast<size_t>(i * cols + j)];
            r[static_cast<size_t>(i)] +=
                (mean / cols - r[static_cast<size_t>(i)]) * one_minus_beta2;
          }
          for (int64_t j = 0; j < cols; ++j) {
            double mean = 0;
            for (int64_t i = 0; i < R; ++i)
              mean += gg[static_cast<size_t>(i * cols + j)] * gg[static_cast<size_t>(i * cols + j)];
            c[static_cast<size_t>(j)] += (mean / R - c[static_cast<size_t>(j)]) * one_minus_beta2;
          }
          double r_mean = 0;
          for (double x : r)
            r_mean += x;
          r_mean = std::max(r_mean / R, eps1);
          for (int64_t i = 0; i < R; ++i)
            for (int64_t j = 0; j < cols; ++j) {
              const size_t at = static_cast<size_t>(i * cols + j);
              const double v = r[static_cast<size_t>(i)] * c[static_cast<size_t>(j)] / r_mean;
              u[at] = gg[at] / std::sqrt(std::max(v, eps1 * eps1));
            }
        } else {
          std::vector<double>& v = full_of[static_cast<size_t>(s)];
          for (size_t i = 0; i < v.size(); ++i) {
            v[i] += (gg[i] * gg[i] - v[i]) * one_minus_beta2;
            u[i] = gg[i] / std::sqrt(std::max(v[i], eps1 * eps1));
          }
        }
        double u_squares = 0;
        for (double x : u)
          u_squares += x * x;
        const double denom =
            std::max(1.0, std::sqrt(u_squares / static_cast<double>(numel)) / oc.clip_threshold);
        const double decay = spec.weight_decay ? oc.weight_decay : 0.0;
        for (size_t i = 0; i < u.size(); ++i)
          w[off + i] = before[off + i] * (1 - lr * decay) - alpha / denom * u[i];
      }
    }
    const std::vector<double> got = read(params.values());
    INFO("step " << step);
    CHECK(worst_relative(got, w) <= 1e-6);
    std::vector<double> moved(n), moved_want(n);
    for (size_t i = 0; i < n; ++i) {
      moved[i] = got[i] - before[i];
      moved_want[i] = w[i] - before[i];
    }
    CHECK(norm_relative(moved, moved_want) <= 1e-6);
    w = got;
  }
  // The state is the statistics alone: R + C numbers per matrix, n per vector.
  CHECK(static_cast<size_t>(optimizer.state().numel()) == state_numbers);
  CHECK(state_numbers < n / 10);
}

// ---- optimizer.state_dtype: bf16 (tensor/stochastic_round.hpp) ----

namespace {

// bf16's spacing at |x| (x normal): 2^(exponent - 7).
double bf16_ulp(double x) {
  int e = 0;
  std::frexp(x, &e);  // |x| = f 2^e, f in [0.5, 1)
  return std::ldexp(1.0, e - 1 - 7);
}

double bf16_value(uint16_t bits) {
  return tensor::to_float(tensor::bf16{bits});
}

// A bf16 tensor of `values` rounded to nearest.
void fill_bf16(const tensor::Tensor& t, const std::vector<double>& values) {
  auto* p = static_cast<uint16_t*>(t.data);
  for (size_t i = 0; i < values.size(); ++i)
    p[i] = tensor::to_bf16(static_cast<float>(values[i])).bits;
}

std::vector<double> read_bf16(const tensor::Tensor& t) {
  const auto* p = static_cast<const uint16_t*>(t.data);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = bf16_value(p[i]);
  return v;
}

// Every stored value is one of the two bf16 neighbours of the float64 reference (within f32's
// own rounding of it), and the errors in ulps average near 0 (unbiased: round to nearest would
// leave a mean of about +-0.25 on one side for each element, and truncation -0.5).
void check_stochastically_rounded(const std::vector<double>& got, const std::vector<double>& want,
                                  const char* what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  double sum = 0;
  size_t counted = 0, inexact = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (want[i] == 0) continue;
    const double ulp = bf16_ulp(want[i]);
    const double error = (got[i] - want[i]) / ulp;
    INFO("element " << i << ": got " << got[i] << ", float64 " << want[i]);
    REQUIRE(std::abs(error) < 1.0 + 1e-4);
    sum += error;
    ++counted;
    if (got[i] !=
        static_cast<double>(tensor::to_float(tensor::to_bf16(static_cast<float>(want[i])))))
      ++inexact;
  }
  REQUIRE(counted > 500);
  CHECK(std::abs(sum / static_cast<double>(counted)) < 0.05);
  CHECK(inexact > counted / 10);  // not round to nearest in disguise
}

}  // namespace

TEST_CASE("train: bf16 stochastic rounding is unbiased, exact on bf16 values, and keyed") {
  // Representable values never move; the others go to a neighbour.
  for (const float x : {1.0f, -2.5f, 0.0f, -0.0f, 3.0e38f, 1.0e-39f}) {
    const uint16_t exact = tensor::to_bf16(x).bits;
    if (bf16_value(exact) != static_cast<double>(x)) continue;
    for (uint32_t r : {0u, 1u, 0x7FFFu, 0xFFFFu})
      CHECK(tensor::bf16_stochastic(x, r) == exact);
  }
  CHECK(std::isnan(bf16_value(tensor::bf16_stochastic(std::nanf(""), 0xFFFF))));
  CHECK(bf16_value(tensor::bf16_stochastic(INFINITY, 0xFFFF)) == INFINITY);
  CHECK(bf16_value(tensor::bf16_stochastic(-INFINITY, 0xFFFF)) == -INFINITY);
  // 1 + 0.3 ulp rounds up with probability 0.3 over the elements of a parameter at one step:
  // within 5 sigma of 100,000 draws. And the mean of the rounded values is x.
  const float ulp = 1.0f / 128.0f;
  const float x = 1.0f + 0.3f * ulp;
  const uint64_t key = tensor::rounding_key(1234, tensor::stream_key("layers.0.attn.qkv.weight"));
  const int draws = 100000;
  int up = 0;
  for (int i = 0; i < draws; ++i) {
    const uint16_t b = tensor::bf16_stochastic(x, tensor::rounding_bits(key, i, 7));
    const double v = bf16_value(b);
    REQUIRE((v == 1.0 || v == 1.0 + ulp));
    up += v > 1.0;
  }
  const double p = static_cast<double>(up) / draws;
  CHECK(std::abs(p - 0.3) < 5 * std::sqrt(0.3 * 0.7 / draws));
  // Negative values round toward and away from zero alike (the bits are of the magnitude).
  int away = 0;
  for (int i = 0; i < draws; ++i)
    away += bf16_value(tensor::bf16_stochastic(-x, tensor::rounding_bits(key, i, 8))) < -1.0;
  CHECK(std::abs(static_cast<double>(away) / draws - 0.3) < 5 * std::sqrt(0.3 * 0.7 / draws));
  // Pure functions of (seed, name, index, step): the same draw again; another of any differs.
  CHECK(tensor::rounding_bits(key, 5, 7) == tensor::rounding_bits(key, 5, 7));
  CHECK(tensor::rounding_bits(key, 5, 7) != tensor::rounding_bits(key, 6, 7));
  CHECK(tensor::rounding_bits(key, 5, 7) != tensor::rounding_bits(key, 5, 8));
  CHECK(tensor::rounding_bits(key, 5, 7) !=
        tensor::rounding_bits(
            tensor::rounding_key(1235, tensor::stream_key("layers.0.attn.qkv.weight")), 5, 7));
  CHECK(tensor::rounding_bits(key, 5, 7) !=
        tensor::rounding_bits(
            tensor::rounding_key(1234, tensor::stream_key("layers.1.attn.qkv.weight")), 5, 7));
  // The global index of a range described as rows.
  CHECK(tensor::range_global_index(10, 10, 6, 6, 12) == 6);
  CHECK(tensor::range_global_index(16, 10, 6, 6, 12) == 18);
  CHECK(tensor::range_global_index(23, 10, 6, 6, 12) == 31);
  CHECK(tensor::range_global_index(23, 10, 6, 20, 20) == 19);
}

TEST_CASE("train: adamw and the momentum rules with bf16 state against float64 references") {
  Backend& be = backend_test::cpu();
  // More than one CPU chunk (moment_chunks.hpp) and three ranges, one of them without decay.
  const size_t n = 5000;
  const auto N = static_cast<int64_t>(n);
  const uint64_t key = tensor::rounding_key(7, tensor::stream_key("w"));
  const std::vector<Backend::AdamWRange> ranges{{0, 2100, true, key, 0, 2100, 2100},
                                                {2100, 4000, false, key, 2100, 1900, 1900},
                                                {4000, 5000, true, key, 4000, 1000, 1000}};
  const auto decayed = [](size_t i) { return i < 2100 || i >= 4000; };
  const std::vector<double> w0 = random_values(n, 1, 0.05);
  const std::vector<double> g = random_values(n, 3);
  // Moments that are bf16 values (what a previous step stored).
  const auto bf16_values = [](std::vector<double> v) {
    for (double& x : v)
      x = tensor::to_float(tensor::to_bf16(static_cast<float>(x)));
    return v;
  };
  const std::vector<double> m0 = bf16_values(random_values(n, 2, 0.01));
  std::vector<double> v0 = bf16_values(random_values(n, 4, 1e-4));
  for (double& x : v0)
    x = std::abs(x);
  const double lr = 0.03, wd = 0.1, gs = 0.7;

  SECTION("adamw") {
    const double b1 = 0.9, b2 = 0.95, eps = 1e-8;
    const int64_t step = 3;
    const tensor::OwnedTensor w(DType::f32, {N}), grad(DType::f32, {N}), m(DType::bf16, {N}),
        v(DType::bf16, {N});
    fill(w.view(), w0);
    fill(grad.view(), g);
    fill_bf16(m.view(), m0);
    fill_bf16(v.view(), v0);
    be.adamw(w.view(), {}, grad.view(), m.view(), v.view(), ranges,
             Backend::AdamW{lr, b1, b2, eps, wd, gs, step});
    std::vector<double> want_w(n), want_m(n), want_v(n);
    for (size_t i = 0; i < n; ++i) {  // Loshchilov & Hutter, Algorithm 2 (PyTorch's form)
      const double gi = g[i] * gs;
      want_m[i] = b1 * m0[i] + (1 - b1) * gi;
      want_v[i] = b2 * v0[i] + (1 - b2) * gi * gi;
      const double mhat = want_m[i] / (1 - std::pow(b1, step));
      const double vhat = want_v[i] / (1 - std::pow(b2, step));
      want_w[i] = w0[i] * (1 - lr * (decayed(i) ? wd : 0.0)) - lr * mhat / (std::sqrt(vhat) + eps);
    }
    // The weights step with the unrounded moments; the stored moments are rounded.
    CHECK(worst_relative(read(w.view()), want_w) <= 1e-6);
    check_stochastically_rounded(read_bf16(m.view()), want_m, "adamw m");
    check_stochastically_rounded(read_bf16(v.view()), want_v, "adamw v");
  }

  SECTION("sgd, lion and muon's momentum") {
    for (const auto& [rule, beta1, beta2] : {std::tuple{Backend::MomentumRule::sgd, 0.9, 0.0},
                                             std::tuple{Backend::MomentumRule::lion, 0.9, 0.99},
                                             std::tuple{Backend::MomentumRule::muon, 0.95, 0.0}}) {
      INFO("rule " << static_cast<int>(rule));
      const tensor::OwnedTensor w(DType::f32, {N}), grad(DType::f32, {N}), m(DType::bf16, {N}),
          out(DType::f32, {N});
      fill(w.view(), w0);
      fill(grad.view(), g);
      fill_bf16(m.view(), m0);
      Backend::Momentum hyper{rule, lr, beta1, beta2, wd, gs, true, 5};
      be.momentum_update(w.view(), {}, grad.view(), m.view(),
                         rule == Backend::MomentumRule::muon ? out.view() : tensor::Tensor{},
                         ranges, hyper);
      std::vector<double> want_w = w0, want_m(n), want_out(n);
      for (size_t i = 0; i < n; ++i) {
        const double decay = decayed(i) ? wd : 0.0;
        const double gi = g[i] * gs;
        switch (rule) {
          case Backend::MomentumRule::sgd: {
            const double d_p = gi + decay * w0[i];
            want_m[i] = beta1 * m0[i] + d_p;
            want_w[i] = w0[i] - lr * (d_p + beta1 * want_m[i]);
            break;
          }
          case Backend::MomentumRule::lion: {
            const double c = beta1 * m0[i] + (1 - beta1) * gi;
            want_w[i] = w0[i] * (1 - lr * decay) - lr * (c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0));
            want_m[i] = beta2 * m0[i] + (1 - beta2) * gi;
            break;
          }
          case Backend::MomentumRule::muon:
            want_m[i] = beta1 * m0[i] + gi;
            want_out[i] = gi + beta1 * want_m[i];
            break;
        }
      }
      CHECK(worst_relative(read(w.view()), want_w) <= 1e-6);
      if (rule == Backend::MomentumRule::muon)
        CHECK(worst_relative(read(out.view()), want_out) <= 1e-6);
      check_stochastically_rounded(read_bf16(m.view()), want_m, "momentum");
    }
  }
}

TEST_CASE("train: bf16 state rounds a split matrix exactly as the whole one") {
  // An [8, 12] matrix updated whole, and as the two column halves a tp2 rank pair holds (each
  // [8, 6], its rows placed at stride 12 from column 0 or 6), and as a ZeRO-like part that starts
  // inside a row: the same moments and weights, bit for bit.
  Backend& be = backend_test::cpu();
  const int64_t R = 8, C = 12, H = C / 2;
  const uint64_t key = tensor::rounding_key(42, tensor::stream_key("layers.0.mlp.fc2.weight"));
  const std::vector<double> w0 = random_values(R * C, 1, 0.05), g = random_values(R * C, 2);
  const std::vector<double> m0 = random_values(R * C, 3, 0.01), v0 = random_values(R * C, 4, 1e-3);
  const Backend::AdamW hyper{0.01, 0.9, 0.95, 1e-8, 0.1, 1.0, 4};
  struct State {
    tensor::OwnedTensor w, grad, m, v;
    explicit State(int64_t n)
        : w(DType::f32, {n}), grad(DType::f32, {n}), m(DType::bf16, {n}), v(DType::bf16, {n}) {}
  };
  const auto gather = [&](const std::vector<double>& all, int64_t c0) {  // columns c0..c0+H
    std::vector<double> part;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = c0; c < c0 + H; ++c)
        part.push_back(all[static_cast<size_t>(r * C + c)]);
    return part;
  };
  const auto start = [&](State& s, const std::vector<double>& w, const std::vector<double>& gr,
                         const std::vector<double>& m, std::vector<double> v) {
    for (double& x : v)
      x = std::abs(x);
    fill(s.w.view(), w);
    fill(s.grad.view(), gr);
    fill_bf16(s.m.view(), m);
    fill_bf16(s.v.view(), v);
  };
  State whole(R * C);
  start(whole, w0, g, m0, v0);
  const Backend::AdamWRange every{0, R * C, true, key, 0, R * C, R * C};
  be.adamw(whole.w.view(), {}, whole.grad.view(), whole.m.view(), whole.v.view(),
           std::span<const Backend::AdamWRange>(&every, 1), hyper);
  const std::vector<double> want_w = read(whole.w.view()), want_m = read_bf16(whole.m.view()),
                            want_v = read_bf16(whole.v.view());
  for (const int64_t c0 : {int64_t{0}, H}) {
    INFO("columns from " << c0);
    State half(R * H);
    start(half, gather(w0, c0), gather(g, c0), gather(m0, c0), gather(v0, c0));
    const Backend::AdamWRange rows{0, R * H, true, key, c0, H, C};
    be.adamw(half.w.view(), {}, half.grad.view(), half.m.view(), half.v.view(),
             std::span<const Backend::AdamWRange>(&rows, 1), hyper);
    CHECK(read(half.w.view()) == gather(want_w, c0));
    CHECK(read_bf16(half.m.view()) == gather(want_m, c0));
    CHECK(read_bf16(half.v.view()) == gather(want_v, c0));
  }
  // A part [30, 96) of the whole: its elements as a range of a buffer of their own.
  const int64_t first = 30;
  State part(R * C - first);
  const auto tail = [&](const std::vector<double>& all) {
    return std::vector<double>(all.begin() + first, all.end());
  };
  start(part, tail(w0), tail(g), tail(m0), tail(v0));
  const Backend::AdamWRange cut{0, R * C - first, true, key, first, R * C - first, R * C - first};
  be.adamw(part.w.view(), {}, part.grad.view(), part.m.view(), part.v.view(),
           std::span<const Backend::AdamWRange>(&cut, 1), hyper);
  CHECK(read(part.w.view()) == tail(want_w));
  CHECK(read_bf16(part.m.view()) == tail(want_m));
  CHECK(read_bf16(part.v.view()) == tail(want_v));
}
