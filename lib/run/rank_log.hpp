// The rank's own log, logs/rank_<N>.log. With several ranks every rank has one from the start (the
// launcher has already written its header there), so it is appended to; one rank truncates it on
// a new run. Opened once the ranks have met: with an external launcher rank 0 may still be
// clearing the run directory (--overwrite) until then. Errors before that go to stderr, which our
// launcher sends to the log anyway. Closes itself.
#pragma once

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

namespace trainctl::run {

class RankLog {
 public:
  RankLog(std::string command, bool multi, int rank)
      : command_(std::move(command)), multi_(multi), rank_(rank) {}

  // Opens logs/rank_<rank>.log of `run_dir` (creating logs/), appending or truncating. Throws
  // std::runtime_error naming the file when it cannot be opened.
  void open(const std::filesystem::path& run_dir, bool append);
  bool is_open() const { return file_ != nullptr; }
  std::FILE* file() const { return file_.get(); }
  const std::string& command() const { return command_; }

  // An error of this rank: to its log and to stderr (once when stderr is the log). Closes the
  // log; returns `code`.
  int fail(const std::string& message, int code);
  void close() { file_.reset(); }

 private:
  struct Close {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::string command_;
  bool multi_ = false;
  int rank_ = 0;
  std::unique_ptr<std::FILE, Close> file_;
};

}  // namespace trainctl::run
