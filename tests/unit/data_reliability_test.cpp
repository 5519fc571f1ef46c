// Data that is not what it claims or that changes under a run: a FIFO in a data file's place is
// refused without waiting, a file truncated or rewritten while a run reads it is refused at the
// next read (never SIGBUS, never half-changed tokens), and every token id is checked against the
// model's vocabulary when the data is opened (scan_vocab).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "data/data.hpp"
#include "data_test_util.hpp"

namespace fs = std::filesystem;
using namespace trainctl::data;
using namespace trainctl::data::test;

TEST_CASE("a FIFO in a data file's place is refused without waiting for a writer") {
  TempDir tmp;
  REQUIRE(::mkfifo(tmp.file("train.txt").c_str(), 0600) == 0);
  ::alarm(10);  // a regression would block in open(): fail instead of hanging the suite
  CHECK_THROWS_WITH(TextSource(tmp.file("train.txt")),
                    Catch::Contains("FIFO (named pipe), not a regular file"));
  CHECK_THROWS_AS(LlmcShardSource({tmp.file("train.txt")}), DataError);
  ::alarm(0);
}

TEST_CASE("a text file truncated under a reader is refused at the next read, naming it") {
  TempDir tmp;
  const std::string path = tmp.file("train.txt");
  std::ofstream(path) << std::string(100000, 'a');
  const TextSource source(path);
  std::vector<int32_t> out(64);
  source.read(99000, 64, out.data());
  CHECK(out[0] == 'a');
  REQUIRE(::truncate(path.c_str(), 1000) == 0);
  // The page past the new end would have been SIGBUS through a memory map.
  CHECK_THROWS_WITH(source.read(99000, 64, out.data()),
                    Catch::Contains(path + ": the data file changed while the run was reading it "
                                           "(it had 100000 bytes when opened and has 1000 now)"));
}

TEST_CASE("an llm.c shard rewritten in place (same size) is refused at the next read") {
  TempDir tmp;
  const std::string path = tmp.file("train_000.bin");
  write_shard(path, std::vector<uint16_t>(5000, 7));
  const LlmcShardSource source({path});
  std::vector<int32_t> out(16);
  source.read(0, 16, out.data());
  CHECK(out[0] == 7);
  // Another process rewrites tokens; a later modification time is what gives it away.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1024);
    const uint16_t bad = 60000;
    f.write(reinterpret_cast<const char*>(&bad), 2);
  }
  const timespec later[2] = {{0, UTIME_OMIT}, {::time(nullptr) + 5, 0}};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), later, 0) == 0);
  CHECK_THROWS_WITH(source.read(0, 16, out.data()),
                    Catch::Contains("its modification time moved since it was opened"));
}

TEST_CASE("scan_vocab finds the first id outside the vocabulary and the largest id") {
  TempDir tmp;
  std::vector<uint16_t> a(70000, 5), b(70000, 9);
  b[69990] = 300;  // past one scan chunk, in the second shard
  b[69995] = 1000;
  write_shard(tmp.file("t_000.bin"), a);
  write_shard(tmp.file("t_001.bin"), b);
  const LlmcShardSource source({tmp.file("t_000.bin"), tmp.file("t_001.bin")});
  const VocabScan bad = scan_vocab(source, 256);
  CHECK(bad.first_outside == 70000 + 69990);
  CHECK(bad.first_outside_id == 300);
  CHECK(bad.max_id == 1000);
  CHECK(bad.tokens_read == 140000);
  CHECK(source.where(bad.first_outside) == tmp.file("t_001.bin") + ", token 69990");
  const VocabScan good = scan_vocab(source, 1001);
  CHECK(good.first_outside == -1);
  CHECK(good.max_id == 1000);
  // A slice (a holdout split) names the position in the file, not in the slice.
  const auto slice = slice_source(
      std::make_shared<LlmcShardSource>(std::vector<std::string>{tmp.file("t_001.bin")}), 60000,
      10000);
  CHECK(slice->where(scan_vocab(*slice, 256).first_outside) ==
        tmp.file("t_001.bin") + ", token 69990");
}

TEST_CASE("scan_vocab over a part reads only that part: ranks split the check") {
  TempDir tmp;
  std::vector<uint16_t> tokens(100000, 3);
  tokens[80000] = 999;
  write_shard(tmp.file("t_000.bin"), tokens);
  const LlmcShardSource source({tmp.file("t_000.bin")});
  const VocabScan first = scan_vocab(source, 256, 0, 50000);
  CHECK(first.tokens_read == 50000);
  CHECK(first.first_outside == -1);
  CHECK(first.max_id == 3);
  const VocabScan second = scan_vocab(source, 256, 50000, 100000);
  CHECK(second.tokens_read == 50000);
  CHECK(second.first_outside == 80000);
  CHECK(second.max_id == 999);
}

TEST_CASE("scan_vocab does not read sources whose ids are below their hint by construction") {
  const SyntheticSource synthetic(1, 256, 1 << 20);
  CHECK(scan_vocab(synthetic, 256).tokens_read == 0);
  CHECK(scan_vocab(synthetic, 100).tokens_read == 1 << 20);  // a smaller model must look
  CHECK(scan_vocab(synthetic, 100).first_outside >= 0);
}

TEST_CASE("scan_vocab digests the tokens: parts of whole chunks add up, files do not matter") {
  TempDir tmp;
  std::mt19937 rng(7);
  std::vector<uint16_t> tokens(3 * kDigestChunk + 123);
  for (uint16_t& t : tokens)
    t = static_cast<uint16_t>(rng() % 50000);
  write_shard(tmp.file("one_000.bin"), tokens);
  const LlmcShardSource one({tmp.file("one_000.bin")});
  const VocabScan whole = scan_vocab(one, 50257);
  // Ranks each read whole chunks: their digests add up to the whole's (mod 2^64).
  const int64_t size = one.size();
  CHECK(scan_vocab(one, 50257, 0, kDigestChunk).digest +
            scan_vocab(one, 50257, kDigestChunk, 3 * kDigestChunk).digest +
            scan_vocab(one, 50257, 3 * kDigestChunk, size).digest ==
        whole.digest);
  // The same tokens in two files: the same digest (the tokens are the identity, not the files).
  write_shard(tmp.file("two_000.bin"), {tokens.begin(), tokens.begin() + 1000});
  write_shard(tmp.file("two_001.bin"), {tokens.begin() + 1000, tokens.end()});
  const LlmcShardSource two({tmp.file("two_000.bin"), tmp.file("two_001.bin")});
  CHECK(scan_vocab(two, 50257).digest == whole.digest);
  CHECK(two.files().size() == 2);
  CHECK(two.files()[1].bytes ==
        static_cast<uint64_t>(LlmcShardSource::kHeaderBytes) + 2 * (tokens.size() - 1000));
  // One token changed, or two tokens swapped: another digest.
  std::vector<uint16_t> changed = tokens;
  changed[kDigestChunk + 5] ^= 1;
  write_shard(tmp.file("changed_000.bin"), changed);
  CHECK(scan_vocab(LlmcShardSource({tmp.file("changed_000.bin")}), 50257).digest != whole.digest);
  std::vector<uint16_t> swapped = tokens;
  std::swap(swapped[0], swapped[kDigestChunk]);  // across chunks: the chunk seed tells them apart
  REQUIRE(swapped[0] != tokens[0]);
  write_shard(tmp.file("swapped_000.bin"), swapped);
  CHECK(scan_vocab(LlmcShardSource({tmp.file("swapped_000.bin")}), 50257).digest != whole.digest);
}

TEST_CASE("scan_vocab reads byte text too, for its digest; synthetic data has no files") {
  TempDir tmp;
  const std::string path = tmp.file("t.txt");
  std::ofstream(path) << "hello world";
  const TextSource text(path);
  const VocabScan scan = scan_vocab(text, 256);
  CHECK(scan.tokens_read == 11);
  const std::vector<int32_t> ids{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'};
  CHECK(scan.digest == token_digest(ids.data(), 11, 0));
  REQUIRE(text.files().size() == 1);
  CHECK(text.files()[0].path == path);
  CHECK(text.files()[0].bytes == 11);
  CHECK(SyntheticSource(1, 256, 100).files().empty());
}
