// `trainctl submit RECIPE`: everything that can be wrong (recipe, Slurm values, run directory, no
// sbatch) is checked before anything is written; then the run directory gets the resolved recipe
// and the batch script, and sbatch gets the script.
#include "commands.hpp"

#include <fmt/core.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "ckpt/ckpt.hpp"
#include "commands.hpp"
#include "files/files.hpp"
#include "launch/sbatch.hpp"
#include "plan_auto.hpp"
#include "planner/planner.hpp"
#include "recipe/schema.hpp"
#include "run/session.hpp"
#include "topology/topology.hpp"

extern char** environ;

namespace fs = std::filesystem;

namespace trainctl::app {

namespace {

const char* const kCommand = "submit";

// The first `program` on PATH that this user may run.
std::optional<fs::path> find_on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::string_view rest = path ? path : "";
  while (true) {
    const std::size_t colon = rest.find(':');
    const std::string_view folder = rest.substr(0, colon);
    const fs::path candidate = fs::path(folder.empty() ? "." : folder) / program;
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate)) return candidate;
    if (colon == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(colon + 1);
  }
}

struct Completed {
  int status = -1;  // exit code, or -1 when it did not exit normally
  std::string out;  // stdout; stderr goes straight to ours
};

Completed run_program(const fs::path& program, const std::vector<std::string>& args) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0)
    throw std::runtime_error(
        fmt::format("pipe for {}: {}", program.string(), std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  std::vector<char*> argv;
  std::string program_name = program.string();
  argv.push_back(program_name.data());
  std::vector<std::string> copies = args;
  for (std::string& a : copies)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  Completed done;
  if (spawned != 0) {
    ::close(pipe_fds[0]);
    throw std::runtime_error(
        fmt::format("cannot start {}: {}", program.string(), std::strerror(spawned)));
  }
  char buffer[4096];
  ssize_t n = 0;
  while ((n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) done.out.append(buffer, static_cast<std::size_t>(n));
  ::close(pipe_fds[0]);
  int raw = 0;
  while (::waitpid(pid, &raw, 0) < 0 && errno == EINTR) {
  }
  done.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return done;
}

// Atomic (files/files.hpp): a full disk leaves an earlier script of the run as it was.
void write_text(const fs::path& path, const std::string& text) {
  files::write_file_atomically(path, text);
}

}  // namespace

int run_submit(const SubmitOptions& options) {
  recipe::LoadedRecipe loaded;
  try {
    loaded = recipe::load_recipe_with_origins(options.recipe_path, options.overrides);
  } catch (const recipe::RecipeError& e) {
    return report_problems(e.problems(), options.recipe_path);
  }
  recipe::Recipe& r = loaded.recipe;
  // parallel: auto -> the planner's layout for the allocation the job asks for: cluster.nodes
  // nodes of cluster.gpus_per_node GPUs (hardware from cluster.file: this host is not one of
  // them), or for CPU nodes --ranks ranks spread over them. Planned here, so the job's recipe
  // (submit_recipe.yaml) holds the layout and every task runs the same one.
  if (r.parallel.automatic) {
    AutoWorld world;
    world.nodes = r.cluster.nodes;
    if (r.cluster.device == recipe::Device::cuda) {
      if (r.cluster.gpus_per_node < 1 || r.cluster.file.empty())
        return report_problems(
            {loaded.origins.problem(
                r.cluster.file.empty() ? "cluster.file" : "cluster.gpus_per_node",
                "parallel: auto under submit plans for the GPUs the job asks for, which this "
                "host cannot detect: set cluster.gpus_per_node and describe the nodes with "
                "cluster.file (configs/clusters/*.yaml)")},
            options.recipe_path);
      world.per_node = r.cluster.gpus_per_node;
      world.gpus = true;
    } else {
      if (options.ranks < 1 || options.ranks % r.cluster.nodes != 0)
        return bad_input(
            kCommand,
            fmt::format("parallel: auto on CPU nodes plans for the ranks the job asks for: pass "
                        "--ranks N with N a multiple of cluster.nodes = {}{}",
                        r.cluster.nodes,
                        options.ranks > 0 ? fmt::format(" (got --ranks {})", options.ranks)
                                          : std::string()));
      world.per_node = options.ranks / r.cluster.nodes;
    }
    world.world = world.nodes * world.per_node;
    world.why = fmt::format("submit: {} task{} on {} node{}", world.world,
                            world.world == 1 ? "" : "s", world.nodes, world.nodes == 1 ? "" : "s");
    try {
      const std::string note = resolve_parallel_auto(r, world);
      std::fprintf(stderr, "trainctl submit: %s\n", note.c_str());
    } catch (const planner::PlanError& e) {
      return bad_input(kCommand, e.what());
    } catch (const topology::ClusterError& e) {
      return bad_input(kCommand, e.what());
    }
  } else if (options.ranks > 0 && options.ranks != r.world_size()) {
    return bad_input(kCommand,
                     fmt::format("--ranks {} sets the world that parallel: auto plans for, but "
                                 "this recipe's layout is explicit ({} = {})",
                                 options.ranks, r.parallel.world_formula(), r.world_size()));
  }

  // Every bad slurm.* value at once, at the line (or --set) that wrote it, as validate shows them.
  if (const auto slurm_problems = launch::check_slurm_recipe(r); !slurm_problems.empty()) {
    std::vector<recipe::Problem> problems;
    for (const launch::SbatchError& e : slurm_problems)
      problems.push_back(loaded.origins.problem(e.key(), e.reason()));
    return report_problems(problems, options.recipe_path);
  }

  fs::path run_dir =
      fs::absolute(options.run_dir.empty() ? fs::path("runs") / r.name : fs::path(options.run_dir))
          .lexically_normal();
  if (!run_dir.has_filename()) run_dir = run_dir.parent_path();  // "runs/x/" -> "runs/x"
  const fs::path recipe_copy = run_dir / "submit_recipe.yaml";
  const fs::path script_path = run_dir / "submit.sbatch";

  launch::SbatchJob job;
  try {
    job = launch::sbatch_job_from_recipe(r, fs::read_symlink("/proc/self/exe").string(),
                                         recipe_copy.string(), run_dir.string(),
                                         fs::current_path().string());
  } catch (const launch::SbatchError& e) {
    const std::string message = e.what();
    if (recipe::find_key(e.key()) != nullptr)
      return report_problems({loaded.origins.problem(e.key(), e.reason())}, options.recipe_path);
    return bad_input(kCommand, message);
  }
  const std::string script = launch::render_sbatch(job);
  if (options.dry_run) {
    std::fputs(script.c_str(), stdout);
    return kExitOk;
  }

  // The same rules as `trainctl run` for a directory that already holds a run: the job would
  // otherwise resume (or refuse) something the user did not mean to touch.
  const ckpt::ScanReport checkpoints = ckpt::scan(run_dir / "checkpoints");
  if (!checkpoints.entries.empty() && r.checkpoint.resume != recipe::Resume::automatic)
    return bad_input(kCommand,
                     fmt::format("run directory {} holds checkpoints (newest: {}); choose another "
                                 "--run-dir, or set checkpoint.resume: auto to continue that run "
                                 "in the job",
                                 run_dir.string(), checkpoints.entries.front().name));
  if (checkpoints.entries.empty() && fs::exists(run_dir / "metrics.jsonl"))
    return bad_input(kCommand, fmt::format("run directory {} already holds a run (metrics.jsonl); "
                                           "choose another with --run-dir",
                                           run_dir.string()));
  const std::optional<fs::path> sbatch = find_on_path("sbatch");
  if (!sbatch)
    return bad_input(kCommand,
                     "sbatch is not on PATH: install Slurm's client tools (Debian: slurm-client) "
                     "on this machine, or start a single-machine Slurm with `scripts/slurm-local "
                     "up` and export the SLURM_CONF it prints; `trainctl submit --dry-run` prints "
                     "the batch script without Slurm");

  fs::create_directories(run_dir / "logs");
  write_text(recipe_copy, recipe::dump_recipe(r));
  write_text(script_path, script);
  const Completed submitted = run_program(*sbatch, {"--parsable", script_path.string()});
  // --parsable prints "JOBID" or "JOBID;CLUSTER".
  std::string job_id = submitted.out.substr(0, submitted.out.find_first_of(";\n"));
  if (submitted.status != 0 || job_id.empty()) {
    std::fprintf(stderr,
                 "trainctl submit: error: sbatch refused %s (exit code %d; its message is above); "
                 "the script and the recipe stay in %s\n",
                 script_path.c_str(), submitted.status, run_dir.c_str());
    return kExitFailure;
  }
  std::string log = launch::sbatch_log_pattern(run_dir.string());
  log.replace(log.find("%j"), 2, job_id);
  std::printf("submitted job %s, run directory %s, log %s\n", job_id.c_str(), run_dir.c_str(),
              log.c_str());
  return kExitOk;
}

}  // namespace trainctl::app
