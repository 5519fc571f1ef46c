// lib/launch: the supervisor with /bin/sh children that exit, crash, hang or stop. Whatever
// happens, every child is reaped before launch_and_supervise returns.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "launch/supervisor.hpp"

namespace fs = std::filesystem;
using namespace trainctl::launch;
using Clock = std::chrono::steady_clock;

namespace {

struct TempDir {
  TempDir() {
    char pattern[] = "/tmp/trainctl_launch_XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  fs::path path;
};

std::vector<ProcessSpec> shells(const TempDir& dir, const std::vector<std::string>& scripts) {
  std::vector<ProcessSpec> specs;
  for (size_t i = 0; i < scripts.size(); ++i) {
    ProcessSpec s;
    s.argv = {"/bin/sh", "-c", scripts[i]};
    s.env = {{"TEST_RANK", std::to_string(i)}, {"TEST_DIR", dir.path.string()}};
    s.log = dir.path / ("rank_" + std::to_string(i) + ".log");
    specs.push_back(std::move(s));
  }
  return specs;
}

bool gone(pid_t pid) {
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

// Waits until every file in `names` exists in `dir` (the children's way of saying "ready"); false
// after 60 s, a bound that only a broken child reaches.
bool wait_for_files(const fs::path& dir, const std::vector<std::string>& names) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (const std::string& name : names)
    while (!fs::exists(dir / name))
      if (Clock::now() > deadline)
        return false;
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return true;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

TEST_CASE("supervisor: all ranks exit 0, output and environment reach the logs", "[launch]") {
  TempDir dir;
  const SuperviseResult r = launch_and_supervise(
      shells(dir, {"echo out $TEST_RANK; echo err >&2", "echo out $TEST_RANK"}));
  CHECK(r.exit_code == 0);
  CHECK(r.first_failed == -1);
  CHECK(r.message.empty());
  REQUIRE(r.exits.size() == 2);
  CHECK(r.exits[0].ok());
  CHECK(read(dir.path / "rank_0.log") == "out 0\nerr\n");
  CHECK(read(dir.path / "rank_1.log") == "out 1\n");
}

TEST_CASE("supervisor: all ranks exit 75 after a stop signal", "[launch]") {
  TempDir dir;
  CHECK(launch_and_supervise(shells(dir, {"exit 75", "exit 75"})).exit_code == 75);
}

TEST_CASE("supervisor: a failed rank is named with its log tail, the others are killed",
          "[launch]") {
  TempDir dir;
  SuperviseOptions options;
  options.grace = std::chrono::milliseconds(500);
  const auto start = Clock::now();
  const SuperviseResult r = launch_and_supervise(
      shells(dir, {"exec sleep 300",
                   "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo line $i; done; "
                   "sleep 0.2; exit 3"}),
      options);
  CHECK(seconds_since(start) < 60);  // far below the children's 300 s: not waited out
  CHECK(r.exit_code == 1);
  CHECK(r.first_failed == 1);
  CHECK(r.exits[1].describe() == "exit code 3");
  CHECK(r.exits[0].signaled);
  CHECK(r.exits[0].code == SIGKILL);
  CHECK(r.exits[0].killed_by_supervisor);
  CHECK_THAT(r.message, Catch::Contains("rank 1") && Catch::Contains("exit code 3") &&
                            Catch::Contains("line 12") && Catch::Contains("line 3") &&
                            !Catch::Contains("line 2\n"));
  for (pid_t pid : r.pids)
    CHECK(gone(pid));
}

TEST_CASE("supervisor: a rank killed by a signal is named before peers that exit after it",
          "[launch]") {
  TempDir dir;
  // Rank 0 exits 1 once rank 1 was SIGKILLed and reaped (its pid is gone), as a collective would
  // fail on its peer: an order of events, not of sleeps.
  const SuperviseResult r = launch_and_supervise(
      shells(dir, {"until [ -s \"$TEST_DIR/pid_1\" ]; do sleep 0.01; done; "
                   "while kill -0 \"$(cat \"$TEST_DIR/pid_1\")\" 2>/dev/null; do sleep 0.01; done; "
                   "exit 1",
                   "echo $$ > \"$TEST_DIR/pid_1.tmp\" && mv \"$TEST_DIR/pid_1.tmp\" "
                   "\"$TEST_DIR/pid_1\" && kill -9 $$"}));
  CHECK(r.exit_code == 1);
  CHECK(r.first_failed == 1);
  CHECK_THAT(r.message, Catch::Contains("killed by signal 9 (SIGKILL)"));
}

TEST_CASE("supervisor: a stopped rank is killed after the grace period", "[launch]") {
  TempDir dir;
  SuperviseOptions options;
  options.grace = std::chrono::milliseconds(500);
  const auto start = Clock::now();
  // Rank 0 fails once rank 1 really is stopped (state T in /proc), as a collective would time out.
  const SuperviseResult r = launch_and_supervise(
      shells(dir, {"until [ -s \"$TEST_DIR/pid_1\" ]; do sleep 0.01; done; "
                   "p=$(cat \"$TEST_DIR/pid_1\"); "
                   "until cut -d')' -f2 /proc/$p/stat | grep -q '^ T'; do sleep 0.01; done; "
                   "echo timed out >&2; exit 1",
                   "echo $$ > \"$TEST_DIR/pid_1.tmp\" && mv \"$TEST_DIR/pid_1.tmp\" "
                   "\"$TEST_DIR/pid_1\" && kill -STOP $$"}),
      options);
  CHECK(seconds_since(start) < 60);  // far below the children's 300 s: not waited out
  CHECK(r.exit_code == 1);
  CHECK(r.first_failed == 0);
  CHECK(r.exits[1].signaled);
  CHECK(r.exits[1].killed_by_supervisor);
  CHECK_THAT(r.message, Catch::Contains("timed out"));
  for (pid_t pid : r.pids)
    CHECK(gone(pid));
}

TEST_CASE("supervisor: bad input found by a rank (exit 2) is exit 2", "[launch]") {
  TempDir dir;
  SuperviseOptions options;
  options.grace = std::chrono::milliseconds(200);
  CHECK(launch_and_supervise(shells(dir, {"exit 2", "exec sleep 300"}), options).exit_code == 2);
}

TEST_CASE("supervisor: SIGTERM of the launcher reaches every rank", "[launch]") {
  TempDir dir;
  // Each rank says it is ready once its trap is set; the launcher is signalled only then.
  const std::string script =
      "trap 'kill $! 2>/dev/null; exit 75' TERM; sleep 300 & touch \"$TEST_DIR/ready_$TEST_RANK\"; "
      "wait";
  SuperviseOptions options;
  options.on_started = [path = dir.path](const std::vector<pid_t>&) {
    std::thread([path] {
      if (wait_for_files(path, {"ready_0", "ready_1"})) ::kill(::getpid(), SIGTERM);
    }).detach();
  };
  const auto start = Clock::now();
  const SuperviseResult r = launch_and_supervise(shells(dir, {script, script}), options);
  CHECK(seconds_since(start) < 60);  // far below the children's 300 s: not waited out
  CHECK(r.exit_code == 75);
  CHECK(r.first_failed == -1);
}

TEST_CASE("supervisor: a second SIGINT kills every rank at once", "[launch]") {
  TempDir dir;
  // The ranks note the first SIGINT and go on (a save that takes long). The second SIGINT is sent
  // once both ranks got the first one forwarded: the launcher has counted it by then, so the two
  // can never merge into one pending signal.
  const std::string script =
      "trap 'touch \"$TEST_DIR/int_$TEST_RANK\"' INT; touch \"$TEST_DIR/ready_$TEST_RANK\"; "
      "while :; do sleep 0.05; done";
  SuperviseOptions options;
  options.on_started = [path = dir.path](const std::vector<pid_t>&) {
    std::thread([path] {
      if (!wait_for_files(path, {"ready_0", "ready_1"})) return;
      ::kill(::getpid(), SIGINT);
      if (wait_for_files(path, {"int_0", "int_1"})) ::kill(::getpid(), SIGINT);
    }).detach();
  };
  const auto start = Clock::now();
  const SuperviseResult r = launch_and_supervise(shells(dir, {script, script}), options);
  CHECK(seconds_since(start) < 60);  // far below the children's 300 s: not waited out
  CHECK(r.exit_code == 130);
  for (pid_t pid : r.pids)
    CHECK(gone(pid));
}

TEST_CASE("supervisor: a missing executable is exit 127 of that rank", "[launch]") {
  TempDir dir;
  std::vector<ProcessSpec> specs = shells(dir, {"exec sleep 300"});
  ProcessSpec missing;
  missing.argv = {"/nonexistent/trainctl"};
  missing.log = dir.path / "rank_1.log";
  specs.push_back(missing);
  SuperviseOptions options;
  options.grace = std::chrono::milliseconds(200);
  const SuperviseResult r = launch_and_supervise(specs, options);
  CHECK(r.exit_code == 1);
  CHECK(r.first_failed == 1);
  CHECK_THAT(r.message, Catch::Contains("exit code 127") && Catch::Contains("exec failed"));
}
