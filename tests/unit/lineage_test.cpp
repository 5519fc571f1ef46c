// The lineage statistic (lib/lineage): on synthetic matrices its null distribution is N(0, 1),
// also when both sides share mean shifts (what two models trained on the same data share), and
// init plus noise is found; on checkpoints of freshly initialised models, the seed that made them
// is found and another is not.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <numeric>

#include "backend_test_util.hpp"
#include "ckpt/ckpt.hpp"
#include "ckpt_test_util.hpp"
#include "lineage/lineage.hpp"
#include "model/model.hpp"
#include "tensor/rng.hpp"
#include "train/checkpointing.hpp"

namespace {

namespace fs = std::filesystem;
using namespace trainctl;
using backend_test::cpu;

// Standard normal values of `stream` (of generator seed 77).
std::vector<double> normals(size_t count, uint64_t stream) {
  const tensor::CounterRng rng(77, stream);
  std::vector<double> out(count);
  for (size_t i = 0; i < count; ++i)
    out[i] = rng.normal(i);
  return out;
}

struct Moments {
  double mean = 0, sd = 0, largest = 0;
};
Moments moments(const std::vector<double>& z) {
  Moments m;
  m.mean = std::accumulate(z.begin(), z.end(), 0.0) / static_cast<double>(z.size());
  for (double v : z) {
    m.sd += (v - m.mean) * (v - m.mean);
    m.largest = std::max(m.largest, std::abs(v));
  }
  m.sd = std::sqrt(m.sd / static_cast<double>(z.size() - 1));
  return m;
}

constexpr int64_t kRows = 24, kCols = 40;
constexpr size_t kN = kRows * kCols;
constexpr int kTrials = 400;

}  // namespace

TEST_CASE("the statistic of independent matrices is N(0, 1)") {
  std::vector<double> z;
  for (int t = 0; t < kTrials; ++t) {
    const std::vector<double> birth = normals(kN, 2 * t), other = normals(kN, 2 * t + 1);
    z.push_back(lineage::correlate(birth, other, kRows, kCols).z);
  }
  const Moments m = moments(z);
  INFO("mean " << m.mean << " sd " << m.sd << " largest |z| " << m.largest);
  // 400 draws: the mean's standard error is 0.05, the sd's about 0.035.
  CHECK(std::abs(m.mean) < 0.2);
  CHECK(m.sd > 0.85);
  CHECK(m.sd < 1.15);
  CHECK(m.largest < 4.5);
}

TEST_CASE("shared row and column shifts do not make unrelated matrices look related") {
  // Both sides get the same large row and column offsets (as two models trained on the same data
  // move the same token rows and residual columns), on top of independent values.
  const std::vector<double> row_shift = normals(kRows, 9001), col_shift = normals(kCols, 9002);
  std::vector<double> z;
  for (int t = 0; t < kTrials; ++t) {
    std::vector<double> a = normals(kN, 2 * t), b = normals(kN, 2 * t + 1);
    for (size_t i = 0; i < kN; ++i) {
      const double shift = 5 * row_shift[i / kCols] + 5 * col_shift[i % kCols];
      a[i] += shift;
      b[i] += shift;
    }
    z.push_back(lineage::correlate(a, b, kRows, kCols).z);
  }
  const Moments m = moments(z);
  INFO("mean " << m.mean << " sd " << m.sd << " largest |z| " << m.largest);
  CHECK(std::abs(m.mean) < 0.2);
  CHECK(m.sd > 0.85);
  CHECK(m.sd < 1.15);
  // Without the centring the same pairs correlate almost perfectly: the test sees the shifts.
  std::vector<double> a = normals(kN, 1), b = normals(kN, 2);
  for (size_t i = 0; i < kN; ++i)
    a[i] += 5 * row_shift[i / kCols] + 5 * col_shift[i % kCols],
        b[i] += 5 * row_shift[i / kCols] + 5 * col_shift[i % kCols];
  CHECK(lineage::correlate(a, b, 1, kN).z > 50);  // one row: centred once, by the grand mean
}

TEST_CASE("rows that move together in both models inflate Fisher z but not the permutation z") {
  // The tied embedding of two models on the same data (lineage.hpp, "The null of --against"):
  // the same rows (tokens the data never shows) carry a common vector, each model its own, on
  // top of independent values. The Fisher z of such pairs spreads like sqrt(rows); the z against
  // permutations of the columns stays N(0, 1), and a shared initialisation is still found.
  constexpr int64_t R = 200, C = 32;
  std::vector<double> fisher, permuted;
  for (int t = 0; t < 200; ++t) {
    std::vector<double> a = normals(R * C, 4 * t), b = normals(R * C, 4 * t + 1);
    const std::vector<double> u = normals(C, 4 * t + 2), v = normals(C, 4 * t + 3);
    for (int64_t i = 0; i < R * 3 / 4; ++i)  // three quarters of the rows: unseen tokens
      for (int64_t j = 0; j < C; ++j) {
        a[static_cast<size_t>(i * C + j)] += 3 * u[static_cast<size_t>(j)];
        b[static_cast<size_t>(i * C + j)] += 3 * v[static_cast<size_t>(j)];
      }
    fisher.push_back(lineage::correlate(a, b, R, C).z);
    permuted.push_back(lineage::correlate(a, b, R, C, "", lineage::kPermutations).z);
  }
  const Moments f = moments(fisher), m = moments(permuted);
  INFO("Fisher sd " << f.sd << ", permutation mean " << m.mean << " sd " << m.sd << " largest "
                    << m.largest);
  CHECK(f.sd > 5);
  CHECK(std::abs(m.mean) < 0.25);
  CHECK(m.sd > 0.8);
  CHECK(m.sd < 1.2);
  CHECK(m.largest < 5);
  // The same structure, as large as the birth values, on both sides of a shared initialisation:
  // found, although the permutations' spread includes the shared rows' (the price of this null:
  // a tensor whose energy is mostly such rows says less than its Fisher z would).
  std::vector<double> a = normals(R * C, 1), b = a;
  const std::vector<double> u = normals(C, 2), v = normals(C, 3), noise = normals(R * C, 4);
  for (int64_t i = 0; i < R * C; ++i) {
    const bool unseen = i / C < R * 3 / 4;
    a[static_cast<size_t>(i)] += unseen ? u[static_cast<size_t>(i % C)] : 0;
    b[static_cast<size_t>(i)] +=
        noise[static_cast<size_t>(i)] + (unseen ? v[static_cast<size_t>(i % C)] : 0);
  }
  CHECK(lineage::correlate(a, b, R, C, "", lineage::kPermutations).z > 8);
}

TEST_CASE("birth values under noise ten times larger are found") {
  // r ~ 0.1 over 100 x 100 elements: z ~ 0.1 * sqrt(99 * 99) ~ 10.
  const std::vector<double> birth = normals(10000, 1), noise = normals(10000, 2);
  std::vector<double> trained(10000);
  for (size_t i = 0; i < trained.size(); ++i)
    trained[i] = 0.1 * birth[i] + noise[i] + 0.3;  // + a shift, which the centring removes
  const lineage::TensorStat s = lineage::correlate(birth, trained, 100, 100);
  CHECK(s.dof == 99 * 99);
  CHECK(s.r > 0.07);
  CHECK(s.z > 7);
  const lineage::Result result = lineage::combine({s});
  CHECK(result.z == Approx(s.z));
  CHECK(result.descends());
}

TEST_CASE("blocks of rows in any order give the statistic of the whole") {
  const std::vector<double> x = normals(kN, 3), y = normals(kN, 4);
  lineage::PairAccumulator acc("t", kRows, kCols);
  const int64_t split = 10 * kCols;  // rows [10, 24) first, then [0, 10)
  acc.add_rows(10, std::span(x).subspan(split), std::span(y).subspan(split));
  acc.add_rows(0, std::span(x).first(split), std::span(y).first(split));
  const lineage::TensorStat blocks = acc.finish(), whole = lineage::correlate(x, y, kRows, kCols);
  CHECK(blocks.r == Approx(whole.r).epsilon(1e-12));
  // A block that is not whole rows, or rows missing, is a programming error.
  lineage::PairAccumulator partial("t", kRows, kCols);
  CHECK_THROWS_AS(partial.add_rows(0, std::span(x).first(7), std::span(y).first(7)),
                  std::invalid_argument);
  partial.add_rows(0, std::span(x).first(kCols), std::span(y).first(kCols));
  CHECK_THROWS_AS(partial.finish(), std::logic_error);
}

TEST_CASE("a constant side carries no information and is left out of the combination") {
  const std::vector<double> x = normals(kN, 5), ones(kN, 1.0);
  const lineage::TensorStat s = lineage::correlate(x, ones, kRows, kCols);
  CHECK(s.dof == 0);
  const lineage::Result result = lineage::combine({s, lineage::correlate(x, x, kRows, kCols)});
  CHECK(result.elements == static_cast<int64_t>(kN));
  CHECK(result.tensors.size() == 2);
}

TEST_CASE("Stouffer weights each tensor's Fisher z by sqrt(d - 2)") {
  lineage::TensorStat a{"a", 100, 50, 0.2, std::atanh(0.2) * std::sqrt(48.0)},
      b{"b", 1000, 402, -0.1, std::atanh(-0.1) * std::sqrt(400.0)};
  const lineage::Result r = lineage::combine({a, b});
  const double expected = (48 * std::atanh(0.2) + 400 * std::atanh(-0.1)) / std::sqrt(448.0);
  CHECK(r.z == Approx(expected));
  CHECK(r.p == Approx(0.5 * std::erfc(expected / std::sqrt(2.0))));
  CHECK(r.elements == 1100);
}

TEST_CASE("log10 of the upper tail is right where p underflows") {
  for (double z = -5; z < 30; z += 0.5)
    CHECK(lineage::log10_upper_tail(z) == Approx(std::log10(0.5 * std::erfc(z / std::sqrt(2.0)))));
  // long double's range reaches 1e-4951: a reference up to z = 140.
  for (long double z : {29.999L, 30.0L, 31.0L, 37.0L, 45.0L, 100.0L, 140.0L}) {
    const long double reference = std::log10(0.5L * std::erfc(z / std::sqrt(2.0L)));
    CHECK(lineage::log10_upper_tail(static_cast<double>(z)) ==
          Approx(static_cast<double>(reference)).epsilon(1e-9));
  }
  CHECK(lineage::log10_upper_tail(1000) < lineage::log10_upper_tail(999));
}

namespace {

std::vector<int64_t> dims(const tensor::Shape& s) {
  return std::vector<int64_t>(s.dims.begin(), s.dims.begin() + s.rank);
}

// A checkpoint of model `c` freshly initialised with `seed`, in `dir`/checkpoints.
fs::path save_initialised(const model::ModelConfig& c, uint64_t seed, const fs::path& dir) {
  model::Transformer model(c, cpu(), 1);
  model.params().initialize(seed);
  const tensor::Tensor values = model.params().values();
  const size_t element = tensor::dtype_size(values.dtype);
  ckpt::SaveRequest request;
  request.header.step = 0;
  request.header.recipe_hash = "feed";
  request.header.model = train::describe_model(c);
  for (const model::ParamSpec& spec : model.params().table().specs())
    request.add("model/" + spec.name, values.dtype, dims(spec.shape), {},
                static_cast<const char*>(values.data) + static_cast<size_t>(spec.offset) * element);
  const auto slices = request.slices();
  return ckpt::save(dir / "checkpoints", request.header, slices).path;
}

model::ModelConfig small_llama() {
  model::ModelConfig c = model::llama_preset();
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_hidden = 48;
  c.vocab = 64;
  c.seq_len = 16;
  c.moe.experts = 4;
  c.moe.every = 2;
  c.moe.expert_ffn_hidden = 24;
  c.storage = tensor::DType::bf16;
  return c;
}

using ckpt_test::TempDir;

}  // namespace

TEST_CASE("the model description gives back the table the checkpoint was saved from") {
  model::ModelConfig gpt = model::gpt_preset();
  gpt.storage = tensor::DType::bf16;
  for (const model::ModelConfig& c : {gpt, small_llama()}) {
    const model::ModelConfig back =
        train::model_from_description(train::describe_model(c), "manifest.json");
    CHECK(train::describe_model(back) == train::describe_model(c));
  }
  nlohmann::json broken = train::describe_model(gpt);
  broken.erase("hidden");
  CHECK_THROWS_WITH(train::model_from_description(broken, "x/manifest.json"),
                    Catch::Contains("x/manifest.json") && Catch::Contains("\"hidden\""));
}

TEST_CASE("a freshly initialised checkpoint descends from its seed and no other") {
  const TempDir tmp;
  const model::ModelConfig c = small_llama();
  const auto reader = ckpt::CheckpointReader::open(save_initialised(c, 5, tmp.path / "a"));
  const lineage::Result own = lineage::test_seed(reader, 5);
  CHECK(own.descends());
  CHECK(own.z > 100);
  CHECK(own.log10_p < -1000);
  // Norms are ones-initialised and biases absent: the tensors used are the normal ones, every
  // one of them (embedding, qkv, proj, dense MLP, router, experts, head).
  model::ParamTable table = model::build_param_table(c);
  size_t normal = 0;
  for (const model::ParamSpec& spec : table.specs())
    normal += spec.init == model::Init::normal;
  CHECK(own.tensors.size() == normal);
  for (const lineage::TensorStat& t : own.tensors)
    CHECK(t.r > 0.99);  // bf16 rounding of the birth values only
  for (uint64_t other : {4, 6, 1234}) {
    const lineage::Result result = lineage::test_seed(reader, other);
    INFO("seed " << other);
    CHECK(!result.descends());
    CHECK(std::abs(result.z) < 4.5);
  }
}

TEST_CASE("two checkpoints are compared tensor by tensor, and refused when they differ") {
  const TempDir tmp;
  const model::ModelConfig c = small_llama();
  const auto a = ckpt::CheckpointReader::open(save_initialised(c, 5, tmp.path / "a"));
  const auto same = ckpt::CheckpointReader::open(save_initialised(c, 5, tmp.path / "b"));
  const auto other = ckpt::CheckpointReader::open(save_initialised(c, 8, tmp.path / "c"));
  CHECK(lineage::test_against(a, same).descends());
  const lineage::Result unrelated = lineage::test_against(a, other);
  CHECK(!unrelated.descends());
  CHECK(std::abs(unrelated.z) < 4.5);
  model::ModelConfig wider = c;
  wider.hidden = 64;
  const auto d = ckpt::CheckpointReader::open(save_initialised(wider, 5, tmp.path / "d"));
  CHECK_THROWS_AS(lineage::test_against(a, d), lineage::Incomparable);
  CHECK_THROWS_WITH(lineage::test_against(a, d), Catch::Contains((tmp.path / "a").string()) &&
                                                     Catch::Contains((tmp.path / "d").string()));
}
