#include "launch/supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace trainctl::launch {

namespace {

using Clock = std::chrono::steady_clock;

// A signal handler can only reach process-wide state.
std::atomic<int> g_forward_pending{0};  // the last stop signal not yet forwarded
std::atomic<int> g_interrupts{0};       // SIGINTs received while supervising

void on_launcher_signal(int sig) {
  if (sig == SIGINT) g_interrupts.fetch_add(1);
  g_forward_pending.store(sig);
}

// Installs the forwarding handlers for the lifetime of the object; restores the previous ones.
class ForwardSignals {
 public:
  ForwardSignals() {
    g_forward_pending = 0;
    g_interrupts = 0;
    struct sigaction action {};
    action.sa_handler = on_launcher_signal;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < std::size(kSignals); ++i)
      sigaction(kSignals[i], &action, &previous_[i]);
  }
  ~ForwardSignals() {
    for (size_t i = 0; i < std::size(kSignals); ++i)
      sigaction(kSignals[i], &previous_[i], nullptr);
  }
  ForwardSignals(const ForwardSignals&) = delete;
  ForwardSignals& operator=(const ForwardSignals&) = delete;

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGUSR1};
  struct sigaction previous_[std::size(kSignals)]{};
};

// Everything a child needs, prepared before fork(): between fork and exec only async-signal-safe
// calls are allowed.
struct Prepared {
  std::vector<std::string> argv_storage, env_storage;
  std::vector<char*> argv, envp;
  int log_fd = -1;
};

Prepared prepare(const ProcessSpec& spec) {
  if (spec.argv.empty()) throw std::invalid_argument("launch: a process needs argv[0]");
  Prepared p;
  p.argv_storage = spec.argv;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(spec.env.begin(), spec.env.end(),
                                      [&](const auto& kv) { return kv.first == name; });
    if (!replaced) p.env_storage.push_back(entry);
  }
  for (const auto& [name, value] : spec.env)
    p.env_storage.push_back(name + "=" + value);
  for (std::string& s : p.argv_storage)
    p.argv.push_back(s.data());
  p.argv.push_back(nullptr);
  for (std::string& s : p.env_storage)
    p.envp.push_back(s.data());
  p.envp.push_back(nullptr);
  p.log_fd = ::open(spec.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (p.log_fd < 0)
    throw std::runtime_error("launch: cannot open the rank log " + spec.log.string() + ": " +
                             std::strerror(errno));
  return p;
}

[[noreturn]] void child_after_fork(const Prepared& p, bool stderr_to_terminal, pid_t group,
                                   pid_t parent, int null_fd) {
  ::setpgid(0, group);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::dup2(null_fd, 0);
  ::dup2(p.log_fd, 1);
  if (!stderr_to_terminal) ::dup2(p.log_fd, 2);
  ::execve(p.argv[0], p.argv.data(), p.envp.data());
  const char* what = "trainctl launcher: exec failed for ";
  (void)!::write(2, what, std::strlen(what));
  (void)!::write(2, p.argv[0], std::strlen(p.argv[0]));
  (void)!::write(2, "\n", 1);
  ::_exit(127);
}

struct Tracked {
  pid_t pid = -1;
  bool done = false;
  ProcessExit exit;
  Clock::time_point when{};
};

void kill_remaining(std::vector<Tracked>& ranks, pid_t group) {
  bool any = false;
  for (Tracked& t : ranks) {
    if (t.done) continue;
    any = true;
    ::kill(t.pid, SIGKILL);
    t.exit.killed_by_supervisor = true;
  }
  if (any && group > 0) ::kill(-group, SIGKILL);
}

void reap_blocking(std::vector<Tracked>& ranks) {
  for (Tracked& t : ranks) {
    if (t.done) continue;
    int raw = 0;
    while (::waitpid(t.pid, &raw, 0) < 0 && errno == EINTR) {
    }
    const bool by_us = t.exit.killed_by_supervisor;
    t.exit = WIFSIGNALED(raw) ? ProcessExit{true, WTERMSIG(raw), by_us}
                              : ProcessExit{false, WEXITSTATUS(raw), by_us};
    t.done = true;
    t.when = Clock::now();
  }
}

bool is_failure(const ProcessExit& e) {
  return e.signaled || (e.code != 0 && e.code != 75);
}

}  // namespace

std::string signal_name(int signal) {
  switch (signal) {
    case SIGKILL:
      return "SIGKILL";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGHUP:
      return "SIGHUP";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGXFSZ:
      return "SIGXFSZ";
    default:
      return "signal " + std::to_string(signal);
  }
}

std::string ProcessExit::describe() const {
  if (signaled)
    return "killed by signal " + std::to_string(code) + " (" + signal_name(code) + ")" +
           (killed_by_supervisor ? " by the launcher" : "");
  return "exit code " + std::to_string(code);
}

std::string tail_lines(const std::filesystem::path& path, int lines, const std::string& indent) {
  std::ifstream in(path);
  if (!in) return "";
  std::deque<std::string> last;
  std::string line;
  while (std::getline(in, line)) {
    // A progress line rewritten with \r: keep what was shown last.
    while (!line.empty() && line.back() == '\r')
      line.pop_back();
    if (const size_t cr = line.rfind('\r'); cr != std::string::npos) line = line.substr(cr + 1);
    last.push_back(line);
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  std::string out;
  for (const std::string& l : last)
    out += indent + l + "\n";
  return out;
}

SuperviseResult launch_and_supervise(const std::vector<ProcessSpec>& processes,
                                     const SuperviseOptions& options) {
  std::vector<Prepared> prepared;
  prepared.reserve(processes.size());
  for (const ProcessSpec& spec : processes)
    prepared.push_back(prepare(spec));
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  auto close_all = [&] {
    for (Prepared& p : prepared)
      if (p.log_fd >= 0) ::close(p.log_fd);
    if (null_fd >= 0) ::close(null_fd);
  };

  ForwardSignals forward;
  std::vector<Tracked> ranks(processes.size());
  pid_t group = 0;
  const pid_t self = ::getpid();
  for (size_t i = 0; i < processes.size(); ++i) {
    const pid_t pid = ::fork();
    if (pid == 0)
      child_after_fork(prepared[i], processes[i].stderr_to_terminal, group, self, null_fd);
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      for (size_t j = i; j < ranks.size(); ++j)
        ranks[j].done = true;
      kill_remaining(ranks, group);
      reap_blocking(ranks);
      close_all();
      throw std::runtime_error("launch: cannot start rank " + std::to_string(i) + ": fork: " + why);
    }
    if (group == 0) group = pid;
    ::setpgid(pid, group);  // also here: the child may not have run yet
    ranks[i].pid = pid;
  }
  close_all();
  SuperviseResult result;
  for (const Tracked& t : ranks)
    result.pids.push_back(t.pid);
  if (options.on_started) options.on_started(result.pids);

  std::optional<Clock::time_point> first_failure;
  bool interrupted_twice = false;
  while (true) {
    bool pending = false;
    for (Tracked& t : ranks) {
      if (t.done) continue;
      int raw = 0;
      const pid_t r = ::waitpid(t.pid, &raw, WNOHANG);
      if (r == t.pid) {
        t.done = true;
        t.when = Clock::now();
        t.exit = WIFSIGNALED(raw) ? ProcessExit{true, WTERMSIG(raw), false}
                                  : ProcessExit{false, WEXITSTATUS(raw), false};
        if (is_failure(t.exit) && !first_failure) first_failure = t.when;
      } else {
        pending = true;
      }
    }
    if (!pending) break;
    if (const int sig = g_forward_pending.exchange(0); sig != 0) {
      if (sig == SIGINT && g_interrupts.load() >= 2) {
        interrupted_twice = true;
        kill_remaining(ranks, group);
        reap_blocking(ranks);
        break;
      }
      for (const Tracked& t : ranks)
        if (!t.done) ::kill(t.pid, sig);
    }
    if (first_failure && Clock::now() >= *first_failure + options.grace) {
      kill_remaining(ranks, group);
      reap_blocking(ranks);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  for (const Tracked& t : ranks)
    result.exits.push_back(t.exit);
  if (interrupted_twice) {
    result.exit_code = 130;
    result.message = "interrupted twice: every rank was killed at once (no checkpoint saved)";
    return result;
  }
  if (!first_failure) {
    const bool all_ok =
        std::all_of(ranks.begin(), ranks.end(), [](const Tracked& t) { return t.exit.code == 0; });
    result.exit_code = all_ok ? 0 : 75;
    return result;
  }
  // The first failure; within the settle window a rank that died by a signal is the cause and its
  // peers (which exited because it vanished) are the consequence.
  int chosen = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const Tracked& t = ranks[i];
    if (!is_failure(t.exit) || t.exit.killed_by_supervisor) continue;
    if (t.when > *first_failure + options.settle) continue;
    if (chosen < 0) {
      chosen = static_cast<int>(i);
      continue;
    }
    const Tracked& best = ranks[static_cast<size_t>(chosen)];
    if ((t.exit.signaled && !best.exit.signaled) ||
        (t.exit.signaled == best.exit.signaled && t.when < best.when))
      chosen = static_cast<int>(i);
  }
  if (chosen < 0) chosen = 0;  // unreachable: first_failure came from a failed rank
  const Tracked& failed = ranks[static_cast<size_t>(chosen)];
  result.first_failed = chosen;
  result.exit_code = (!failed.exit.signaled && failed.exit.code == 2) ? 2 : 1;
  std::string others;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (static_cast<int>(i) != chosen)
      others += "\n  rank " + std::to_string(i) + ": " + ranks[i].exit.describe();
  const std::string& log = processes[static_cast<size_t>(chosen)].log.string();
  const std::string tail = tail_lines(log, options.log_tail_lines);
  result.message =
      "rank " + std::to_string(chosen) + " (pid " + std::to_string(failed.pid) +
      ") failed: " + failed.exit.describe() + "; the other ranks:" + others +
      (tail.empty() ? "\n(its log " + log + " is empty)" : "\nlast lines of " + log + ":\n" + tail);
  return result;
}

}  // namespace trainctl::launch
