// `trainctl diff RUN_A RUN_B`: why two runs' losses differ. Compares what made each run (its
// provenance.json, lib/run/provenance.hpp, and its resolved recipe) and what it measured
// (metrics.jsonl, summary.json), then says, most likely cause first, what differs and changes the
// numbers, and where the losses part; or that nothing that changes the numbers differs, so the
// runs should be bit-identical, and whether they are.
//
// The causes, in the order they are ranked: recipe keys that change the computation (the
// learning rate, the model...), the seed, the data (by the digests of its tokens, not its file
// names), the layout (reduction orders), the BLAS thread count and the environment variables
// that change results, the binary (commit, dirty tree, compiler, libraries), the hardware (CPU
// model, device, GPUs). A run made of several attempts contributes each attempt's values.
#include <fmt/core.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "run/provenance.hpp"

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

namespace trainctl::app {

namespace {

struct BadRun : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RunRecord {
  std::string label;  // as given on the command line
  ordered_json segments;
  std::map<std::string, std::string> recipe;  // flattened: "optimizer.lr" -> "0.001"
  std::map<int64_t, double> loss;
  std::map<int64_t, double> val_loss;
  std::string fingerprint;  // summary.json's weights_fingerprint; "" when the run did not finish
};

void flatten(const YAML::Node& node, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  if (node.IsMap()) {
    for (const auto& item : node)
      flatten(item.second,
              prefix.empty() ? item.first.as<std::string>()
                             : prefix + "." + item.first.as<std::string>(),
              out);
    return;
  }
  YAML::Emitter text;
  text << YAML::Flow << node;
  out[prefix] = text.c_str();
}

std::string read_text(const fs::path& path, const std::string& label) {
  std::ifstream in(path);
  if (!in)
    throw BadRun(fmt::format("{} has no {} (is {} a run directory?)", label,
                             path.filename().string(), label));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

RunRecord load_run(const std::string& label) {
  const fs::path dir(label);
  if (!fs::is_directory(dir))
    throw BadRun(fmt::format("{} is not a directory; give two run directories", label));
  RunRecord run;
  run.label = label;
  const fs::path provenance = dir / run::kProvenanceFile;
  if (!fs::exists(provenance))
    throw BadRun(fmt::format(
        "{} has no {}: it was made by a trainctl older than provenance records, or is not a "
        "run directory; resume it with this trainctl, or compare runs made by it",
        label, run::kProvenanceFile));
  try {
    const ordered_json j = ordered_json::parse(read_text(provenance, label));
    if (j.value("version", 0) != run::kProvenanceVersion || !j.at("segments").is_array() ||
        j.at("segments").empty())
      throw BadRun(fmt::format("{}: not a version-{} provenance record with segments",
                               provenance.string(), run::kProvenanceVersion));
    run.segments = j.at("segments");
  } catch (const nlohmann::json::exception& e) {
    throw BadRun(fmt::format("{}: not readable JSON ({})", provenance.string(), e.what()));
  }
  try {
    flatten(YAML::Load(read_text(dir / "recipe.yaml", label)), "", run.recipe);
  } catch (const YAML::Exception& e) {
    throw BadRun(
        fmt::format("{}: not readable YAML ({})", (dir / "recipe.yaml").string(), e.what()));
  }
  std::istringstream metrics(read_text(dir / "metrics.jsonl", label));
  std::string line;
  for (int number = 1; std::getline(metrics, line); ++number) {
    if (line.empty()) continue;
    try {
      const ordered_json record = ordered_json::parse(line);
      if (record.contains("event")) continue;  // the stability guard's, not a step's
      // A step's last record counts: a rollback repeats the steps after its snapshot.
      const int64_t step = record.at("step").get<int64_t>();
      run.loss[step] = record.at("loss").get<double>();
      if (record.contains("val_loss")) run.val_loss[step] = record["val_loss"].get<double>();
    } catch (const nlohmann::json::exception& e) {
      throw BadRun(fmt::format("{}:{}: not a metrics record ({})", (dir / "metrics.jsonl").string(),
                               number, e.what()));
    }
  }
  std::ifstream summary(dir / "summary.json");
  if (summary) try {
      run.fingerprint = ordered_json::parse(summary).value("weights_fingerprint", "");
    } catch (const nlohmann::json::exception&) {
      // A run's summary is written whole (atomically); an unreadable one is simply not used.
    }
  return run;
}

// Each attempt's value of the field at `pointer` ("/trainctl/commit"), in attempt order, without
// repeats: one value for a run made by one binary, more when attempts differ.
std::vector<std::string> values(const RunRecord& run, const std::string& pointer) {
  std::vector<std::string> out;
  for (const ordered_json& segment : run.segments) {
    const ordered_json::json_pointer p(pointer);
    const std::string v =
        segment.contains(p)
            ? (segment.at(p).is_string() ? segment.at(p).get<std::string>() : segment.at(p).dump())
            : "(not recorded)";
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v)
    out += out.empty() ? s : " then " + s;
  return out;
}

struct Cause {
  std::string kind;
  std::string detail;
};

// Recipe keys that cannot change a run's numbers (what is saved, printed and named) and those
// compared through provenance instead (the layout, the seed, the data, the device).
bool outside_the_numbers(const std::string& key) {
  return key == "name" || key.starts_with("logging.") || key.starts_with("checkpoint.");
}
bool compared_elsewhere(const std::string& key) {
  return key.starts_with("parallel.") || key.starts_with("cluster.") || key == "determinism.seed" ||
         key == "data.path" || key == "data.val_path" || key == "data.sources";
}

class Comparison {
 public:
  Comparison(const RunRecord& a, const RunRecord& b) : a_(a), b_(b) {}

  // Fields of provenance compared as they are (`label`: how the output names them).
  void field(const std::string& kind, const std::string& pointer, const std::string& label) {
    const auto va = values(a_, pointer), vb = values(b_, pointer);
    if (va != vb) causes_.push_back({kind, fmt::format("{}: {} vs {}", label, join(va), join(vb))});
  }

  void recipe() {
    std::set<std::string> keys;
    for (const auto* run : {&a_, &b_})
      for (const auto& [key, value] : run->recipe)
        keys.insert(key);
    for (const std::string& key : keys) {
      const auto ia = a_.recipe.find(key), ib = b_.recipe.find(key);
      const std::string va = ia == a_.recipe.end() ? "(absent)" : ia->second;
      const std::string vb = ib == b_.recipe.end() ? "(absent)" : ib->second;
      if (va == vb || compared_elsewhere(key)) continue;
      if (outside_the_numbers(key))
        unchanged_.push_back(fmt::format("{} ({} vs {})", key, va, vb));
      else
        causes_.push_back({"recipe", fmt::format("{}: {} vs {}", key, va, vb)});
    }
  }

  // The data by its content: digests and token counts (file names alone change nothing).
  void data() {
    const auto content = [](const RunRecord& run) {
      std::vector<std::string> out;
      for (const ordered_json& segment : run.segments) {
        std::string v;
        for (const ordered_json& part : segment.value("data", ordered_json::array())) {
          const bool digested = !part["train_digest"].is_null();
          v += fmt::format("{}{} (weight {}, {} + {} tokens{})", v.empty() ? "" : "; ",
                           digested ? "tokens " + part["train_digest"].get<std::string>()
                                    : part["source"].get<std::string>(),
                           part["weight"].dump(), part["train_tokens"].dump(),
                           part["val_tokens"].dump(),
                           part["val_digest"].is_null()
                               ? ""
                               : ", validation " + part["val_digest"].get<std::string>());
        }
        if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
      }
      return out;
    };
    const auto va = content(a_), vb = content(b_);
    if (va != vb)
      causes_.push_back({"data", fmt::format("{} vs {}", join(va), join(vb))});
    else if (values(a_, "/data") != values(b_, "/data"))
      unchanged_.push_back("the data's files (the same tokens from other paths)");
  }

  void hostname() {
    if (values(a_, "/host/hostname") != values(b_, "/host/hostname"))
      unchanged_.push_back("the host name");
  }

  const std::vector<Cause>& causes() const { return causes_; }
  const std::vector<std::string>& unchanged() const { return unchanged_; }

 private:
  const RunRecord& a_;
  const RunRecord& b_;
  std::vector<Cause> causes_;
  std::vector<std::string> unchanged_;
};

struct LossComparison {
  int64_t common = 0;                 // steps both runs recorded
  std::optional<int64_t> first_step;  // the first of them whose losses differ
  double a = 0, b = 0;
  int64_t differing = 0;
};

LossComparison compare_losses(const RunRecord& a, const RunRecord& b) {
  LossComparison out;
  for (const auto& [step, loss] : a.loss) {
    const auto other = b.loss.find(step);
    if (other == b.loss.end()) continue;
    ++out.common;
    if (loss == other->second) continue;
    ++out.differing;
    if (!out.first_step) {
      out.first_step = step;
      out.a = loss;
      out.b = other->second;
    }
  }
  return out;
}

std::string describe_run(const RunRecord& run) {
  const ordered_json& last = run.segments.back();
  const auto binary = [](const ordered_json& s) {
    const ordered_json& t = s.value("trainctl", ordered_json::object());
    return fmt::format("trainctl {} {} ({})", t.value("version", "?"),
                       t.value("commit", "unknown").substr(0, 12), t.value("tree", "?"));
  };
  return fmt::format("{}: {} loss records, {} attempt{}, last by {}", run.label, run.loss.size(),
                     run.segments.size(), run.segments.size() == 1 ? "" : "s", binary(last));
}

}  // namespace

int run_diff(const DiffOptions& options) {
  RunRecord a, b;
  try {
    a = load_run(options.run_a);
    b = load_run(options.run_b);
  } catch (const BadRun& e) {
    return bad_input("diff", e.what());
  }

  Comparison c(a, b);
  c.recipe();
  c.field("seed", "/seed", "determinism.seed");
  c.data();
  c.field("layout", "/layout", "parallel layout");
  c.field("threads", "/backend/blas_threads", "BLAS threads");
  c.field("threads", "/environment", "environment");
  c.field("binary", "/trainctl", "trainctl");
  c.field("binary", "/libraries", "libraries");
  c.field("hardware", "/backend/device", "device");
  c.field("hardware", "/backend/gpus", "GPUs");
  c.field("hardware", "/host/cpu", "CPU");
  c.hostname();
  const LossComparison losses = compare_losses(a, b);
  const bool identical = losses.common > 0 && !losses.first_step;
  const bool same_weights = !a.fingerprint.empty() && a.fingerprint == b.fingerprint;

  if (options.json) {
    ordered_json causes = ordered_json::array();
    for (const Cause& cause : c.causes())
      causes.push_back({{"kind", cause.kind}, {"detail", cause.detail}});
    ordered_json j = {{"run_a", a.label},
                      {"run_b", b.label},
                      {"causes", causes},
                      {"no_effect", c.unchanged()},
                      {"expected_identical", c.causes().empty()},
                      {"common_steps", losses.common},
                      {"identical", identical},
                      {"first_difference", nullptr},
                      {"weights", {{"a", a.fingerprint}, {"b", b.fingerprint}}}};
    if (losses.first_step)
      j["first_difference"] = {{"step", *losses.first_step}, {"a", losses.a}, {"b", losses.b}};
    fmt::print("{}\n", j.dump(2));
    return identical ? kExitOk : kExitFailure;
  }

  fmt::print("{}\n{}\n", describe_run(a), describe_run(b));
  if (c.causes().empty()) {
    fmt::print(
        "Nothing that changes the numbers differs (recipe, seed, data, layout, threads, binary, "
        "hardware): the runs should be bit-identical");
  } else {
    fmt::print("Why their numbers differ, most likely first:\n");
    for (size_t i = 0; i < c.causes().size(); ++i)
      fmt::print("  {}. {}: {}\n", i + 1, c.causes()[i].kind, c.causes()[i].detail);
  }
  if (!c.unchanged().empty()) {
    std::string list;
    for (const std::string& u : c.unchanged())
      list += list.empty() ? u : ", " + u;
    fmt::print("{}Differ without changing the numbers: {}\n", c.causes().empty() ? "\n" : "", list);
  }
  const std::string weights =
      a.fingerprint.empty() || b.fingerprint.empty()
          ? ""
          : fmt::format("; final weights {} ({} vs {})", same_weights ? "identical" : "differ",
                        a.fingerprint, b.fingerprint);
  if (losses.common == 0) {
    fmt::print("{}Losses: no step in common\n",
               c.causes().empty() ? ", and no step to compare\n" : "");
    return kExitFailure;
  }
  const std::string verdict =
      identical
          ? fmt::format("identical at all {} common steps{}", losses.common, weights)
          : fmt::format(
                "first differ at step {}: {} vs {} ({:.3g} relative); {} of {} "
                "common steps differ{}",
                *losses.first_step, losses.a, losses.b,
                std::abs(losses.a - losses.b) / std::max(std::abs(losses.a), std::abs(losses.b)),
                losses.differing, losses.common, weights);
  if (c.causes().empty())
    fmt::print(", and they {}: {}\n", identical ? "are" : "are NOT", verdict);
  else
    fmt::print("Losses: {}\n", verdict);
  return identical ? kExitOk : kExitFailure;
}

}  // namespace trainctl::app
