#include "run/rank_log.hpp"

#include <fmt/core.h>
#include <sys/stat.h>

#include <stdexcept>

namespace trainctl::run {

namespace {

// Whether two FILE streams write to the same file (a rank whose stderr the launcher sends to its
// log): then a message goes to one of them only.
bool same_file(std::FILE* a, std::FILE* b) {
  struct stat sa {
  }, sb{};
  if (::fstat(::fileno(a), &sa) != 0 || ::fstat(::fileno(b), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

void RankLog::open(const std::filesystem::path& run_dir, bool append) {
  std::filesystem::create_directories(run_dir / "logs");
  const std::filesystem::path path = run_dir / "logs" / fmt::format("rank_{}.log", rank_);
  file_.reset(std::fopen(path.c_str(), append ? "a" : "w"));
  if (!file_) throw std::runtime_error("cannot write " + path.string());
}

int RankLog::fail(const std::string& message, int code) {
  const std::string line = fmt::format("trainctl {}: error: {}{}\n", command_,
                                       multi_ ? fmt::format("rank {}: ", rank_) : "", message);
  if (file_) {
    std::fputs(line.c_str(), file_.get());
    std::fflush(file_.get());
  }
  if (!file_ || !same_file(file_.get(), stderr)) std::fputs(line.c_str(), stderr);
  file_.reset();
  return code;
}

}  // namespace trainctl::run
