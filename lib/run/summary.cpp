#include "run/summary.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "files/files.hpp"
#include "planner/planner.hpp"
#include "train/checkpointing.hpp"

namespace trainctl::run {

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

uint64_t fnv1a64(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text)
    h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

nlohmann::json layout_json(const recipe::Recipe& r) {
  nlohmann::json j{{"zero", r.parallel.zero}, {"world_size", r.world_size()}};
  for (const Layout::AxisInfo& a : kAxes)
    j[std::string(a.name)] = r.parallel.*a.degree;
  return j;
}

std::string weights_fingerprint(RunContext& run) {
  const model::ParamStore& params = run.model().params();
  // The elements this rank saves (SaveRole): of the whole values, or of its part (ZeRO-3).
  const bool sharded = params.values_sharded();
  const tensor::Tensor values = sharded ? params.value_part() : params.values();
  const int64_t begin = sharded ? params.optimizer_begin() : 0, end = begin + values.numel();
  std::vector<unsigned char> host(values.bytes());
  run.backend().copy_to_host(host.data(), values);
  const size_t width = tensor::dtype_size(params.storage());
  const train::SaveRole role = train::save_role(run.model(), run.trainer());
  uint64_t sum = 0;
  for (const model::ParamSpec& spec : params.table().specs()) {
    if (!(sharded ? role.writes_part(spec) : role.writes_values(spec))) continue;
    const uint64_t name = fnv1a64(spec.name);
    const int64_t lo = std::max(spec.offset, begin);
    const int64_t hi = std::min(spec.offset + spec.shape.numel(), end);
    for (int64_t i = lo - spec.offset; i < hi - spec.offset; ++i) {
      uint64_t bits = 0;
      std::memcpy(&bits, host.data() + static_cast<size_t>(spec.offset + i - begin) * width, width);
      const uint64_t index = static_cast<uint64_t>(spec.global_index(i));
      sum += mix64(name ^ mix64(index) ^ mix64(bits ^ 0x9e3779b97f4a7c15ull));
    }
  }
  if (comm::Mesh* mesh = run.mesh()) {
    comm::Communicator& world = mesh->world();
    std::vector<uint64_t> sums(static_cast<size_t>(world.size()));
    world.all_gather(&sum, sums.data(), sizeof sum);
    sum = 0;
    for (uint64_t s : sums)
      sum += s;
  }
  return fmt::format("{:016x}", sum);
}

telemetry::MemoryReport memory_report(RunContext& run) {
  const model::ParamStore::Bytes pb = run.model().params().bytes();
  telemetry::MemoryReport memory;
  memory.params = pb.params;
  memory.grads = pb.grads;
  memory.optimizer = pb.optimizer + run.trainer().optimizer_bytes();
  memory.activations = run.model().activation_bytes().total();
  memory.comm = run.trainer().comm_buffer_bytes() + (run.mesh() ? run.mesh()->buffer_bytes() : 0);
  return memory;
}

telemetry::MemoryReport planned_memory(RunContext& run) {
  const recipe::Recipe& r = run.recipe();
  const planner::Variant layout = planner::recipe_layout(r);
  // The memory model asks of the cluster only whether it has GPUs (Gloo's staging on a CPU, the
  // CUDA context's overhead on a GPU).
  topology::ClusterSpec cluster = planner::cpu_machine();
  if (run.on_cuda()) cluster.gpus_per_node = std::max(1, run.local_world_size());
  const planner::MemoryEstimate m =
      planner::estimate_rank_memory(r, cluster, layout, run.model().parallel().at);
  auto bytes = [](double b) { return static_cast<uint64_t>(std::llround(b)); };
  telemetry::MemoryReport planned;
  planned.params = bytes(m.params);
  planned.grads = bytes(m.grads);
  planned.optimizer = bytes(m.optimizer);
  planned.activations = bytes(m.activations);
  planned.comm = bytes(m.comm_buffers);
  planned.other = bytes(m.overhead);
  return planned;
}

void write_summary(const SessionInput& input, RunContext& run, StepReporter& report,
                   double seconds) {
  const recipe::Recipe& r = input.loaded.recipe;
  const StepTotals& totals = report.totals();
  const train::StepMetrics& last = totals.last;
  const telemetry::MemoryReport memory = memory_report(run);
  const telemetry::MemoryReport planned = planned_memory(run);
  const int64_t start_step = run.start_step();
  const double tokens_per_s = static_cast<double>(int64_t{r.training.global_batch} *
                                                  r.model.seq_len * (last.step - start_step)) /
                              seconds;
  const std::string fingerprint = weights_fingerprint(run);
  if (run.leader()) {
    nlohmann::json summary{{"steps", last.step},
                           {"final_loss", last.loss},
                           {"tokens", last.tokens},
                           {"seconds", seconds},
                           {"tokens_per_s", tokens_per_s},
                           {"skipped_steps", totals.skipped},
                           {"stability_events", totals.stability_events},
                           {"resumed_from_step", start_step},
                           {"weights_fingerprint", fingerprint},
                           {"memory_bytes", memory.to_json()},
                           {"memory_planned_bytes", planned.to_json()},
                           {"forward_flops_per_token", run.model().forward_flops_per_token()}};
    if (run.multi()) summary["layout"] = layout_json(r);
    if (totals.last_val) summary["final_val_loss"] = *totals.last_val;
    files::write_file_atomically(input.run_dir / "summary.json", summary.dump(2) + "\n");
  }
  report.say(fmt::format(
      "done: {} steps in {} | loss {:.4f}{} | {} tokens/s | weights {}", last.step,
      telemetry::format_duration(seconds), last.loss,
      totals.last_val ? fmt::format(" | val_loss {:.4f}", *totals.last_val) : std::string(),
      telemetry::format_count(static_cast<uint64_t>(tokens_per_s)), fingerprint));
  report.say(std::string(run.multi() ? "peak memory of this rank by category"
                                     : "peak memory by category") +
             " (planned: trainctl plan's memory model of this rank):\n" +
             memory.to_string(planned));
}

}  // namespace trainctl::run
