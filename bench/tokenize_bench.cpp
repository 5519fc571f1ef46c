// How fast lib/tokenize encodes: a text file split into documents at blank lines ("\n\n"), the
// documents handed to THREADS threads from a shared counter (as `data prepare` will), each
// thread's ids appended to its own vector. Best of REPEATS; fresh threads (so cold word caches)
// for every repeat.
//
//   tokenize_bench TOKENIZER TEXT [THREADS=1] [REPEATS=3]
//
// Prints one JSON line: {"kind", "threads", "documents", "bytes", "tokens", "seconds", "mb_per_s"}.
// scripts/bench-tokenize runs it beside HF tokenizers' encode_batch and prints the table.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "bench_util.hpp"
#include "files/files.hpp"
#include "tokenize/tokenize.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenize_bench TOKENIZER TEXT [THREADS=1] [REPEATS=3]\n");
    return 2;
  }
  const int num_threads = argc > 3 ? std::atoi(argv[3]) : 1;
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 3;
  const auto tokenizer = trainctl::tokenize::load_tokenizer(argv[1]);
  const std::string text =
      trainctl::files::read_regular_file(argv[2], uint64_t{1} << 32, "benchmark text");
  std::vector<std::string_view> documents;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find("\n\n", start);
    end = end == std::string::npos ? text.size() : end + 2;
    documents.push_back(std::string_view(text).substr(start, end - start));
    start = end;
  }
  std::atomic<size_t> tokens{0};
  const double seconds = trainctl::bench::best_seconds(
      [&] {
        std::atomic<size_t> next{0};
        tokens = 0;
        std::vector<std::thread> threads;
        for (int t = 0; t < num_threads; ++t)
          threads.emplace_back([&] {
            std::vector<int32_t> ids;
            for (size_t i = next++; i < documents.size(); i = next++)
              tokenizer->encode(documents[i], ids);
            tokens += ids.size();
          });
        for (std::thread& thread : threads)
          thread.join();
      },
      repeats);
  fmt::print(
      "{{\"kind\": \"{}\", \"threads\": {}, \"documents\": {}, \"bytes\": {}, \"tokens\": {}, "
      "\"seconds\": {:.4f}, \"mb_per_s\": {:.2f}}}\n",
      tokenizer->kind(), num_threads, documents.size(), text.size(), tokens.load(), seconds,
      static_cast<double>(text.size()) / 1e6 / seconds);
  return 0;
}
