// Resume exactness at the library level: training 2N steps straight and training N steps,
// capturing the TrainerState and the parameter buffers (values, fp32 master weights, Adam
// moments), rebuilding everything from scratch and training N more give bit-identical losses and
// weights. This is what a checkpoint must carry; the checkpoint tests prove the files carry it.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <cstring>
#include <filesystem>

#include "backend_test_util.hpp"
#include "data/sources.hpp"
#include "train/checkpointing.hpp"
#include "train/trainer.hpp"

namespace {

using namespace trainctl;
using backend_test::cpu;
using tensor::DType;

struct Case {
  const char* name;
  DType storage;
  bool moe;
  int micro_batch;
  train::LossScalingConfig loss_scaling;
};

model::ModelConfig config_for(const Case& c) {
  model::ModelConfig m = c.moe ? model::llama_preset() : model::gpt_preset();
  m.layers = 2;
  m.hidden = 32;
  m.heads = 4;
  m.kv_heads = c.moe ? 2 : 4;
  m.ffn_hidden = 48;
  m.vocab = 32;
  m.seq_len = 16;
  m.storage = c.storage;
  if (c.moe) {
    m.moe.experts = 4;
    m.moe.top_k = 2;
    m.moe.every = 2;
    m.moe.capacity_factor = 1.0;
  }
  return m;
}

std::vector<unsigned char> bytes_of(const tensor::Tensor& t) {
  if (t.empty()) return {};
  std::vector<unsigned char> out(t.bytes());
  std::memcpy(out.data(), t.data, t.bytes());
  return out;
}
void load_bytes(const tensor::Tensor& t, const std::vector<unsigned char>& b) {
  if (!t.empty()) std::memcpy(t.data, b.data(), b.size());
}

struct Snapshot {
  train::TrainerState state;
  std::vector<unsigned char> values, master, m, v;
};

// One training process: fresh model, data and trainer; optionally restored from a snapshot;
// trains until `stop_after` steps in total; returns the per-step losses and a snapshot.
struct Process {
  std::vector<double> losses;
  std::vector<bool> skipped;
  Snapshot start;  // right after the restore from a checkpoint file (when there was one)
  Snapshot end;
};

Snapshot snapshot(const train::Trainer& trainer, const model::Transformer& model) {
  return {trainer.state(), bytes_of(model.params().values()), bytes_of(model.params().master()),
          bytes_of(model.params().moment1()), bytes_of(model.params().moment2())};
}

// Every byte of every buffer (values, fp32 master, both Adam moments) and every field of the
// trainer state: what a bit-identical resume claims.
void check_same(const Snapshot& got, const Snapshot& want) {
  REQUIRE_FALSE(want.values.empty());
  REQUIRE_FALSE(want.m.empty());
  REQUIRE_FALSE(want.v.empty());
  CHECK(got.values == want.values);
  CHECK(got.master == want.master);
  CHECK(got.m == want.m);
  CHECK(got.v == want.v);
  CHECK(got.state.step == want.state.step);
  CHECK(got.state.tokens == want.state.tokens);
  CHECK(got.state.optimizer_updates == want.state.optimizer_updates);
  CHECK(got.state.loss_scaler.scale == want.state.loss_scaler.scale);
  CHECK(got.state.loss_scaler.good_steps == want.state.loss_scaler.good_steps);
  CHECK(got.state.loss_scaler.skipped_steps == want.state.loss_scaler.skipped_steps);
  CHECK(got.state.sampler.position == want.state.sampler.position);
  CHECK(got.state.sampler.seed == want.state.sampler.seed);
  CHECK(got.state.sampler.fingerprint == want.state.sampler.fingerprint);
}

// `checkpoints`: when set, the process resumes from the newest checkpoint there (if any) and
// saves one when it stops, through lib/ckpt's files instead of in memory.
Process train_process(const Case& c, int64_t total_steps, int64_t stop_after, const Snapshot* from,
                      const std::filesystem::path* checkpoints = nullptr) {
  const model::ModelConfig mc = config_for(c);
  train::TrainConfig tc;
  tc.steps = total_steps;
  tc.global_batch = 8;
  tc.micro_batch = c.micro_batch;
  tc.optimizer = {train::OptimizerName::adamw, 3e-3, {0.9, 0.95}, 1e-8, 0.1, 1.0};
  tc.schedule = {3, train::DecayKind::cosine, 3e-4, 0.2, total_steps};
  tc.loss_scaling = c.loss_scaling;
  const data::SyntheticSource source(5, mc.vocab, 1 << 14);
  data::Sampler sampler(source, mc.seq_len, 9, true, mc.vocab);
  model::Transformer model(mc, cpu(), tc.micro_batch);
  model.params().initialize(77);
  train::Trainer trainer(tc, model, cpu(), sampler, nullptr);
  if (from) {
    load_bytes(model.params().values(), from->values);
    load_bytes(model.params().master(), from->master);
    load_bytes(model.params().moment1(), from->m);
    load_bytes(model.params().moment2(), from->v);
    trainer.restore(from->state);
  }
  if (checkpoints) {
    const ckpt::ScanReport report = ckpt::scan(*checkpoints);
    if (const ckpt::ScanEntry* newest = report.newest_valid())
      train::restore_checkpoint(ckpt::CheckpointReader::open(newest->path), model, trainer, cpu());
  }
  Process p;
  p.start = snapshot(trainer, model);
  trainer.run([&](const train::StepMetrics& s) {
    p.losses.push_back(s.loss);
    p.skipped.push_back(s.skipped);
    return s.step < stop_after;
  });
  if (checkpoints) {
    ckpt::CheckpointWriter writer(*checkpoints, {true, 2});
    writer.save(train::capture_checkpoint(model, trainer, cpu(), "test", {{"world_size", 1}}));
    writer.wait();
  }
  p.end = snapshot(trainer, model);
  return p;
}

}  // namespace

TEST_CASE("resume after N of 2N steps continues bit for bit", "[train][resume]") {
  using K = train::LossScaleKind;
  // fp16: a small window makes the scale grow, and a large start makes the first steps skip, so
  // the scaler's whole state crosses the boundary.
  const Case cases[] = {
      {"fp32", DType::f32, false, 4, {}},
      {"bf16", DType::bf16, false, 4, {}},
      {"fp16 dynamic loss scale", DType::f16, false, 4, {{K::dynamic, 0.0}, 1 << 24, 3, 1.0}},
      {"fp32 gradient accumulation (4 micro-batches)", DType::f32, false, 2, {}},
      {"bf16 llama MoE", DType::bf16, true, 4, {}},
  };
  const int64_t N = 6;
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      const Process straight = train_process(c, 2 * N, 2 * N, nullptr);
      const Process first = train_process(c, 2 * N, N, nullptr);
      REQUIRE(first.losses.size() == N);
      REQUIRE(first.end.state.step == N);
      const Process second = train_process(c, 2 * N, 2 * N, &first.end);
      REQUIRE(second.losses.size() == N);
      for (int64_t i = 0; i < 2 * N; ++i) {
        const double resumed = i < N ? first.losses[static_cast<size_t>(i)]
                                     : second.losses[static_cast<size_t>(i - N)];
        INFO("step " << i + 1);
        CHECK(resumed == straight.losses[static_cast<size_t>(i)]);
      }
      check_same(second.end, straight.end);
      if (c.storage == DType::f16) {
        CHECK(first.skipped.front());  // the scaler really did skip and back off before the save
      }
    }
  }
}

TEST_CASE("resume through checkpoint files continues bit for bit", "[train][resume][checkpoint]") {
  using K = train::LossScaleKind;
  const Case cases[] = {
      {"fp16 dynamic loss scale", DType::f16, false, 2, {{K::dynamic, 0.0}, 1 << 24, 3, 1.0}},
      {"bf16 llama MoE", DType::bf16, true, 4, {}},
  };
  const int64_t N = 5;
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                        ("trainctl_resume_test_" + std::to_string(::getpid()));
      std::filesystem::remove_all(dir);
      const Process straight = train_process(c, 3 * N, 3 * N, nullptr);
      const Process first = train_process(c, 3 * N, N, nullptr, &dir);
      const Process second = train_process(c, 3 * N, 2 * N, nullptr, &dir);
      const Process third = train_process(c, 3 * N, 3 * N, nullptr, &dir);
      std::vector<double> resumed = first.losses;
      resumed.insert(resumed.end(), second.losses.begin(), second.losses.end());
      resumed.insert(resumed.end(), third.losses.begin(), third.losses.end());
      CHECK(resumed == straight.losses);
      // Each load from a file gives back every byte the previous process saved (values, master,
      // both moments, the whole trainer state), and the end equals the straight run's.
      {
        INFO("loaded after step " << N);
        check_same(second.start, first.end);
      }
      {
        INFO("loaded after step " << 2 * N);
        check_same(third.start, second.end);
      }
      check_same(third.end, straight.end);
      std::filesystem::remove_all(dir);
    }
  }
}

TEST_CASE("a checkpoint of another model is refused naming the difference", "[train][checkpoint]") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("trainctl_refuse_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const Case fp32{"fp32", DType::f32, false, 4, {}};
  train_process(fp32, 4, 2, nullptr, &dir);
  const Case bf16{"bf16", DType::bf16, false, 4, {}};
  CHECK_THROWS_WITH(train_process(bf16, 4, 4, nullptr, &dir),
                    Catch::Contains("saved for another model: model storage is \"f32\" there but "
                                    "\"bf16\" in this recipe"));
  std::filesystem::remove_all(dir);
}
