// Resharding checkpoints: saved from one layout, loaded into any other. Every rank of a layout is
// built in this one process (build_param_table only needs the tp/ep degrees and ranks, which a
// shape-only communicator supplies), filled from a function of (buffer, name, GLOBAL index), saved
// through one multi-rank CheckpointWriter per rank, and read back into every rank of another
// layout. Loading is data movement only, so every element must come back bit for bit, and the
// manifest's checks (no overlap, full coverage) prove each element was written exactly once.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckpt_test_util.hpp"
#include "comm/comm.hpp"
#include "comm_test_util.hpp"
#include "data/sources.hpp"
#include "model/params.hpp"
#include "shape_only_communicator.hpp"
#include "train/checkpointing.hpp"

using namespace trainctl;
using ckpt::Range;
using ckpt_test::TempDir;
using model::IndexRange;
using model::ParamSpec;
using tensor::DType;
namespace fs = std::filesystem;

namespace {

using test_util::ShapeOnlyCommunicator;

struct LayoutCase {
  int tp = 1, ep = 1, dp = 1, pp = 1;
  int zero = 0;
  int world() const { return tp * ep * dp * pp; }
  std::string name() const {
    return "tp" + std::to_string(tp) + " ep" + std::to_string(ep) + " dp" + std::to_string(dp) +
           " pp" + std::to_string(pp) + " zero" + std::to_string(zero);
  }
};

// A model whose parameters use every kind of piece: GQA qkv rows (3 pieces), SwiGLU fc1 rows
// (2 pieces), row-parallel columns, experts, biases, a tied embedding copied to the last stage.
model::ModelConfig test_model(DType storage) {
  model::ModelConfig c;
  c.layers = 4;
  c.hidden = 16;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_hidden = 32;
  c.vocab = 32;
  c.seq_len = 8;
  c.activation = model::ActivationKind::swiglu;
  c.norm = model::NormKind::layernorm;
  c.bias = true;
  c.tied_embeddings = true;
  c.moe.experts = 4;
  c.moe.every = 2;
  c.storage = storage;
  return c;
}

// The value of element `global` of tensor prefix+name: distinct, exact in f32.
float expected_value(const std::string& prefix, const std::string& name, int64_t global) {
  uint64_t h = 1469598103934665603ull;
  for (char ch : prefix + name) {
    h ^= static_cast<unsigned char>(ch);
    h *= 1099511628211ull;
  }
  h ^= static_cast<uint64_t>(global) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  return static_cast<float>(h & 0xFFFFFF) / 1024.0f - 8192.0f;
}

void store_value(const tensor::Tensor& buffer, int64_t i, float value) {
  if (buffer.dtype == DType::bf16)
    buffer.as<tensor::bf16>()[i] = tensor::to_bf16(value);
  else
    buffer.as<float>()[i] = value;
}

float load_value(const tensor::Tensor& buffer, int64_t i) {
  return buffer.dtype == DType::bf16 ? tensor::to_float(buffer.as<tensor::bf16>()[i])
                                     : buffer.as<float>()[i];
}

// One rank of a layout: its communicators, coordinates and parameters.
struct RankModel {
  std::unique_ptr<ShapeOnlyCommunicator> tp, ep;
  train::SaveRole role;
  std::unique_ptr<model::ParamStore> params;
};

RankModel build_rank(backend::Backend& be, const model::ModelConfig& config, const LayoutCase& l,
                     int rank) {
  RankModel r;
  const int t = rank % l.tp, e = rank / l.tp % l.ep, d = rank / (l.tp * l.ep) % l.dp,
            p = rank / (l.tp * l.ep * l.dp);
  model::ModelParallel par;
  if (l.tp > 1) r.tp = std::make_unique<ShapeOnlyCommunicator>("tp", t, l.tp);
  if (l.ep > 1) r.ep = std::make_unique<ShapeOnlyCommunicator>("ep", e, l.ep);
  par.tp = r.tp.get();
  par.ep = r.ep.get();
  par.layout = {.tp = l.tp, .ep = l.ep, .dp = l.dp, .pp = l.pp, .zero = l.zero};
  par.at = {.tp = t, .ep = e, .dp = d, .pp = p};
  r.role = {t, e, d, l.zero >= 1};
  r.params = std::make_unique<model::ParamStore>(be, model::build_param_table(config, par),
                                                 config.storage, par.zero_parts(), par.zero_rank(),
                                                 par.shard_grads(), par.shard_values());
  return r;
}

// The buffers of a store with their name prefixes and first flat element.
struct NamedBuffer {
  std::string prefix;
  tensor::Tensor tensor;
  int64_t begin;
};
// ZeRO-3: the part's values and the outer regions (a load must fill both).
std::vector<NamedBuffer> named_buffers(const model::ParamStore& p) {
  std::vector<NamedBuffer> out;
  if (!p.values_sharded()) {
    out.push_back({"model/", p.values(), 0});
  } else {
    out.push_back({"model/", p.value_part(), p.optimizer_begin()});
    for (size_t r = 0; r < p.outer_regions().size(); ++r)
      out.push_back({"model/", p.outer_values(r), p.outer_regions()[r].begin});
  }
  if (p.has_master()) out.push_back({"master/", p.master(), p.optimizer_begin()});
  out.push_back({"adam_m/", p.moment1(), p.optimizer_begin()});
  out.push_back({"adam_v/", p.moment2(), p.optimizer_begin()});
  return out;
}

// Calls f(buffer, index in buffer, expected value) for every element this rank holds.
template <class F>
void for_each_element(const model::ParamStore& p, F f) {
  for (const NamedBuffer& b : named_buffers(p))
    for (const ParamSpec& spec : p.table().specs())
      for (int64_t i = 0; i < spec.shape.numel(); ++i) {
        const int64_t flat = spec.offset + i;
        if (flat < b.begin || flat >= b.begin + b.tensor.numel()) continue;
        f(b.tensor, flat - b.begin, expected_value(b.prefix, spec.name, spec.global_index(i)));
      }
}

void save_layout(backend::Backend& be, const model::ModelConfig& config, const LayoutCase& l,
                 const fs::path& dir, int64_t step) {
  std::vector<RankModel> ranks;
  std::vector<std::unique_ptr<ckpt::CheckpointWriter>> writers;
  for (int rank = 0; rank < l.world(); ++rank) {
    ranks.push_back(build_rank(be, config, l, rank));
    for_each_element(*ranks.back().params,
                     [](const tensor::Tensor& b, int64_t i, float v) { store_value(b, i, v); });
    ckpt::CheckpointWriter::Options o;
    o.rank = rank;
    o.world_size = l.world();
    o.save_id = "reshard";
    o.timeout = std::chrono::seconds(20);
    writers.push_back(std::make_unique<ckpt::CheckpointWriter>(dir, o));
  }
  for (int rank = 0; rank < l.world(); ++rank) {
    ckpt::SaveRequest request;
    request.header.step = step;
    request.header.layout = {{"tp", l.tp}, {"ep", l.ep}, {"dp", l.dp}, {"pp", l.pp}};
    train::add_param_tensors(request, *ranks[static_cast<size_t>(rank)].params,
                             ranks[static_cast<size_t>(rank)].role, be);
    writers[static_cast<size_t>(rank)]->save(std::move(request));
  }
  for (auto& w : writers)
    w->wait();
}

// Loads the checkpoint into every rank of `l` and counts the elements that differ.
int64_t mismatches_after_load(backend::Backend& be, const model::ModelConfig& config,
                              const LayoutCase& l, const fs::path& step_dir) {
  const ckpt::CheckpointReader reader = ckpt::CheckpointReader::open(step_dir);
  int64_t wrong = 0;
  for (int rank = 0; rank < l.world(); ++rank) {
    RankModel r = build_rank(be, config, l, rank);
    for (const NamedBuffer& b : named_buffers(*r.params))
      std::memset(b.tensor.data, 0xff, b.tensor.bytes());  // NaN: anything not loaded shows
    train::read_param_tensors(reader, *r.params, be);
    for_each_element(*r.params, [&](const tensor::Tensor& b, int64_t i, float v) {
      const float want = b.dtype == DType::bf16 ? tensor::to_float(tensor::to_bf16(v)) : v;
      const float got = load_value(b, i);
      if (std::memcmp(&got, &want, sizeof got) != 0) ++wrong;
    });
  }
  return wrong;
}

// ---- whole jobs: real meshes, models and trainers in forked ranks ----

model::ModelConfig job_model() {
  model::ModelConfig c = model::llama_preset();
  c.layers = 2;
  c.hidden = 16;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_hidden = 32;
  c.vocab = 32;
  c.seq_len = 8;
  c.moe.experts = 0;
  c.tied_embeddings = true;
  return c;
}

// A job of the tests below: trains on `layout` with ZeRO stage `zero`, then saves, or loads a
// checkpoint and optionally trains on to the end.
struct Job {
  comm::Layout layout;  // world size 1: one rank without a mesh
  int zero = 0;
  int global_batch = 4;
  int steps = 2;      // the run's length (its LR schedule)
  bool save = false;  // train to `stop_after` (0: the end), then save that step
  int stop_after = 0;
  fs::path load_dir;         // else load this checkpoint
  bool train_after = false;  // and train to the end
};

train::TrainConfig job_train_config(const Job& job) {
  train::TrainConfig t;
  t.steps = job.steps;
  t.global_batch = job.global_batch;
  t.micro_batch = 1;
  t.optimizer = {train::OptimizerName::adamw, 3e-3, {0.9, 0.95}, 1e-8, 0.1, 1.0};
  t.schedule = {1, train::DecayKind::cosine, 3e-4, 0.2, job.steps};
  t.zero = job.zero;
  return t;
}

// Every element a ParamStore holds: "<prefix><name>" -> global index -> value (as f32 bits).
using Elements = std::map<std::string, std::map<int64_t, float>>;

void collect(const model::ParamStore& p, Elements& out) {
  for (const NamedBuffer& b : named_buffers(p))
    for (const ParamSpec& spec : p.table().specs())
      for (int64_t i = 0; i < spec.shape.numel(); ++i) {
        const int64_t flat = spec.offset + i;
        if (flat < b.begin || flat >= b.begin + b.tensor.numel()) continue;
        out[b.prefix + spec.name][spec.global_index(i)] = load_value(b.tensor, flat - b.begin);
      }
}

void write_elements(const std::string& path, const Elements& e) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& [name, values] : e)
    for (const auto& [index, value] : values) {
      const auto length = static_cast<uint32_t>(name.size());
      out.write(reinterpret_cast<const char*>(&length), sizeof length);
      out.write(name.data(), length);
      out.write(reinterpret_cast<const char*>(&index), sizeof index);
      out.write(reinterpret_cast<const char*>(&value), sizeof value);
    }
  if (!out) throw std::runtime_error("cannot write " + path);
}

// Merges the ranks' dumps named `kind`; replicas of one element must agree bit for bit.
Elements merge_dumps(const std::string& dir, int world, const std::string& kind = "dump") {
  Elements all;
  for (int r = 0; r < world; ++r) {
    std::ifstream in(dir + "/" + kind + "_" + std::to_string(r) + ".bin", std::ios::binary);
    uint32_t length = 0;
    while (in.read(reinterpret_cast<char*>(&length), sizeof length)) {
      std::string name(length, '\0');
      int64_t index = 0;
      float value = 0;
      in.read(name.data(), length);
      in.read(reinterpret_cast<char*>(&index), sizeof index);
      in.read(reinterpret_cast<char*>(&value), sizeof value);
      auto [it, added] = all[name].emplace(index, value);
      if (!added && std::memcmp(&it->second, &value, sizeof value) != 0)
        throw std::runtime_error("replicas of " + name + " differ");
    }
  }
  return all;
}

Elements with_state(const model::Transformer& m, const train::Trainer& trainer) {
  Elements mine;
  collect(m.params(), mine);
  const train::TrainerState state = trainer.state();
  mine["state/step"][0] = static_cast<float>(state.step);
  mine["state/sampler_position"][0] = static_cast<float>(state.sampler.position);
  mine["state/optimizer_updates"][0] = static_cast<float>(state.optimizer_updates);
  return mine;
}

// One rank of `job`: dumps every element it holds and its trainer state after saving or loading
// (dump_<rank>.bin), and when it trains after loading, again at the end (final_<rank>.bin) and
// the losses of the steps it trained (rank 0: losses.txt, one per line).
int job_rank(const Job& job, const std::string& dir, int rank, const std::string& name) {
  std::unique_ptr<comm::FileStore> base;
  std::unique_ptr<comm::PrefixStore> store;
  std::optional<comm::Mesh> mesh;
  const train::TrainConfig tc = job_train_config(job);
  model::ModelParallel parallel;
  parallel.layout.zero = job.zero;
  if (job.layout.world_size() > 1) {
    base = std::make_unique<comm::FileStore>(dir + "/store");
    store = std::make_unique<comm::PrefixStore>(comm::job_store(*base, name, 0));
    mesh.emplace(comm::Mesh::create(*store, job.layout.world_size(), rank, job.layout,
                                    comm::MeshOptions{.timeout = std::chrono::seconds(30)}));
    parallel = model::ModelParallel::from_mesh(*mesh, job.zero);
    parallel.activation_slots = trainctl::pipeline_slots(parallel.pp_size(), parallel.pp_rank(),
                                                         tc.accum_steps(mesh->dp_ep().size()));
  }
  const model::ModelConfig config = job_model();
  auto be = backend::make_cpu_backend();
  const data::SyntheticSource source(11, config.vocab, 1 << 14);
  data::Sampler sampler(source, config.seq_len, 3, true, config.vocab);
  model::Transformer m(config, *be, tc.micro_batch, parallel);
  m.params().initialize(1234);
  train::Trainer trainer(tc, m, *be, sampler, nullptr, mesh ? &*mesh : nullptr);
  std::vector<double> losses;
  const auto train_to = [&](int last) {
    trainer.run([&](const train::StepMetrics& step) {
      losses.push_back(step.loss);
      return step.step < last;
    });
  };
  if (job.save) {
    train_to(job.stop_after > 0 ? job.stop_after : job.steps);
    ckpt::CheckpointWriter::Options o;
    o.rank = rank;
    o.world_size = job.layout.world_size();
    o.save_id = name;
    o.timeout = std::chrono::seconds(30);
    ckpt::CheckpointWriter writer(dir + "/checkpoints", o);
    writer.reserve(train::capture_bytes(m, trainer));
    writer.save(train::capture_checkpoint(writer.new_request(), m, trainer, *be, "hash",
                                          {{"world_size", job.layout.world_size()}}));
    writer.wait();
  } else {
    train::restore_checkpoint(ckpt::CheckpointReader::open(job.load_dir), m, trainer, *be);
  }
  write_elements(dir + "/dump_" + std::to_string(rank) + ".bin", with_state(m, trainer));
  if (job.train_after) {
    train_to(job.steps);
    write_elements(dir + "/final_" + std::to_string(rank) + ".bin", with_state(m, trainer));
  }
  if (rank == 0) {
    std::ofstream out(dir + "/losses.txt");
    for (double loss : losses)
      out << std::setprecision(17) << loss << '\n';
  }
  if (mesh) mesh->world().barrier();
  return 0;
}

struct JobOutput {
  Elements elements;  // after saving or loading
  Elements final;     // after training on (train_after)
  std::vector<double> losses;
};

JobOutput run(const Job& job, const std::string& dir, const std::string& name) {
  fs::create_directories(dir + "/store");
  const int world = job.layout.world_size();
  for (int r = 0; r < world; ++r)
    for (const char* kind : {"dump_", "final_"})
      fs::remove(dir + "/" + kind + std::to_string(r) + ".bin");
  comm_test::RunOptions options;
  options.deadline = std::chrono::seconds(120);
  const auto status = comm_test::run_ranks(
      world, [&](int rank) { return job_rank(job, dir, rank, name); }, options);
  if (status != std::vector<int>(static_cast<size_t>(world), 0))
    throw std::runtime_error("job " + name + " on " + job.layout.to_string() + " failed");
  JobOutput out{merge_dumps(dir, world), {}, {}};
  if (job.train_after) out.final = merge_dumps(dir, world, "final");
  std::ifstream in(dir + "/losses.txt");
  for (double loss = 0; in >> loss;)
    out.losses.push_back(loss);
  return out;
}

Elements run_job(const comm::Layout& layout, int zero, const std::string& dir,
                 const std::string& name, bool save, const fs::path& load_dir = {}) {
  Job job;
  job.layout = layout;
  job.zero = zero;
  job.save = save;
  job.load_dir = load_dir;
  return run(job, dir, name).elements;
}

// Every element of `saved` is in `loaded` with the same bits (and nothing else is).
void check_same_elements(const Elements& saved, const Elements& loaded) {
  CHECK(loaded.size() == saved.size());
  for (const auto& [name, values] : saved) {
    INFO(name);
    REQUIRE(loaded.count(name));
    CHECK(loaded.at(name).size() == values.size());
    size_t differ = 0;
    for (const auto& [index, value] : values) {
      const auto it = loaded.at(name).find(index);
      if (it == loaded.at(name).end() || std::memcmp(&it->second, &value, sizeof value) != 0)
        ++differ;
    }
    CHECK(differ == 0);
  }
}

}  // namespace

TEST_CASE("param_boxes maps local rows through the pieces to global boxes", "[train]") {
  ParamSpec spec;
  spec.name = "w";
  spec.global_shape = {10, 4};
  spec.pieces = {{IndexRange{0, 2}, IndexRange{5, 7}, IndexRange{8, 9}}, {IndexRange{1, 3}}};
  spec.shape = {5, 2};
  const auto boxes = train::param_boxes(spec, 1, 4);
  REQUIRE(boxes.size() == 2);
  CHECK(boxes[0].global == std::vector<Range>{{1, 2}, {1, 3}});
  CHECK(boxes[0].local == std::vector<Range>{{1, 2}, {0, 2}});
  CHECK(boxes[1].global == std::vector<Range>{{5, 7}, {1, 3}});
  CHECK(boxes[1].local == std::vector<Range>{{2, 4}, {0, 2}});
  CHECK(train::param_boxes(spec, 0, 5).size() == 3);
  CHECK(train::param_boxes(spec, 2, 2).empty());
  // Two pieces along a later dimension: every combination is its own box.
  spec.global_shape = {3, 8};
  spec.pieces = {{IndexRange{0, 3}}, {IndexRange{0, 1}, IndexRange{4, 6}}};
  spec.shape = {3, 3};
  const auto columns = train::param_boxes(spec, 0, 3);
  REQUIRE(columns.size() == 2);
  CHECK(columns[1].global == std::vector<Range>{{0, 3}, {4, 6}});
  CHECK(columns[1].local == std::vector<Range>{{0, 3}, {1, 3}});
}

TEST_CASE("the save roles write each replicated box once", "[train]") {
  ParamSpec replicated, tp_split, expert, tied;
  tp_split.tp_sharded = true;
  expert.expert = true;
  tied.tied_copy = tied.tp_sharded = true;
  const train::SaveRole first{0, 0, 0, false}, tp1{1, 0, 0, false}, ep1{0, 1, 0, false},
      dp1{0, 0, 1, false}, dp1_zero{0, 0, 1, true};
  CHECK(first.writes_values(replicated));
  CHECK_FALSE(tp1.writes_values(replicated));
  CHECK(tp1.writes_values(tp_split));
  CHECK_FALSE(ep1.writes_values(replicated));
  CHECK(ep1.writes_values(expert));
  CHECK_FALSE(dp1.writes_values(expert));
  CHECK_FALSE(dp1.writes_part(replicated));
  CHECK_FALSE(dp1_zero.writes_values(replicated));
  CHECK(dp1_zero.writes_part(replicated));
  CHECK_FALSE(first.writes_values(tied));
  CHECK_FALSE(first.writes_part(tied));
}

TEST_CASE("a checkpoint saved on any layout loads bit-identically into any other", "[train]") {
  const DType storage = GENERATE(DType::f32, DType::bf16);
  const model::ModelConfig config = test_model(storage);
  auto be = backend::make_cpu_backend();
  const std::vector<LayoutCase> layouts{
      {},               // one rank
      {2, 1, 1, 1, 0},  // tp2
      {1, 1, 2, 1, 1},  // dp2 zero1
      {2, 1, 2, 1, 1},  // dp2 x tp2 zero1
      {1, 2, 1, 2, 0},  // ep2 x pp2 (tied copy on the last stage)
      {2, 2, 1, 1, 0},  // ep2 x tp2
      {1, 1, 4, 1, 1},  // dp4 zero1: parts of unequal size
      {2, 1, 2, 2, 1},  // dp2 x tp2 x pp2 zero1
      {1, 2, 2, 1, 1},  // ep2 x dp2 zero1: each ep rank's part holds its own experts
      {1, 1, 3, 1, 3},  // dp3 zero3: the values are the parts (and the outer regions, whole)
      {2, 1, 2, 2, 3},  // dp2 x tp2 x pp2 zero3 (the tied copy in the last stage's outer region)
      {1, 2, 2, 1, 3},  // ep2 x dp2 zero3
  };
  const auto single = model::build_param_table(config);
  for (const LayoutCase& from : layouts) {
    TempDir tmp;
    save_layout(*be, config, from, tmp.path, 7);
    const fs::path step_dir = tmp.path / "step_00000007";
    INFO("saved on " << from.name() << ", storage " << tensor::dtype_name(storage));
    REQUIRE(ckpt::scan(tmp.path).newest_valid() != nullptr);
    const ckpt::CheckpointReader reader = ckpt::CheckpointReader::open(step_dir);
    reader.verify();
    // The manifest describes the whole model: every parameter once, with its global shape.
    const size_t buffers = storage == DType::bf16 ? 4 : 3;
    CHECK(reader.manifest().tensors.size() == buffers * single.specs().size());
    const auto& wte = reader.tensor("model/embed.wte");
    CHECK(wte.shape == std::vector<int64_t>{config.vocab, config.hidden});
    for (const LayoutCase& to : layouts) {
      INFO("loaded on " << to.name());
      CHECK(mismatches_after_load(*be, config, to, step_dir) == 0);
    }
  }
}

TEST_CASE("a checkpoint of another global shape is refused naming the tensor", "[train]") {
  auto be = backend::make_cpu_backend();
  model::ModelConfig config = test_model(DType::f32);
  TempDir tmp;
  save_layout(*be, config, {2, 1, 1, 1, 0}, tmp.path, 3);
  config.ffn_hidden = 64;
  const fs::path step_dir = tmp.path / "step_00000003";
  CHECK_THROWS_AS(mismatches_after_load(*be, config, {}, step_dir), train::CheckpointMismatch);
  CHECK_THROWS_WITH(
      mismatches_after_load(*be, config, {}, step_dir),
      Catch::Contains(
          "layers.0.mlp.fc1.weight is f32 [64, 16] in the checkpoint but f32 [128, 16]"));
}

TEST_CASE("a job saved at dp2 x tp2 with ZeRO-1 resumes bit-identically at pp2 and on one rank",
          "[train]") {
  const comm_test::TempDir tmp;
  comm::Layout dp2_tp2;
  dp2_tp2.tp = 2;
  dp2_tp2.dp = 2;
  const Elements saved = run_job(dp2_tp2, 1, tmp.path, "save", true);
  const fs::path step_dir = fs::path(tmp.path) / "checkpoints" / "step_00000002";
  REQUIRE(ckpt::scan(fs::path(tmp.path) / "checkpoints").newest_valid()->step == 2);
  const ckpt::CheckpointReader reader = ckpt::CheckpointReader::open(step_dir);
  reader.verify();
  CHECK(reader.manifest().files.size() == 4);
  CHECK(saved.at("state/step").at(0) == 2.0f);
  CHECK(saved.at("state/sampler_position").at(0) == 8.0f);  // 2 steps of 4 sequences

  comm::Layout pp2;
  pp2.pp = 2;
  check_same_elements(saved, run_job(pp2, 0, tmp.path, "load", false, step_dir));

  // One rank, no mesh.
  auto be = backend::make_cpu_backend();
  const model::ModelConfig config = job_model();
  const train::TrainConfig tc = job_train_config(Job{});
  const data::SyntheticSource source(11, config.vocab, 1 << 14);
  data::Sampler sampler(source, config.seq_len, 3, true, config.vocab);
  model::Transformer m(config, *be, tc.micro_batch);
  train::Trainer trainer(tc, m, *be, sampler, nullptr);
  train::restore_checkpoint(reader, m, trainer, *be);
  Elements single;
  collect(m.params(), single);
  CHECK(trainer.state().sampler.position == 8);
  CHECK(trainer.state().step == 2);
  size_t compared = 0;
  for (const auto& [name, values] : single) {
    INFO(name);
    REQUIRE(saved.count(name));
    REQUIRE(saved.at(name).size() == values.size());
    for (const auto& [index, value] : values) {
      const float want = saved.at(name).at(index);
      CHECK(std::memcmp(&want, &value, sizeof value) == 0);
      ++compared;
    }
  }
  CHECK(compared == static_cast<size_t>(3 * m.params().values().numel()));
}

// ZeRO-2's checkpoints are layout-free like the others: the optimizer part is saved as ZeRO-1's
// (gradients are never saved), so a dp2 ZeRO-2 job resumes at dp4 with ZeRO-1 and at pp2 without
// ZeRO, and a ZeRO-1 job resumes at dp4 with ZeRO-2.
TEST_CASE("a job saved at dp2 with ZeRO-2 resumes bit-identically at dp4 ZeRO-1 and pp2, and back",
          "[train]") {
  const comm_test::TempDir tmp;
  comm::Layout dp2, dp4, pp2;
  dp2.dp = 2;
  dp4.dp = 4;
  pp2.pp = 2;
  const std::string zero2_dir = tmp.path + "/zero2", zero1_dir = tmp.path + "/zero1";
  const Elements saved = run_job(dp2, 2, zero2_dir, "save", true);
  const fs::path step_dir = fs::path(zero2_dir) / "checkpoints" / "step_00000002";
  ckpt::CheckpointReader::open(step_dir).verify();
  CHECK(saved.at("state/step").at(0) == 2.0f);
  {
    INFO("dp2 ZeRO-2 -> dp4 ZeRO-1");
    check_same_elements(saved, run_job(dp4, 1, zero2_dir, "load_dp4", false, step_dir));
  }
  {
    INFO("dp2 ZeRO-2 -> pp2");
    check_same_elements(saved, run_job(pp2, 0, zero2_dir, "load_pp2", false, step_dir));
  }
  const Elements saved_zero1 = run_job(dp2, 1, zero1_dir, "save", true);
  {
    INFO("dp2 ZeRO-1 -> dp4 ZeRO-2");
    check_same_elements(saved_zero1,
                        run_job(dp4, 2, zero1_dir, "load_dp4", false,
                                fs::path(zero1_dir) / "checkpoints" / "step_00000002"));
  }
  // Both jobs trained the same model on the same data: ZeRO-2 and ZeRO-1 equal to rounding.
  for (const auto& [name, values] : saved_zero1)
    if (name.starts_with("model/"))
      for (const auto& [index, value] : values)
        CHECK(saved.at(name).at(index) == Approx(value).margin(1e-5));
}

// ZeRO-3 saves each dp rank's part of the values (nothing else writes them): a dp2 ZeRO-3 job
// stopped after step 2 of 4 loads bit for bit at dp3 with ZeRO-1 and on one rank without ZeRO, and
// both train on like the job that never stopped (losses within 1e-5, weights within 1e-5 of
// each tensor's largest magnitude: other layouts add in another order). And back: a dp3 ZeRO-1
// job stopped the same way resumes at dp2 with ZeRO-3.
TEST_CASE(
    "a job saved at dp2 with ZeRO-3 resumes at dp3 ZeRO-1 and on one rank as if it never "
    "stopped, and back",
    "[train]") {
  const comm_test::TempDir tmp;
  Job base;
  base.global_batch = 12;  // dp2 and dp3 both split it
  base.steps = 4;
  Job full = base;
  full.layout.dp = 2;
  full.zero = 3;
  full.save = true;
  const JobOutput uninterrupted = run(full, tmp.path + "/full", "full");
  REQUIRE(uninterrupted.losses.size() == 4);
  const auto continues = [&](const JobOutput& out) {
    REQUIRE(out.losses.size() == 2);
    for (size_t k = 0; k < 2; ++k)
      CHECK(out.losses[k] == Approx(uninterrupted.losses[2 + k]).epsilon(1e-5));
    CHECK(out.final.at("state/step").at(0) == 4.0f);
    for (const auto& [name, values] : uninterrupted.elements) {
      if (!name.starts_with("model/")) continue;
      INFO(name);
      float largest = 0, difference = 0;
      for (const auto& [index, value] : values) {
        largest = std::max(largest, std::abs(value));
        difference = std::max(difference, std::abs(out.final.at(name).at(index) - value));
      }
      CHECK(difference <= 1e-5f * largest);
    }
  };
  const auto stopped_at_2 = [&](Job job, const std::string& name) {
    job.save = true;
    job.stop_after = 2;
    const JobOutput saved = run(job, tmp.path + "/" + name, "save");
    REQUIRE(saved.losses.size() == 2);
    return saved;
  };

  const JobOutput saved = stopped_at_2(full, "zero3");
  // The same job up to the stop: the same bits.
  CHECK(saved.losses ==
        std::vector<double>(uninterrupted.losses.begin(), uninterrupted.losses.begin() + 2));
  const fs::path step_dir = fs::path(tmp.path) / "zero3" / "checkpoints" / "step_00000002";
  ckpt::CheckpointReader::open(step_dir).verify();
  Job dp3 = base;
  dp3.layout.dp = 3;
  dp3.zero = 1;
  for (const auto& [name, target] : {std::pair{"dp3 ZeRO-1", dp3}, std::pair{"one rank", base}}) {
    INFO("dp2 ZeRO-3 -> " << name);
    Job resume = target;
    resume.load_dir = step_dir;
    resume.train_after = true;
    const JobOutput out = run(resume, tmp.path + "/zero3", std::string("load ") + name);
    check_same_elements(saved.elements, out.elements);
    continues(out);
  }
  {
    INFO("dp3 ZeRO-1 -> dp2 ZeRO-3");
    const JobOutput saved_zero1 = stopped_at_2(dp3, "zero1");
    Job resume = full;
    resume.save = false;
    resume.load_dir = fs::path(tmp.path) / "zero1" / "checkpoints" / "step_00000002";
    resume.train_after = true;
    const JobOutput out = run(resume, tmp.path + "/zero1", "load");
    check_same_elements(saved_zero1.elements, out.elements);
    continues(out);
  }
}
