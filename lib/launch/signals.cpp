#include "launch/signals.hpp"

#include <atomic>
#include <csignal>
#include <stdexcept>

namespace trainctl::launch {

namespace {

std::atomic<int> g_signal{0};  // a signal handler can only reach process-wide state
std::atomic<bool> g_installed{false};
constexpr int kSignals[] = {SIGTERM, SIGUSR1, SIGINT};
struct sigaction g_previous[std::size(kSignals)];

void on_signal(int sig) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
  if (sig == SIGINT) {
    // The next Ctrl-C takes the default action: stop now.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGINT, &dfl, nullptr);
  }
}

}  // namespace

StopSignals::StopSignals() {
  if (g_installed.exchange(true)) throw std::logic_error("StopSignals: already installed");
  g_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (size_t i = 0; i < std::size(kSignals); ++i)
    sigaction(kSignals[i], &action, &g_previous[i]);
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < std::size(kSignals); ++i)
    sigaction(kSignals[i], &g_previous[i], nullptr);
  g_installed = false;
}

bool StopSignals::requested() const {
  return g_signal.load() != 0;
}
int StopSignals::signal() const {
  return g_signal.load();
}

const char* StopSignals::name() const {
  switch (g_signal.load()) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGINT:
      return "SIGINT";
    default:
      return "";
  }
}

}  // namespace trainctl::launch
