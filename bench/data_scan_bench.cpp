// How fast trainctl checks every token id when it opens the data (data::scan_vocab), against the
// ceiling of reading the same bytes: one pread pass over the file into a buffer, summed (the page
// cache's bandwidth on this machine), in the same run. Also the cost of the per-read change check
// (fstat + pread of one window, as the sampler reads) against a plain pread of the same window.
//
//   data_scan_bench [MILLION_TOKENS=200] [DIR=/tmp]
//
// Writes an llm.c shard of that many uint16 tokens into DIR, reads it once to warm the page
// cache, then times each row best of 3. Prints a table; BENCHMARKS.md holds the figures.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_util.hpp"
#include "data/data.hpp"

namespace {

using trainctl::bench::best_seconds;

}  // namespace

int main(int argc, char** argv) {
  using namespace trainctl::data;
  const int64_t tokens = (argc > 1 ? std::atoll(argv[1]) : 200) * 1000000;
  const std::filesystem::path dir = argc > 2 ? argv[2] : "/tmp";
  const std::string path = (dir / fmt::format("data_scan_bench_{}.bin", ::getpid())).string();
  {
    std::array<int32_t, 256> header{};
    header[0] = LlmcShardSource::kMagic;
    header[1] = LlmcShardSource::kVersion;
    header[2] = static_cast<int32_t>(tokens);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), sizeof header);
    std::vector<uint16_t> chunk(1 << 20);
    for (int64_t done = 0; done < tokens;) {
      const int64_t n = std::min<int64_t>(tokens - done, static_cast<int64_t>(chunk.size()));
      for (int64_t i = 0; i < n; ++i)
        chunk[static_cast<size_t>(i)] = static_cast<uint16_t>((done + i) * 2654435761u % 50257);
      out.write(reinterpret_cast<const char*>(chunk.data()), n * 2);
      done += n;
    }
  }
  const LlmcShardSource source({path});
  const double bytes = static_cast<double>(tokens) * 2;

  // The ceiling: the same bytes through pread into a 1 MiB buffer, summed so nothing is skipped.
  uint64_t sink = 0;
  auto raw_read = [&] {
    const int fd = ::open(path.c_str(), O_RDONLY);
    std::vector<uint16_t> buffer(1 << 19);
    off_t offset = 1024;
    ssize_t n = 0;
    while ((n = ::pread(fd, buffer.data(), buffer.size() * 2, offset)) > 0) {
      for (ssize_t i = 0; i < n / 2; ++i)
        sink += buffer[static_cast<size_t>(i)];
      offset += n;
    }
    ::close(fd);
  };
  raw_read();  // warm the page cache
  const double raw = best_seconds(raw_read);
  VocabScan scan;
  const double scanned = best_seconds([&] { scan = scan_vocab(source, 50304); });
  // The digest's share of the scan (provenance.json's data digest is made by the same read): XXH3
  // over as many int32 ids, one 64 Ki chunk hot in cache digested tokens / 64 Ki times.
  std::vector<int32_t> ids(static_cast<size_t>(kDigestChunk));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>(i * 2654435761u % 50257);
  const double digested = best_seconds([&] {
    for (int64_t c = 0; c * kDigestChunk < tokens; ++c)
      sink += token_digest(ids.data(), kDigestChunk, c);
  });

  // The sampler's reads: windows of 1025 tokens at random places, with and without the check.
  const int windows = 200000;
  std::vector<int32_t> window(1025);
  uint64_t state = 88172645463325252ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return static_cast<int64_t>(state % static_cast<uint64_t>(tokens - 1025));
  };
  const double checked = best_seconds([&] {
    for (int i = 0; i < windows; ++i)
      source.read(next(), 1025, window.data());
  });
  const int fd = ::open(path.c_str(), O_RDONLY);
  std::vector<uint16_t> raw_window(1025);
  const double plain = best_seconds([&] {
    for (int i = 0; i < windows; ++i) {
      if (::pread(fd, raw_window.data(), 2050, 1024 + 2 * next()) != 2050) std::abort();
      for (int t = 0; t < 1025; ++t)
        window[static_cast<size_t>(t)] = raw_window[static_cast<size_t>(t)];
    }
  });
  ::close(fd);
  std::filesystem::remove(path);

  fmt::print("data_scan_bench: llm.c shard of {} tokens ({:.0f} MB), page cache warm, best of 3\n",
             tokens, bytes / 1e6);
  fmt::print("| what | time | rate | vs ceiling |\n|---|---|---|---|\n");
  fmt::print("| pread + sum of the file (ceiling) | {:.3f} s | {:.2f} GB/s | 1.00 |\n", raw,
             bytes / raw / 1e9);
  fmt::print(
      "| scan_vocab (every id checked, max id {}) | {:.3f} s | {:.2f} GB/s, {:.0f} M "
      "tokens/s | {:.2f} |\n",
      scan.max_id, scanned, bytes / scanned / 1e9, tokens / scanned / 1e6, raw / scanned);
  fmt::print(
      "| of which the digest (XXH3-64 of the ids as int32, cache-hot) | {:.3f} s | {:.0f} M "
      "tokens/s | {:.2f} of the scan's time |\n",
      digested, tokens / digested / 1e6, digested / scanned);
  fmt::print("| {} windows of 1025 tokens, plain pread | {:.3f} s | {:.2f} us/window | 1.00 |\n",
             windows, plain, plain / windows * 1e6);
  fmt::print(
      "| the same through DataFile (fstat check + pread) | {:.3f} s | {:.2f} us/window | "
      "{:.2f} |\n",
      checked, checked / windows * 1e6, checked / plain);
  return sink == 42 ? 1 : 0;
}
