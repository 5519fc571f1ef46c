// `trainctl lineage CKPT --seed N | --against CKPT2`: does the model of CKPT descend from the
// initialisation of seed N (a recipe's determinism.seed), or share an initialisation with the
// model of CKPT2? The statistic is lib/lineage's (lineage.hpp explains it; docs/lineage.md shows
// it on descendant and unrelated pairs). CKPT is a step directory, a checkpoints directory or a
// run directory (then its newest valid checkpoint, as `ckpt inspect` chooses it).
// Exit codes: 0 the test ran (whatever its verdict: see "descends" in --json), 1 a checkpoint is
// damaged, 2 bad input (no checkpoint there, a bad --seed, checkpoints of different models).
#include <fmt/core.h>

#include <charconv>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "checkpoint_path.hpp"
#include "ckpt/ckpt.hpp"
#include "commands.hpp"
#include "lineage/lineage.hpp"

namespace trainctl::app {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The step directory `path` names: itself, or the newest valid checkpoint of a checkpoints
// directory or of a run directory's checkpoints/.
fs::path locate(const std::string& path) {
  return select_step(resolve_checkpoint_path(path));
}

// --seed as a recipe's determinism.seed: an integer >= 0, used as the init's 64-bit seed the way
// the run uses it.
uint64_t parse_seed(const std::string& text) {
  int64_t seed = -1;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, seed);
  if (text.empty() || ec != std::errc() || ptr != end || seed < 0)
    throw BadInput(
        fmt::format("--seed {}: not an integer >= 0; give the determinism.seed of the recipe whose "
                    "initialisation to test (recipe.yaml in the run directory), e.g. --seed 1234",
                    text));
  return static_cast<uint64_t>(seed);
}

std::string describe_p(const lineage::Result& r) {
  if (r.p > 0) return fmt::format("{:.3g} (log10 p = {:.2f})", r.p, r.log10_p);
  return fmt::format("< 1e-308, below double precision (log10 p = {:.1f})", r.log10_p);
}

json to_json(const lineage::Result& r) {
  json tensors = json::array();
  for (const lineage::TensorStat& t : r.tensors)
    tensors.push_back({{"name", t.name},
                       {"elements", t.elements},
                       {"dof", t.dof},
                       {"r", t.r},
                       {"z", t.z},
                       {"used", t.dof > 0}});
  return {{"statistic", r.z},         {"p", r.p},
          {"log10_p", r.log10_p},     {"threshold", lineage::kThreshold},
          {"descends", r.descends()}, {"elements", r.elements},
          {"tensors", tensors}};
}

void print(const lineage::Result& r, const std::string& method, const std::string& subject,
           const std::string& against, const std::string& verdict) {
  int used = 0;
  const lineage::TensorStat* weakest = nullptr;
  for (const lineage::TensorStat& t : r.tensors)
    if (t.dof > 0) {
      ++used;
      if (!weakest || t.z < weakest->z) weakest = &t;
    }
  fmt::print("lineage of {}\n  against {}\n", subject, against);
  fmt::print("statistic  Z = {:.2f} ({} per tensor, Stouffer-combined)\n", r.z, method);
  fmt::print("p          {}\n", describe_p(r));
  fmt::print("used       {} normal-initialised tensors, {} elements", used, r.elements);
  if (weakest)
    fmt::print("; weakest {} (r = {:.3f}, z = {:.1f})", weakest->name, weakest->r, weakest->z);
  fmt::print("\nverdict    {}\n", verdict);
}

int lineage_test(const LineageOptions& options) {
  const bool by_seed = !options.seed.empty();
  if (by_seed == !options.against.empty())
    throw BadInput(
        "give one of --seed N (does CKPT descend from seed N's initialisation?) or --against "
        "CKPT2 (do the two share an initialisation?)");
  const uint64_t seed = by_seed ? parse_seed(options.seed) : 0;
  const fs::path step = locate(options.path);
  const fs::path other_step = by_seed ? fs::path() : locate(options.against);
  const auto reader = ckpt::CheckpointReader::open(step);
  const std::string subject = fmt::format("{} (step {})", step.string(), reader.step());
  const std::string threshold = fmt::format("p < {:g}", lineage::kThreshold);
  const std::string not_below = fmt::format("p >= {:g}", lineage::kThreshold);
  lineage::Result result;
  std::string against, verdict;
  json doc = {{"checkpoint", fs::absolute(step).lexically_normal().string()},
              {"step", reader.step()}};
  if (by_seed) {
    result = lineage::test_seed(reader, seed);
    against = fmt::format("the initialisation of seed {}", seed);
    verdict = result.descends()
                  ? fmt::format("descends from seed {} ({})", seed, threshold)
                  : fmt::format("no evidence of descent from seed {} ({})", seed, not_below);
    doc["seed"] = seed;
  } else {
    const auto other = ckpt::CheckpointReader::open(other_step);
    try {
      result = lineage::test_against(reader, other);
    } catch (const lineage::Incomparable& e) {
      throw BadInput(e.what());
    }
    against = fmt::format("{} (step {})", other_step.string(), other.step());
    verdict = result.descends()
                  ? fmt::format("shares an initialisation with it ({})", threshold)
                  : fmt::format("no evidence of a shared initialisation ({})", not_below);
    doc["against"] = fs::absolute(other_step).lexically_normal().string();
    doc["against_step"] = other.step();
  }
  if (options.json) {
    doc.update(to_json(result));
    doc["verdict"] = verdict;
    fmt::print("{}\n", doc.dump(2));
  } else {
    print(result,
          by_seed ? std::string("Fisher z of the double-centred correlation")
                  : fmt::format("double-centred cross-product against {} column permutations",
                                lineage::kPermutations),
          subject, against, verdict);
  }
  return kExitOk;
}

}  // namespace

int run_lineage(const LineageOptions& options) {
  try {
    return lineage_test(options);
  } catch (const BadInput& e) {
    fmt::print(stderr, "trainctl lineage: error: {}\n", e.what());
    return kExitBadInput;
  } catch (const std::exception& e) {
    fmt::print(stderr, "trainctl lineage: error: {}\n", e.what());
    return kExitFailure;
  }
}

}  // namespace trainctl::app
