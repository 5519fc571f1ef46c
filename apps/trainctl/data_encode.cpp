// `trainctl data encode`: a tokenizer's ids for a text (lib/tokenize), to check a tokenizer
// before preparing data with it, and for the tests that compare it with the tokenizer's own
// library (tests/integration/cli_tokenize.py).
#include <cstdio>
#include <iterator>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "files/files.hpp"
#include "tokenize/tokenize.hpp"

namespace trainctl::app {
namespace {

constexpr const char* kCommand = "data encode";
// The text is read whole: this is a checking tool, not the data pipeline.
constexpr uint64_t kMaxTextBytes = uint64_t{1} << 30;

std::string read_stdin() {
  std::string text;
  char buffer[1 << 16];
  size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, stdin)) > 0)
    text.append(buffer, got);
  return text;
}

}  // namespace

int run_data_encode(const DataEncodeOptions& options) {
  std::unique_ptr<tokenize::Tokenizer> tokenizer;
  try {
    tokenizer = tokenize::load_tokenizer(options.tokenizer, options.eod);
  } catch (const tokenize::TokenizerError& e) {
    return bad_input(kCommand, fmt::format("--tokenizer {}", e.what()));
  }
  std::string text;
  try {
    text = options.file.empty() ? read_stdin()
                                : files::read_regular_file(options.file, kMaxTextBytes, "text");
  } catch (const files::FileError& e) {
    return bad_input(kCommand, e.what());
  }
  std::vector<int32_t> ids;
  try {
    tokenizer->encode(text, ids);
  } catch (const tokenize::TokenizerError& e) {
    return bad_input(
        kCommand, fmt::format("{}: {}", options.file.empty() ? "stdin" : options.file, e.what()));
  }
  if (options.json) {
    const nlohmann::json document = {
        {"tokenizer", tokenizer->path()},        {"kind", tokenizer->kind()},
        {"vocab_size", tokenizer->vocab_size()}, {"eod_id", tokenizer->eod_id()},
        {"eod_token", tokenizer->eod_token()},   {"ids", ids}};
    fmt::print("{}\n", document.dump());
    return kExitOk;
  }
  fmt::memory_buffer line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i != 0) line.push_back(' ');
    fmt::format_to(std::back_inserter(line), "{}", ids[i]);
  }
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stdout);
  return kExitOk;
}

}  // namespace trainctl::app
