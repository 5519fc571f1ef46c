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
    s.env = {{"TEST_RANK", std::to_string(i)}};
    s.log = dir.path / ("rank_" + std::to_string(i) + ".log");
    specs.push_back(std::move(s));
  }
  return specs;
}

bool gone(pid_t pid) {
  return ::kill(pid, 0) != 0 && errno == ESRCH;
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
      shells(dir, {"exec sleep 30",
                   "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo line $i; done; "
                   "sleep 0.2; exit 3"}),
      options);
  CHECK(seconds_since(start) < 10);
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
  // Rank 0 exits 1 just after rank 1 is SIGKILLed, as a collective would fail on its peer.
  const SuperviseResult r =
      launch_and_supervise(shells(dir, {"sleep 0.3; exit 1", "sleep 0.25; kill -9 $$"}));
  CHECK(r.exit_code == 1);
  CHECK(r.first_failed == 1);
  CHECK_THAT(r.message, Catch::Contains("killed by signal 9 (SIGKILL)"));
}

TEST_CASE("supervisor: a stopped rank is killed after the grace period", "[launch]") {
  TempDir dir;
  SuperviseOptions options;
  options.grace = std::chrono::milliseconds(500);
  const auto start = Clock::now();
  const SuperviseResult r = launch_and_supervise(
      shells(dir, {"sleep 0.3; echo timed out >&2; exit 1", "kill -STOP $$"}), options);
  CHECK(seconds_since(start) < 10);
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
  CHECK(launch_and_supervise(shells(dir, {"exit 2", "exec sleep 30"}), options).exit_code == 2);
}

TEST_CASE("supervisor: SIGTERM of the launcher reaches every rank", "[launch]") {
  TempDir dir;
  const std::string script = "trap 'kill $! 2>/dev/null; exit 75' TERM; sleep 30 & wait";
  SuperviseOptions options;
  options.on_started = [](const std::vector<pid_t>&) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ::kill(::getpid(), SIGTERM);
    }).detach();
  };
  const auto start = Clock::now();
  const SuperviseResult r = launch_and_supervise(shells(dir, {script, script}), options);
  CHECK(seconds_since(start) < 10);
  CHECK(r.exit_code == 75);
  CHECK(r.first_failed == -1);
}

TEST_CASE("supervisor: a second SIGINT kills every rank at once", "[launch]") {
  TempDir dir;
  // The ranks ignore the first SIGINT (a save that takes long).
  const std::string script = "trap '' INT; exec sleep 30";
  SuperviseOptions options;
  options.on_started = [](const std::vector<pid_t>&) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ::kill(::getpid(), SIGINT);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ::kill(::getpid(), SIGINT);
    }).detach();
  };
  const auto start = Clock::now();
  const SuperviseResult r = launch_and_supervise(shells(dir, {script, script}), options);
  CHECK(seconds_since(start) < 10);
  CHECK(r.exit_code == 130);
  for (pid_t pid : r.pids)
    CHECK(gone(pid));
}

TEST_CASE("supervisor: a missing executable is exit 127 of that rank", "[launch]") {
  TempDir dir;
  std::vector<ProcessSpec> specs = shells(dir, {"exec sleep 30"});
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
