// The batch script of `trainctl submit` (launch/sbatch.hpp): directives from the recipe, the
// checks that refuse what Slurm or a shell would misread, and the script's behaviour, run by bash
// with a fake srun and scontrol on PATH (the real ones are tested in tests/integration/slurm_*).
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "launch/sbatch.hpp"
#include "recipe/recipe.hpp"

namespace fs = std::filesystem;
using namespace trainctl;
using launch::SbatchError;

namespace {

const std::string kBase =
    "name: job1\ndata: {source: synthetic}\n"
    "model: {layers: 2, hidden: 64, heads: 4, vocab: 256, seq_len: 32}\n"
    "training: {global_batch: 8, micro_batch: 2}\n";

recipe::Recipe recipe_with(const std::string& extra_yaml) {
  return recipe::parse_recipe(kBase + extra_yaml, "r.yaml");
}

launch::SbatchJob job_of(const recipe::Recipe& r, const std::string& run_dir = "/runs/job1") {
  return launch::sbatch_job_from_recipe(r, "/opt/bin/trainctl", run_dir + "/submit_recipe.yaml",
                                        run_dir, "/home/u");
}

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

// The key named by the SbatchError that `render` throws ("" when it throws none).
template <class F>
std::string rejected_key(F render) {
  try {
    render();
  } catch (const SbatchError& e) {
    return e.key();
  }
  return "";
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "trainctl-sbatch-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

void write_file(const fs::path& path, const std::string& text, bool executable = false) {
  std::ofstream(path) << text;
  if (executable) fs::permissions(path, fs::perms::owner_all, fs::perm_options::add);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `command` with bash; returns its exit status (-1 when it did not exit normally).
int run_bash(const std::string& command) {
  const std::string line = "bash -c " + launch::shell_quote(command) + " >/dev/null 2>&1";
  const int raw = std::system(line.c_str());
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

// A directory with the script and fakes of srun and scontrol that record what they were given.
// The fake srun exits with $FAKE_SRUN_EXIT, or with 75 on USR1 when FAKE_SRUN_WAIT is set (it
// then writes `ready` first, so the test knows the trap is in place).
struct FakeSlurm {
  TempDir dir;
  fs::path bin = dir.path / "bin", run_dir = dir.path / "run", script = dir.path / "job.sbatch";
  explicit FakeSlurm(const launch::SbatchJob& job_template) {
    fs::create_directories(bin);
    fs::create_directories(run_dir);
    write_file(bin / "srun",
               "#!/bin/bash\n"
               "printf '%s\\n' \"$@\" > \"$FAKE_DIR/srun.args\"\n"
               "printf '%s' \"${ODD-unset}\" > \"$FAKE_DIR/srun.env\"\n"
               "printf '%s' \"${TRAINCTL_STORE_SECRET-unset}\" > \"$FAKE_DIR/srun.secret\"\n"
               "if [ -n \"${FAKE_SRUN_WAIT:-}\" ]; then\n"
               "  trap 'echo usr1 > \"$FAKE_DIR/srun.signal\"; exit 75' USR1\n"
               "  touch \"$FAKE_DIR/ready\"\n"
               "  while true; do sleep 0.05; done\n"
               "fi\n"
               "exit \"${FAKE_SRUN_EXIT:-0}\"\n",
               true);
    write_file(bin / "scontrol",
               "#!/bin/bash\nprintf '%s\\n' \"$@\" > \"$FAKE_DIR/scontrol.args\"\n", true);
    launch::SbatchJob job = job_template;
    job.run_dir = run_dir.string();
    job.work_dir = dir.path.string();
    write_file(script, launch::render_sbatch(job));
  }
  // Runs the script as Slurm would (SLURM_JOB_ID set), with the fakes first on PATH.
  int run(const std::string& env = "") const {
    return run_bash(env + " FAKE_DIR=" + launch::shell_quote(dir.path.string()) +
                    " SLURM_JOB_ID=4242 PATH=" + launch::shell_quote(bin.string()) +
                    ":\"$PATH\" bash " + launch::shell_quote(script.string()));
  }
  std::string file(const std::string& name) const { return read_file(dir.path / name); }
  bool exists(const std::string& name) const { return fs::exists(dir.path / name); }
};

}  // namespace

TEST_CASE("the script asks for the layout's tasks, signal, requeue, append and the log path",
          "[sbatch]") {
  const recipe::Recipe r = recipe_with(
      "parallel: {dp: 2, tp: 2}\ncluster: {nodes: 2, gpus_per_node: 2}\n"
      "slurm: {partition: gpu, account: proj-1, qos: high, time: '1-02:00:00', "
      "signal_grace_s: 90, extra: '--exclusive --mem=0'}\n");
  const std::string s = launch::render_sbatch(job_of(r));
  CHECK(s.starts_with("#!/bin/bash\n"));
  for (const char* line :
       {"#SBATCH --job-name=job1", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2",
        "#SBATCH --gpus-per-node=2", "#SBATCH --partition=gpu", "#SBATCH --account=proj-1",
        "#SBATCH --qos=high", "#SBATCH --time=1-02:00:00", "#SBATCH --signal=B:USR1@90",
        "#SBATCH --requeue", "#SBATCH --open-mode=append",
        "#SBATCH --output=/runs/job1/logs/slurm-%j.out", "#SBATCH --exclusive", "#SBATCH --mem=0",
        "run_dir='/runs/job1'", "trainctl='/opt/bin/trainctl'"}) {
    INFO(line);
    CHECK(has_line(s, line));
  }
}

TEST_CASE("defaults: no partition, account, qos, time or GPU lines; USR1 120 s early", "[sbatch]") {
  const std::string s = launch::render_sbatch(job_of(recipe_with("")));
  CHECK(has_line(s, "#SBATCH --nodes=1"));
  CHECK(has_line(s, "#SBATCH --ntasks-per-node=1"));
  CHECK(has_line(s, "#SBATCH --signal=B:USR1@120"));
  CHECK(has_line(s, "max_requeues=3"));
  for (const char* absent : {"--partition", "--account", "--qos", "--time", "--gpus-per-node"}) {
    INFO(absent);
    CHECK(s.find(absent) == std::string::npos);
  }
}

TEST_CASE("ranks that do not divide over the nodes are refused at cluster.nodes", "[sbatch]") {
  const recipe::Recipe r = recipe_with("parallel: {dp: 2, tp: 2}\ncluster: {nodes: 3}\n");
  CHECK_THROWS_WITH(job_of(r), Catch::Contains("cluster.nodes") && Catch::Contains("4 ranks") &&
                                   Catch::Contains("3 nodes"));
}

TEST_CASE("names Slurm reads (partition, account, qos) are letters, digits, _ . - only",
          "[sbatch]") {
  for (const char* key : {"partition", "account", "qos"}) {
    for (const char* bad : {"$(touch x)", "a b", "`id`", "a'b", "a;b", "a\nb", "gpu,cpu"}) {
      INFO(key << " = " << bad);
      recipe::Recipe r = recipe_with("");
      std::string* field = std::string(key) == "partition" ? &r.slurm.partition
                           : std::string(key) == "account" ? &r.slurm.account
                                                           : &r.slurm.qos;
      *field = bad;
      CHECK(rejected_key([&] { job_of(r); }) == std::string("slurm.") + key);
    }
  }
}

TEST_CASE("slurm.time takes Slurm's formats and nothing else", "[sbatch]") {
  for (const char* good : {"30", "30:00", "02:30:00", "1-0", "1-12:00", "2-00:00:00", "UNLIMITED"})
    CHECK(launch::check_slurm_time(good).empty());
  for (const char* bad : {"1h", "1:2:3:4", "$(date)", "-1", "1-", ":30", "1 -2", "10:\n"}) {
    INFO(bad);
    CHECK_FALSE(launch::check_slurm_time(bad).empty());
    recipe::Recipe r = recipe_with("");
    r.slurm.time = bad;
    CHECK(rejected_key([&] { job_of(r); }) == "slurm.time");
  }
}

TEST_CASE("slurm.extra: long options with plain values; shell syntax and our own options refused",
          "[sbatch]") {
  CHECK(launch::parse_extra_options(" --exclusive \t --mem=0 ") ==
        std::vector<std::string>{"--exclusive", "--mem=0"});
  for (const char* bad : {"--comment=$(id)", "--x=`id`", "exclusive", "-N 2", "--mem=0\n#SBATCH",
                          "--constraint=a|b", "--x='y'", "--signal=USR2@10", "--time=5",
                          "--output=/tmp/x", "--no-requeue", "--Exclusive"}) {
    INFO(bad);
    CHECK_THROWS_AS(launch::parse_extra_options(bad), SbatchError);
    recipe::Recipe r = recipe_with("");
    r.slurm.extra = bad;
    CHECK(rejected_key([&] { job_of(r); }) == "slurm.extra");
  }
}

TEST_CASE("slurm.env: names are checked, values are kept byte for byte", "[sbatch]") {
  const auto env = launch::parse_environment("A=1 B_2=$(id) C=x=y D=");
  REQUIRE(env.size() == 4);
  CHECK(env[1] == std::pair<std::string, std::string>{"B_2", "$(id)"});
  CHECK(env[2].second == "x=y");
  CHECK(env[3].second.empty());
  for (const char* bad : {"1A=x", "A-B=x", "NOEQUALS", "A=1 A=2", "SLURM_NTASKS=3", "PATH=/x",
                          "TRAINCTL_STORE_SECRET=0123", "A=1\nB=2", "$(id)=1"}) {
    INFO(bad);
    CHECK_THROWS_AS(launch::parse_environment(bad), SbatchError);
  }
}

TEST_CASE("a run directory sbatch would misread in --output is refused, naming it", "[sbatch]") {
  const recipe::Recipe r = recipe_with("");
  for (const char* bad : {"/runs/a b", "/runs/a%j", "/runs/a'b", "relative/run", "/runs/a\nb"}) {
    INFO(bad);
    CHECK(rejected_key([&] { job_of(r, bad); }) == "run directory");
  }
}

TEST_CASE("shell_quote: bash reads every value back exactly", "[sbatch]") {
  TempDir dir;
  for (const std::string& value :
       {std::string("plain"), std::string("it's"), std::string("$(touch PWNED)"),
        std::string("`touch PWNED`"), std::string("a\"b\\c"), std::string("two\nlines"),
        std::string("'; touch PWNED; '"), std::string(""), std::string("$HOME ${x} !! *")}) {
    INFO(value);
    const fs::path out = dir.path / "out";
    CHECK(run_bash("cd " + launch::shell_quote(dir.path.string()) + " && printf %s " +
                   launch::shell_quote(value) + " > out") == 0);
    CHECK(read_file(out) == value);
    CHECK_FALSE(fs::exists(dir.path / "PWNED"));
  }
}

TEST_CASE("the rendered script is valid bash", "[sbatch]") {
  TempDir dir;
  recipe::Recipe r = recipe_with("slurm: {env: \"X=$(id) Y=`id` Z='q\\\"\"}\n");
  write_file(dir.path / "job.sbatch", launch::render_sbatch(job_of(r)));
  CHECK(run_bash("bash -n " + launch::shell_quote((dir.path / "job.sbatch").string())) == 0);
}

TEST_CASE("injection: values with $(...), backticks and quotes reach srun literally", "[sbatch]") {
  recipe::Recipe r = recipe_with("");
  r.slurm.env = "ODD=$(touch${IFS}PWNED)`touch${IFS}PWNED2`'\";touch${IFS}PWNED3";
  launch::SbatchJob job = job_of(r);
  job.trainctl = "/opt/$(touch PWNED4)/it's `touch PWNED5`/trainctl";
  job.recipe_copy = "/r/'; touch PWNED6; '.yaml";
  FakeSlurm slurm(job);
  CHECK(slurm.run() == 0);
  CHECK(slurm.file("srun.env") == "$(touch${IFS}PWNED)`touch${IFS}PWNED2`'\";touch${IFS}PWNED3");
  CHECK(slurm.file("srun.args") == "--kill-on-bad-exit=0\n--wait=30\n" + job.trainctl + "\nrun\n" +
                                       job.recipe_copy + "\n--run-dir\n" + slurm.run_dir.string() +
                                       "\n");
  for (const char* marker : {"PWNED", "PWNED2", "PWNED3", "PWNED4", "PWNED5", "PWNED6"}) {
    INFO(marker);
    CHECK_FALSE(slurm.exists(marker));
    CHECK_FALSE(fs::exists(fs::current_path() / marker));
  }
}

TEST_CASE("each attempt hands the ranks a fresh 64-digit secret that the script never holds",
          "[sbatch]") {
  FakeSlurm slurm(job_of(recipe_with("")));
  const std::string script = slurm.file("job.sbatch");
  CHECK(slurm.run() == 0);
  const std::string first = slurm.file("srun.secret");
  CHECK(slurm.run() == 0);
  const std::string second = slurm.file("srun.secret");
  const auto hex64 = [](const std::string& s) {
    return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
  };
  CHECK(hex64(first));
  CHECK(hex64(second));
  CHECK(first != second);
  CHECK(script.find(first) == std::string::npos);
  CHECK(slurm.file("job.sbatch") == script);  // nothing wrote it into the script
  // A secret the job was given (exported before sbatch) is kept; a malformed one stops the job.
  const std::string given(64, 'a');
  CHECK(slurm.run("TRAINCTL_STORE_SECRET=" + given) == 0);
  CHECK(slurm.file("srun.secret") == given);
  fs::remove(slurm.dir.path / "srun.secret");
  CHECK(slurm.run("TRAINCTL_STORE_SECRET=abc") == 1);
  CHECK_FALSE(slurm.exists("srun.secret"));
  CHECK_THROWS_WITH(launch::parse_environment("TRAINCTL_STORE_SECRET=" + given),
                    Catch::Contains("made fresh for each job by the batch script"));
}

TEST_CASE("a run directory with a checkpoint is resumed, not started again", "[sbatch]") {
  FakeSlurm slurm(job_of(recipe_with("")));
  fs::create_directories(slurm.run_dir / "checkpoints" / "step_00000010");
  CHECK(slurm.run() == 0);
  CHECK(slurm.file("srun.args") == "--kill-on-bad-exit=0\n--wait=30\n/opt/bin/trainctl\nresume\n" +
                                       slurm.run_dir.string() + "\n");
}

TEST_CASE("exit 75 requeues the job while the restart count is below slurm.max_requeues",
          "[sbatch]") {
  FakeSlurm slurm(job_of(recipe_with("slurm: {max_requeues: 2}\n")));
  CHECK(slurm.run("FAKE_SRUN_EXIT=75 SLURM_RESTART_COUNT=1") == 0);
  CHECK(slurm.file("scontrol.args") == "requeue\n4242\n");
}

TEST_CASE("exit 75 with the requeues used up ends the job with 75 and no requeue", "[sbatch]") {
  FakeSlurm slurm(job_of(recipe_with("slurm: {max_requeues: 2}\n")));
  CHECK(slurm.run("FAKE_SRUN_EXIT=75 SLURM_RESTART_COUNT=2") == 75);
  CHECK_FALSE(slurm.exists("scontrol.args"));
}

TEST_CASE("any other failure ends the job with the step's code and no requeue", "[sbatch]") {
  FakeSlurm slurm(job_of(recipe_with("")));
  CHECK(slurm.run("FAKE_SRUN_EXIT=3") == 3);
  CHECK_FALSE(slurm.exists("scontrol.args"));
}

TEST_CASE("USR1 to the batch shell reaches the step, whose exit 75 requeues the job", "[sbatch]") {
  FakeSlurm slurm(job_of(recipe_with("")));
  const std::string fake_dir = launch::shell_quote(slurm.dir.path.string());
  // The fake srun waits for USR1; the driver signals the batch shell (as --signal=B: does) once
  // the fake is ready, then reports the script's exit status.
  const int status =
      run_bash("export FAKE_SRUN_WAIT=1 FAKE_DIR=" + fake_dir +
               " SLURM_JOB_ID=4242 PATH=" + launch::shell_quote(slurm.bin.string()) +
               ":\"$PATH\"\n" + "bash " + launch::shell_quote(slurm.script.string()) +
               " &\npid=$!\n" + "for i in $(seq 1200); do [ -e " + fake_dir +
               "/ready ] && break; sleep 0.05; done\n" + "kill -USR1 $pid\nwait $pid\n");
  CHECK(status == 0);
  CHECK(slurm.file("srun.signal") == "usr1\n");
  CHECK(slurm.file("scontrol.args") == "requeue\n4242\n");
}

TEST_CASE("check_slurm_recipe: every bad slurm value at once, each at its key", "[sbatch]") {
  const recipe::Recipe r = recipe_with(
      "slurm: {partition: 'gpu;rm', time: '1h', extra: '--signal=USR2', env: 'PATH=/x',"
      " account: ok_1}\nparallel: {dp: 2, tp: 2}\ncluster: {nodes: 3}\n");
  std::vector<std::string> keys;
  for (const SbatchError& e : launch::check_slurm_recipe(r))
    keys.push_back(e.key());
  CHECK(keys == std::vector<std::string>{"slurm.partition", "slurm.time", "slurm.extra",
                                         "slurm.env", "cluster.nodes"});
  const std::vector<SbatchError> problems = launch::check_slurm_recipe(r);
  CHECK_THAT(problems[1].reason(), Catch::StartsWith("'1h' is not a Slurm time"));
  CHECK(std::string(problems[1].what()) == "slurm.time: " + problems[1].reason());
}

TEST_CASE("check_slurm_recipe: a good section and parallel: auto give no problem", "[sbatch]") {
  CHECK(launch::check_slurm_recipe(recipe_with("slurm: {partition: gpu, time: '1-00:00:00', "
                                               "extra: --exclusive, env: 'A=$(x)'}\n"))
            .empty());
  // The layout is planned later: the node count cannot be checked against it yet.
  CHECK(launch::check_slurm_recipe(recipe_with("parallel: auto\ncluster: {nodes: 3}\n")).empty());
}
