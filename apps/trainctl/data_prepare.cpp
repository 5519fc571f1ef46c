// `trainctl data prepare`: text to a Megatron indexed dataset (lib/prepare), with a progress line
// (MB/s and ETA) and a summary a user can paste into a recipe.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "commands.hpp"
#include "files/files.hpp"
#include "prepare/prepare.hpp"

namespace trainctl::app {
namespace {

constexpr const char* kCommand = "data prepare";

std::string megabytes(uint64_t bytes) {
  return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
}

std::string duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

std::string progress_line(const prepare::PrepareProgress& p) {
  const double share = p.bytes_total > 0
                           ? static_cast<double>(p.bytes_read) / static_cast<double>(p.bytes_total)
                           : 1.0;
  const double rate = p.seconds > 0 ? static_cast<double>(p.bytes_read) / p.seconds : 0.0;
  const std::string eta = rate > 0 && share < 1
                              ? duration(static_cast<double>(p.bytes_total - p.bytes_read) / rate)
                              : std::string("-");
  return fmt::format("data prepare: {:5.1f}% of {}, {:.1f} MB/s, {} documents, {} tokens, ETA {}",
                     100 * share, megabytes(p.bytes_total), rate / 1e6, p.documents, p.tokens, eta);
}

}  // namespace

int run_data_prepare(const DataPrepareOptions& options) {
  const bool live = options.progress == "auto" && ::isatty(STDERR_FILENO) != 0;
  const bool plain = options.progress == "plain" || (options.progress == "auto" && !live);
  double last_plain = 0;
  bool drew = false;
  auto progress = [&](const prepare::PrepareProgress& p) {
    if (live) {
      fmt::print(stderr, "\r{}\x1b[K", progress_line(p));
      std::fflush(stderr);
      drew = true;
    } else if (plain && p.seconds - last_plain >= 10) {
      last_plain = p.seconds;
      fmt::print(stderr, "{}\n", progress_line(p));
    }
  };
  prepare::PrepareSummary summary;
  try {
    summary = prepare::prepare_dataset(options.prepare, progress);
  } catch (const prepare::PrepareError& e) {
    if (drew) fmt::print(stderr, "\n");
    return bad_input(kCommand, e.what());
  } catch (const files::FileError& e) {
    if (drew) fmt::print(stderr, "\n");
    fmt::print(stderr, "trainctl {}: error: {}\n", kCommand, e.what());
    return kExitFailure;
  }
  if (drew) fmt::print(stderr, "\n");
  const double rate =
      summary.seconds > 0 ? static_cast<double>(summary.text_bytes) / summary.seconds / 1e6 : 0.0;
  fmt::print(
      "prepared {}.bin/.idx: {} documents, {} tokens ({}), from {} of text ({} of input files) in "
      "{:.2f} s ({:.1f} MB/s of text, {} worker{})\n",
      summary.prefix, summary.documents, summary.tokens, data::indexed_dtype_name(summary.dtype),
      megabytes(summary.text_bytes), megabytes(summary.input_bytes), summary.seconds, rate,
      summary.workers, summary.workers == 1 ? "" : "s");
  if (summary.empty_skipped > 0)
    fmt::print("skipped {} empty document{}\n", summary.empty_skipped,
               summary.empty_skipped == 1 ? "" : "s");
  fmt::print("tokenizer: {} ({}, vocab {}, eod {} = {}), recorded in {}.json\n",
             summary.sidecar.tokenizer.path, summary.sidecar.tokenizer.kind,
             summary.sidecar.tokenizer.vocab_size, summary.sidecar.tokenizer.eod_token,
             summary.sidecar.tokenizer.eod_id, summary.prefix);
  fmt::print("train on it with: data: {{source: megatron, path: {}}} and model.vocab >= {}\n",
             summary.prefix, summary.sidecar.tokenizer.vocab_size);
  return kExitOk;
}

}  // namespace trainctl::app
