// The node-local checkpoint tier's file (lib/run/local_tier.hpp): a rank's buffers and trainer
// state written and read back exactly (straight into the targets, through chunks larger and
// smaller than a buffer), the newest two steps kept, and every reason a copy is refused: damage
// anywhere in a buffer, a file cut short, another rank, layout or model. The restart's choice
// between tiers and the fallbacks are tested end to end by cli:tiers.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "backend/backend.hpp"
#include "run/local_tier.hpp"

using namespace trainctl;
namespace fs = std::filesystem;

namespace {

struct Dir {
  fs::path path = fs::temp_directory_path() / ("trainctl-local-tier-" + std::to_string(::getpid()));
  Dir() { fs::remove_all(path); }
  ~Dir() { fs::remove_all(path); }
};

run::LocalTier::Identity identity(int rank = 1) {
  return {rank, 2, "0123456789abcdef", "{\"dp\":2}"};
}

// A snapshot whose buffers hold distinct bytes: values of 3 Mi f32 (more than one 8 MiB chunk
// when bf16 is not involved), no master weights, and two moments.
train::RankSnapshot snapshot(int64_t step, size_t values = 3u << 20) {
  train::RankSnapshot s;
  s.state.step = step;
  s.state.optimizer_updates = step;
  s.state.sampler.seq_len = 16;
  s.state.loss_scaler.scale = 1;
  const auto fill = [](std::vector<std::byte>& to, size_t floats, float first) {
    to.resize(floats * sizeof(float));
    for (size_t i = 0; i < floats; ++i) {
      const float x = first + static_cast<float>(i);
      std::memcpy(to.data() + i * sizeof x, &x, sizeof x);
    }
  };
  fill(s.values, values, 1.0f);
  fill(s.moment1, values, 2.0f);
  fill(s.moment2, values, 3.0f);
  return s;
}

struct Targets {
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  backend::Allocation values, m1, m2;
  explicit Targets(size_t floats)
      : values(be->allocate(floats * 4)),
        m1(be->allocate(floats * 4)),
        m2(be->allocate(floats * 4)) {}
  train::SnapshotTargets tensors(size_t floats) const {
    const tensor::Shape shape{static_cast<int64_t>(floats)};
    return {values.view(tensor::DType::f32, shape), tensor::Tensor{},
            m1.view(tensor::DType::f32, shape), m2.view(tensor::DType::f32, shape),
            tensor::Tensor{}};
  }
  bool equal(const train::RankSnapshot& s) const {
    return std::memcmp(values.data(), s.values.data(), s.values.size()) == 0 &&
           std::memcmp(m1.data(), s.moment1.data(), s.moment1.size()) == 0 &&
           std::memcmp(m2.data(), s.moment2.data(), s.moment2.size()) == 0;
  }
};

}  // namespace

TEST_CASE("local tier: a rank's state comes back exactly, the newest two steps kept",
          "[run][tiers]") {
  Dir dir;
  const size_t floats = 3u << 20;  // 12 MiB a buffer: a full 8 MiB chunk and a partial one
  {
    run::LocalTier tier("local tier", dir.path, identity());
    for (int64_t step : {5, 10, 15})
      tier.submit(snapshot(step, floats));
    tier.wait();
    CHECK(tier.steps() == std::vector<int64_t>{15, 10});
    CHECK_FALSE(fs::exists(dir.path / "step_00000005"));
  }
  run::LocalTier tier("local tier", dir.path, identity());
  Targets targets(floats);
  train::TrainerState state;
  CHECK(tier.load(15, targets.tensors(floats), *targets.be, state) == "");
  CHECK(state.step == 15);
  CHECK(state.optimizer_updates == 15);
  CHECK(targets.equal(snapshot(15, floats)));
  tier.remove_all();
  CHECK_FALSE(fs::exists(dir.path));
}

TEST_CASE("local tier: a damaged, cut or foreign copy is refused with the reason", "[run][tiers]") {
  Dir dir;
  const size_t floats = 1000;
  {
    run::LocalTier tier("memory tier", dir.path, identity());
    tier.submit(snapshot(7, floats));
    tier.wait();
  }
  const fs::path file = dir.path / "step_00000007" / "rank_1.snapshot";
  const std::string intact = [&] {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const auto with = [&](const std::string& bytes) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  };
  Targets targets(floats);
  train::TrainerState state;
  const auto reason = [&](const run::LocalTier& tier) {
    return tier.load(7, targets.tensors(floats), *targets.be, state);
  };
  run::LocalTier tier("memory tier", dir.path, identity());
  for (size_t at : {intact.size() - 1, intact.size() - 4000 - 5, intact.size() - 8000 - 5}) {
    std::string damaged = intact;
    damaged[at] = static_cast<char>(damaged[at] ^ 0x40);
    with(damaged);
    CHECK_THAT(reason(tier), Catch::Contains("does not match (damaged)"));
  }
  with(intact.substr(0, intact.size() - 100));
  CHECK_THAT(reason(tier), Catch::Contains("the file ends inside moment2 (damaged or cut short)"));
  with(intact + "x");
  CHECK_THAT(reason(tier), Catch::Contains("1 bytes after the last buffer"));
  with(intact);
  CHECK(reason(tier) == "");
  run::LocalTier::Identity other_layout = identity();
  other_layout.layout = "{\"dp\":1}";
  CHECK_THAT(reason(run::LocalTier("memory tier", dir.path, other_layout)),
             Catch::Contains("written with layout \"{\\\"dp\\\":2}\", this run has "
                             "\"{\\\"dp\\\":1}\""));
  run::LocalTier::Identity other_model = identity();
  other_model.model = "fedcba9876543210";
  CHECK_THAT(reason(run::LocalTier("memory tier", dir.path, other_model)),
             Catch::Contains("written with model"));
  CHECK_THAT(tier.load(7, Targets(floats + 1).tensors(floats + 1), *targets.be, state),
             Catch::Contains("values has 4000 bytes, this rank keeps 4004"));
}
