// lib/files: atomic rewrites that never lose the old file, reads that never block on a FIFO, size
// limits checked before reading, moving aside without replacing, the run directory's lock, and
// which directories can hold a run.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "files/files.hpp"
#include "files/run_lock.hpp"

namespace fs = std::filesystem;
using namespace trainctl;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char pattern[] = "/tmp/trainctl-files-XXXXXX";
    path = ::mkdtemp(pattern);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Every entry of a folder, to prove no temporary file was left.
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Runs `body` in a child whose files may not grow past `limit` bytes (RLIMIT_FSIZE, SIGXFSZ
// ignored, so write() fails with EFBIG as on a full disk); returns the child's exit code.
template <typename Body>
int in_child_with_file_limit(rlim_t limit, Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit r{limit, limit};
    ::setrlimit(RLIMIT_FSIZE, &r);
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("write_file_atomically replaces the content and leaves no temporary file") {
  TempDir tmp;
  const fs::path file = tmp.path / "recipe.yaml";
  files::write_file_atomically(file, "old\n");
  files::write_file_atomically(file, "new content\n");
  CHECK(read_text(file) == "new content\n");
  CHECK(entries(tmp.path) == std::vector<std::string>{"recipe.yaml"});
}

TEST_CASE("a write that fails (the disk is full) leaves the old file intact and no temporary") {
  TempDir tmp;
  const fs::path file = tmp.path / "recipe.yaml";
  const std::string old(3000, 'o');
  files::write_file_atomically(file, old);
  // 1000 bytes may be written: the new 5000-byte content cannot be.
  const int code = in_child_with_file_limit(1000, [&] {
    try {
      files::write_file_atomically(file, std::string(5000, 'n'));
    } catch (const files::FileError& e) {
      const std::string message = e.what();
      return message.find("cannot write " + file.string()) != std::string::npos &&
                     message.find("EFBIG") != std::string::npos
                 ? 3
                 : 4;
    }
    return 0;
  });
  CHECK(code == 3);  // threw a FileError naming the file and the error
  CHECK(read_text(file) == old);
  CHECK(entries(tmp.path) == std::vector<std::string>{"recipe.yaml"});
}

TEST_CASE("open_regular refuses a FIFO at once instead of waiting for a writer") {
  TempDir tmp;
  const fs::path fifo = tmp.path / "manifest.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto start = std::chrono::steady_clock::now();
  // Without O_NONBLOCK this open would wait forever: an alarm fails the test instead of hanging.
  ::alarm(10);
  REQUIRE_THROWS_WITH(files::open_regular(fifo, "checkpoint manifest"),
                      Catch::Contains("the checkpoint manifest is a FIFO (named pipe), not a "
                                      "regular file"));
  REQUIRE_THROWS_AS(files::read_regular_file(fifo, 100, "recipe"), files::FileError);
  ::alarm(0);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  CHECK_THROWS_WITH(files::open_regular(tmp.path, "recipe"), Catch::Contains("a directory"));
}

TEST_CASE("read_regular_file refuses a file above its limit before reading it") {
  TempDir tmp;
  const fs::path file = tmp.path / "big.yaml";
  files::write_file_atomically(file, std::string(2000, 'x'));
  CHECK(files::read_regular_file(file, 2000, "recipe").size() == 2000);
  CHECK_THROWS_WITH(files::read_regular_file(file, 1999, "recipe"),
                    Catch::Contains("the recipe has 2000 bytes, more than the 1999 a recipe may "
                                    "have"));
}

TEST_CASE("move_aside never replaces what is already there") {
  TempDir tmp;
  const fs::path into = tmp.path / "rejected";
  for (int i = 0; i < 3; ++i) {
    const fs::path dir = tmp.path / "step_00000004";
    fs::create_directories(dir);
    std::ofstream(dir / "manifest.json") << i;
    const fs::path moved = files::move_aside(dir, into);
    CHECK(moved ==
          into / (i == 0 ? std::string("step_00000004") : "step_00000004." + std::to_string(i)));
  }
  CHECK(entries(into) ==
        std::vector<std::string>{"step_00000004", "step_00000004.1", "step_00000004.2"});
  CHECK(read_text(into / "step_00000004" / "manifest.json") == "0");
  CHECK(read_text(into / "step_00000004.2" / "manifest.json") == "2");
}

TEST_CASE("create_private_directories: new folders 0700 under any umask, old ones untouched") {
  TempDir tmp;
  const auto mode_of = [](const fs::path& p) { return fs::status(p).permissions(); };
  fs::create_directories(tmp.path / "run");
  fs::permissions(tmp.path / "run", fs::perms(0755));
  const mode_t old_umask = ::umask(0);
  files::create_private_directories(tmp.path / "run" / "rendezvous" / "job");
  files::create_private_directories(tmp.path / "run" / "rendezvous" / "job");  // exists: fine
  ::umask(old_umask);
  CHECK(mode_of(tmp.path / "run") == fs::perms(0755));
  CHECK(mode_of(tmp.path / "run" / "rendezvous") == fs::perms(0700));
  CHECK(mode_of(tmp.path / "run" / "rendezvous" / "job") == fs::perms(0700));
  std::ofstream(tmp.path / "file") << "x";
  try {
    files::create_private_directories(tmp.path / "file");
    FAIL("a regular file passed for a folder");
  } catch (const files::FileError& error) {
    CHECK_THAT(error.what(), Catch::Contains("it is a regular file, not a directory"));
  }
  CHECK_THROWS_AS(files::create_private_directories(tmp.path / "file" / "below"), files::FileError);
}

TEST_CASE("the run lock refuses a second holder and names the first") {
  TempDir tmp;
  const fs::path run = tmp.path / "runs" / "a";
  files::RunDirLock first = files::RunDirLock::acquire(run);
  CHECK(first.held());
  CHECK_FALSE(first.takeover_note());
  // flock belongs to an open file description: a second acquire in this process conflicts
  // exactly as another process's would.
  CHECK_THROWS_WITH(files::RunDirLock::acquire(run),
                    Catch::Contains("is in use by another trainctl (pid " +
                                    std::to_string(::getpid()) + " on ") &&
                        Catch::Contains("started ") && Catch::Contains("UTC"));
  first.release();
  files::RunDirLock again = files::RunDirLock::acquire(run);
  CHECK_FALSE(again.takeover_note());  // a clean release leaves nothing to take over
}

TEST_CASE("the lock of a process that died is taken over with a note naming it") {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  const pid_t pid = ::fork();
  if (pid == 0) {
    files::RunDirLock lock = files::RunDirLock::acquire(run);
    ::raise(SIGKILL);  // dies holding it: no release
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  files::RunDirLock lock = files::RunDirLock::acquire(run);
  REQUIRE(lock.takeover_note());
  CHECK_THAT(*lock.takeover_note(), Catch::Contains("took over the run directory's lock from pid " +
                                                    std::to_string(pid)) &&
                                        Catch::Contains("no longer running"));
}

TEST_CASE("why_not_writable_directory: new and existing directories pass, files and /proc fail") {
  TempDir tmp;
  CHECK(files::why_not_writable_directory(tmp.path).empty());
  CHECK(files::why_not_writable_directory(tmp.path / "new" / "deeper").empty());
  std::ofstream(tmp.path / "a-file") << "x";
  CHECK_THAT(files::why_not_writable_directory(tmp.path / "a-file"),
             Catch::Contains("is a regular file, not a directory"));
  CHECK_THAT(files::why_not_writable_directory(tmp.path / "a-file" / "run"),
             Catch::Contains("a-file is a regular file, not a directory"));
  CHECK_THAT(files::why_not_writable_directory("/proc/trainctl"),
             Catch::Contains("/proc is on a proc file system"));
  CHECK_THAT(files::why_not_writable_directory("/sys/trainctl"), Catch::Contains("sysfs"));
}
