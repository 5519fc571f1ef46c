// Rendering of the batch script; see sbatch.hpp for the contract.
#include "launch/sbatch.hpp"
#include "launch/store_address.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cctype>

namespace trainctl::launch {

namespace {

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
}

bool all_digits(std::string_view s) {
  return !s.empty() && s.size() <= 9 && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
}

// Splits at runs of spaces and tabs. Newlines are not separators: they are refused by the
// callers, because a newline inside an #SBATCH line or an export would start a new line.
std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> words;
  std::size_t at = 0;
  while (at < text.size()) {
    while (at < text.size() && (text[at] == ' ' || text[at] == '\t'))
      ++at;
    std::size_t end = at;
    while (end < text.size() && text[end] != ' ' && text[end] != '\t')
      ++end;
    if (end > at) words.push_back(text.substr(at, end - at));
    at = end;
  }
  return words;
}

// A character that is shown as is in messages; others (control characters) as \xNN.
std::string printable(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (std::isprint(static_cast<unsigned char>(c)))
      out += c;
    else
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
  }
  return out;
}

// Options the script sets itself: a second value from slurm.extra would silently win or break
// the save-and-requeue contract.
constexpr std::array<std::string_view, 14> kOwnOptions{
    "signal", "requeue", "no-requeue", "open-mode", "output", "error", "job-name",
    "nodes",  "ntasks",  "partition",  "account",   "qos",    "time",  "ntasks-per-node"};

// A path that appears in an #SBATCH line, which sbatch splits at spaces and reads quotes in,
// and where % starts a file name pattern.
void check_directive_path(const std::string& key, const std::string& path) {
  if (path.empty() || path.front() != '/')
    throw SbatchError(key, fmt::format("'{}' must be an absolute path", printable(path)));
  for (char c : path) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == '\'' || c == '"' || c == '%' ||
        c == '#' || c == '\\' || !std::isprint(static_cast<unsigned char>(c)))
      throw SbatchError(key, fmt::format("'{}' cannot be written in an #SBATCH --output line "
                                         "(spaces, quotes, '%', '#', '\\' and control characters "
                                         "are not allowed); choose another --run-dir",
                                         printable(path)));
  }
}

void check_absolute(const std::string& key, const std::string& path) {
  if (path.empty() || path.front() != '/')
    throw SbatchError(key, fmt::format("'{}' must be an absolute path", printable(path)));
  if (path.find('\0') != std::string::npos) throw SbatchError(key, "must not contain a NUL byte");
}

void validate(const SbatchJob& job) {
  // First: the other paths usually sit inside it, and its message says what to change.
  check_directive_path("run directory", job.run_dir);
  if (std::string why = check_slurm_name(job.job_name); !why.empty())
    throw SbatchError("name", why);
  for (auto [key, value] :
       {std::pair{"slurm.partition", &job.partition}, std::pair{"slurm.account", &job.account},
        std::pair{"slurm.qos", &job.qos}}) {
    if (value->empty()) continue;
    if (std::string why = check_slurm_name(*value); !why.empty()) throw SbatchError(key, why);
  }
  if (!job.time.empty())
    if (std::string why = check_slurm_time(job.time); !why.empty())
      throw SbatchError("slurm.time", why);
  if (job.nodes < 1) throw SbatchError("cluster.nodes", "must be at least 1");
  if (job.tasks_per_node < 1) throw SbatchError("parallel", "tasks per node must be at least 1");
  if (job.gpus_per_node < 0) throw SbatchError("cluster.gpus_per_node", "must be at least 0");
  if (job.signal_grace_s < 1 || job.signal_grace_s > 65535)
    throw SbatchError("slurm.signal_grace_s",
                      fmt::format("{} is outside Slurm's range [1, 65535]", job.signal_grace_s));
  if (job.max_requeues < 0) throw SbatchError("slurm.max_requeues", "must be at least 0");
  // Re-parsing the rendered forms proves they are what parse_* would accept.
  for (const std::string& option : job.extra_options)
    if (parse_extra_options(option).size() != 1)
      throw SbatchError("slurm.extra", fmt::format("'{}' is not one option", printable(option)));
  for (const auto& [name, value] : job.environment) {
    if (std::string why = check_env_name(name); !why.empty()) throw SbatchError("slurm.env", why);
    if (value.find('\0') != std::string::npos)
      throw SbatchError("slurm.env", fmt::format("{}: a value cannot hold a NUL byte", name));
  }
  check_absolute("trainctl binary", job.trainctl);
  check_absolute("recipe copy", job.recipe_copy);
  check_absolute("working directory", job.work_dir);
}

}  // namespace

SbatchError::SbatchError(std::string key, const std::string& message)
    : std::invalid_argument(fmt::format("{}: {}", key, message)),
      key_(std::move(key)),
      reason_(message) {}

std::string shell_quote(std::string_view value) {
  std::string out = "'";
  for (char c : value) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  out += '\'';
  return out;
}

std::string check_slurm_name(std::string_view value) {
  if (value.empty()) return "must not be empty";
  if (!std::all_of(value.begin(), value.end(), is_name_char))
    return fmt::format("'{}' may only use letters, digits, '_', '.' and '-'", printable(value));
  return "";
}

std::string check_slurm_time(std::string_view value) {
  if (value == "UNLIMITED" || value == "INFINITE" || value == "unlimited" || value == "infinite")
    return "";
  const std::string why = fmt::format(
      "'{}' is not a Slurm time: write MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS "
      "(digits only), or UNLIMITED",
      printable(value));
  std::string_view clock = value;
  if (auto dash = value.find('-'); dash != std::string_view::npos) {
    if (!all_digits(value.substr(0, dash))) return why;
    clock = value.substr(dash + 1);
  }
  std::vector<std::string_view> parts;
  std::size_t at = 0;
  while (true) {
    std::size_t colon = clock.find(':', at);
    parts.push_back(clock.substr(at, colon == std::string_view::npos ? colon : colon - at));
    if (colon == std::string_view::npos) break;
    at = colon + 1;
  }
  if (parts.size() > 3) return why;
  for (std::string_view part : parts)
    if (!all_digits(part)) return why;
  return "";
}

std::string check_env_name(std::string_view name) {
  const bool ok = !name.empty() && !std::isdigit(static_cast<unsigned char>(name.front())) &&
                  std::all_of(name.begin(), name.end(), [](char c) {
                    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
                  });
  if (!ok)
    return fmt::format("'{}' is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
                       printable(name));
  if (name.starts_with("SLURM_") || name == "PATH")
    return fmt::format("'{}' is set by Slurm or the system; the job must not override it",
                       printable(name));
  if (name == kEnvStoreSecret)
    return fmt::format(
        "{} is made fresh for each job by the batch script (a value here would "
        "be written into the script, readable as a file); leave it out",
        kEnvStoreSecret);
  return "";
}

std::vector<std::string> parse_extra_options(std::string_view text) {
  std::vector<std::string> options;
  if (text.find_first_of("\n\r") != std::string_view::npos)
    throw SbatchError("slurm.extra", "must be one line (a newline would start a new directive)");
  for (std::string_view word : split_words(text)) {
    const std::string shown = printable(word);
    if (!word.starts_with("--") || word.size() < 3)
      throw SbatchError(
          "slurm.extra",
          fmt::format("'{}' is not a long sbatch option (--name or --name=value)", shown));
    const std::size_t eq = word.find('=');
    const std::string_view name = word.substr(2, eq == std::string_view::npos ? eq : eq - 2);
    const bool name_ok = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
    });
    if (!name_ok)
      throw SbatchError("slurm.extra",
                        fmt::format("'{}': option names use a-z, 0-9 and '-'", shown));
    if (std::find(kOwnOptions.begin(), kOwnOptions.end(), name) != kOwnOptions.end())
      throw SbatchError("slurm.extra",
                        fmt::format("'{}': --{} is set by trainctl submit from the recipe (see "
                                    "docs/slurm.md); remove it from slurm.extra",
                                    shown, name));
    if (eq != std::string_view::npos) {
      const std::string_view value = word.substr(eq + 1);
      const bool value_ok = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) ||
               std::string_view("_.,:=@/+%-").find(c) != std::string_view::npos;
      });
      if (!value_ok)
        throw SbatchError(
            "slurm.extra",
            fmt::format("'{}': values may only use letters, digits and _.,:=@/+%-", shown));
    }
    options.emplace_back(word);
  }
  return options;
}

std::vector<std::pair<std::string, std::string>> parse_environment(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  if (text.find_first_of("\n\r") != std::string_view::npos)
    throw SbatchError("slurm.env", "must be one line of NAME=VALUE words");
  for (std::string_view word : split_words(text)) {
    const std::size_t eq = word.find('=');
    if (eq == std::string_view::npos)
      throw SbatchError("slurm.env", fmt::format("'{}' is not NAME=VALUE", printable(word)));
    std::string name(word.substr(0, eq));
    if (std::string why = check_env_name(name); !why.empty()) throw SbatchError("slurm.env", why);
    for (const auto& [earlier, unused] : out)
      if (earlier == name) throw SbatchError("slurm.env", fmt::format("{} is set twice", name));
    out.emplace_back(std::move(name), std::string(word.substr(eq + 1)));
  }
  return out;
}

std::string sbatch_log_pattern(const std::string& run_dir) {
  return run_dir + "/logs/slurm-%j.out";
}

namespace {

void check_tasks_per_node(const recipe::Recipe& recipe) {
  const int world = recipe.world_size();
  const int nodes = recipe.cluster.nodes;
  if (nodes < 1 || world % nodes != 0)
    throw SbatchError("cluster.nodes",
                      fmt::format("the {} ranks of the layout ({}) do not divide evenly over {} "
                                  "nodes; choose a node count that divides {}",
                                  world, recipe.parallel.degrees(), nodes, world));
}

}  // namespace

std::vector<SbatchError> check_slurm_recipe(const recipe::Recipe& recipe) {
  std::vector<SbatchError> problems;
  auto collect = [&](const auto& check) {
    try {
      check();
    } catch (const SbatchError& e) {
      problems.push_back(e);
    }
  };
  const recipe::SlurmConfig& slurm = recipe.slurm;
  for (auto [key, value] :
       {std::pair{"slurm.partition", &slurm.partition}, std::pair{"slurm.account", &slurm.account},
        std::pair{"slurm.qos", &slurm.qos}})
    if (!value->empty())
      if (std::string why = check_slurm_name(*value); !why.empty()) problems.emplace_back(key, why);
  if (!slurm.time.empty())
    if (std::string why = check_slurm_time(slurm.time); !why.empty())
      problems.emplace_back("slurm.time", why);
  collect([&] { parse_extra_options(slurm.extra); });
  collect([&] { parse_environment(slurm.env); });
  if (slurm.signal_grace_s < 1 || slurm.signal_grace_s > 65535)
    problems.emplace_back(
        "slurm.signal_grace_s",
        fmt::format("{} is outside Slurm's range [1, 65535]", slurm.signal_grace_s));
  if (slurm.max_requeues < 0) problems.emplace_back("slurm.max_requeues", "must be at least 0");
  if (!recipe.parallel.automatic) collect([&] { check_tasks_per_node(recipe); });
  return problems;
}

SbatchJob sbatch_job_from_recipe(const recipe::Recipe& recipe, const std::string& trainctl,
                                 const std::string& recipe_copy, const std::string& run_dir,
                                 const std::string& work_dir) {
  SbatchJob job;
  job.job_name = recipe.name;
  job.nodes = recipe.cluster.nodes;
  check_tasks_per_node(recipe);
  job.tasks_per_node = recipe.world_size() / job.nodes;
  job.gpus_per_node = recipe.cluster.gpus_per_node;
  job.partition = recipe.slurm.partition;
  job.account = recipe.slurm.account;
  job.qos = recipe.slurm.qos;
  job.time = recipe.slurm.time;
  job.extra_options = parse_extra_options(recipe.slurm.extra);
  job.environment = parse_environment(recipe.slurm.env);
  job.signal_grace_s = recipe.slurm.signal_grace_s;
  job.max_requeues = recipe.slurm.max_requeues;
  job.trainctl = trainctl;
  job.recipe_copy = recipe_copy;
  job.run_dir = run_dir;
  job.work_dir = work_dir;
  validate(job);
  return job;
}

std::string render_sbatch(const SbatchJob& job) {
  validate(job);
  std::string s = "#!/bin/bash\n";
  s +=
      "# Written by `trainctl submit` (docs/slurm.md). Change the recipe and submit again rather\n";
  s += "# than editing this file.\n";
  auto directive = [&](const std::string& option) { s += "#SBATCH " + option + "\n"; };
  directive("--job-name=" + job.job_name);
  directive(fmt::format("--nodes={}", job.nodes));
  directive(fmt::format("--ntasks-per-node={}", job.tasks_per_node));
  if (job.gpus_per_node > 0) directive(fmt::format("--gpus-per-node={}", job.gpus_per_node));
  if (!job.partition.empty()) directive("--partition=" + job.partition);
  if (!job.account.empty()) directive("--account=" + job.account);
  if (!job.qos.empty()) directive("--qos=" + job.qos);
  if (!job.time.empty()) directive("--time=" + job.time);
  directive(fmt::format("--signal=B:USR1@{}", job.signal_grace_s));
  directive("--requeue");
  directive("--open-mode=append");
  directive("--output=" + sbatch_log_pattern(job.run_dir));
  for (const std::string& option : job.extra_options)
    directive(option);

  s += "\nset -u\n";
  for (const auto& [name, value] : job.environment)
    s += fmt::format("export {}={}\n", name, shell_quote(value));
  s += fmt::format("trainctl={}\n", shell_quote(job.trainctl));
  s += fmt::format("recipe={}\n", shell_quote(job.recipe_copy));
  s += fmt::format("run_dir={}\n", shell_quote(job.run_dir));
  s += fmt::format("max_requeues={}\n", job.max_requeues);
  // The rest is fixed text: recipe values reach it only through the variables above, which
  // bash expands without reading them as code.
  s += R"SH(attempt="${SLURM_RESTART_COUNT:-0}"
say() { echo "trainctl-slurm: job ${SLURM_JOB_ID:-?} attempt ${attempt}: $*"; }
)SH";
  s += fmt::format("cd -- {} || {{ say \"cannot enter the submit directory\"; exit 1; }}\n",
                   shell_quote(job.work_dir));
  s += R"SH(
# Slurm signals this shell (--signal=B:USR1@N before the time limit, scancel --batch); srun
# passes the signal on to every rank, which finish the step, save and exit 75. The traps are set
# before the step starts so that an early signal is kept for it rather than killing this shell.
srun_pid=""
pending=""
forwarded=0
# shellcheck disable=SC2317  # run by the traps below
forward() {
  forwarded=1
  say "SIG$1 received: asking the ranks to save"
  if [[ -n "${srun_pid}" ]]; then
    kill -s "$1" "${srun_pid}" 2>/dev/null || true
  else
    pending="$1"
  fi
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

# The job's secret: the ranks prove with it that they belong to this job when they meet through
# rank 0's TCP store (cluster.shared_fs: false). Fresh for each attempt from the kernel's random
# source; srun hands it to the ranks in their environment, never in a file, argv or the log.
if [[ -z "${TRAINCTL_STORE_SECRET:-}" ]]; then
  TRAINCTL_STORE_SECRET="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"
  export TRAINCTL_STORE_SECRET
fi
if [[ ${#TRAINCTL_STORE_SECRET} -ne 64 ]]; then
  say "TRAINCTL_STORE_SECRET must be 64 hexadecimal digits (could /dev/urandom be read?)" >&2
  exit 1
fi

# When a rank ends, srun gives the others 30 s to end by themselves before it kills them: a rank
# whose peer died fails its next collective within milliseconds and prints which peer it lost,
# which an immediate --kill-on-bad-exit=1 would race and often cut off. A rank that hangs is
# still killed after the 30 s.
srun_options=(--kill-on-bad-exit=0 --wait=30)
# A checkpoint means an earlier attempt ran (a requeue, or Slurm restarting the job after a node
# failure): continue it. Otherwise start the run.
if compgen -G "${run_dir}/checkpoints/step_*" >/dev/null; then
  say "resuming ${run_dir}"
  srun "${srun_options[@]}" "${trainctl}" resume "${run_dir}" &
else
  say "starting ${run_dir}"
  srun "${srun_options[@]}" "${trainctl}" run "${recipe}" --run-dir "${run_dir}" &
fi
srun_pid=$!
if [[ -n "${pending}" ]]; then kill -s "${pending}" "${srun_pid}" 2>/dev/null || true; fi
while true; do
  forwarded=0
  wait "${srun_pid}"
  status=$?
  # A trapped signal interrupts wait; bash keeps the step's status for the next wait.
  ((forwarded)) || break
done

case "${status}" in
  0)
    say "finished"
    exit 0
    ;;
  75)
    if ((attempt >= max_requeues)); then
      say "saved after a signal, but the job was requeued ${attempt} times already (slurm.max_requeues ${max_requeues}): giving up; continue with: trainctl resume ${run_dir}" >&2
      exit 75
    fi
    say "saved after a signal: requeueing (requeue $((attempt + 1)) of ${max_requeues})"
    if ! scontrol requeue "${SLURM_JOB_ID}"; then
      say "scontrol requeue failed; continue with: trainctl resume ${run_dir}" >&2
      exit 75
    fi
    exit 0
    ;;
  *)
    say "training failed: the step exited with code ${status} (the rank's error is above); the job ends; continue with: trainctl resume ${run_dir}" >&2
    exit "${status}"
    ;;
esac
)SH";
  return s;
}

}  // namespace trainctl::launch
