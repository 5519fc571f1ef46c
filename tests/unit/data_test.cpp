// Token sources of lib/data: text, llm.c shards, synthetic tokens, holdout splits, the bundled
// text.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "data/data.hpp"
#include "data_test_util.hpp"

namespace fs = std::filesystem;
using namespace trainctl::data;
using namespace trainctl::data::test;

namespace {}  // namespace

TEST_CASE("text source reads each byte as one token") {
  TempDir dir;
  const std::string path = dir.file("hello.txt");
  write_bytes(path, std::string("Hi\n\xff", 4));
  TextSource source(path);
  CHECK(source.size() == 4);
  CHECK(source.vocab_hint() == 256);
  CHECK(read_all(source) == std::vector<int32_t>{'H', 'i', '\n', 255});
  std::vector<int32_t> middle(2);
  source.read(1, 2, middle.data());
  CHECK(middle == std::vector<int32_t>{'i', '\n'});
  CHECK(source.describe() == "text " + path + " (4 bytes)");
  CHECK(error_of([&] { source.read(3, 2, middle.data()); }) ==
        "read of tokens [3, 5) is outside text " + path + " (4 bytes) which has 4 tokens");
}

TEST_CASE("text source names a missing or empty file and the fix") {
  TempDir dir;
  const std::string missing = dir.file("missing.txt");
  CHECK(error_of([&] { TextSource source(missing); }) ==
        missing +
            ": cannot open data file: No such file or directory; check the path (relative paths "
            "are taken from the working directory)");
  const std::string empty = dir.file("empty.txt");
  write_bytes(empty, "");
  CHECK(error_of([&] { TextSource source(empty); }) ==
        empty + ": the file is empty; give a data file that holds at least one token");
}

TEST_CASE("llm.c shard source reads the real header layout") {
  TempDir dir;
  const std::string path = dir.file("shard.bin");
  const std::vector<uint16_t> tokens = {0, 1, 50256, 65535, 7};
  write_shard(path, tokens);
  CHECK(fs::file_size(path) == 1024 + 2 * tokens.size());
  LlmcShardSource source({path});
  CHECK(source.size() == 5);
  CHECK(source.num_shards() == 1);
  CHECK(source.vocab_hint() == 50257);
  CHECK(read_all(source) == std::vector<int32_t>{0, 1, 50256, 65535, 7});
  CHECK(source.describe() == "llm.c shard " + path + " (5 tokens)");
}

TEST_CASE("llm.c shards from a glob are sorted and concatenated") {
  TempDir dir;
  // Written out of order: the pattern expansion must sort them.
  write_shard(dir.file("train_000001.bin"), {10, 11, 12});
  write_shard(dir.file("train_000000.bin"), {1, 2, 3, 4});
  write_bytes(dir.file("other.bin"), "not matched by the pattern");
  const std::vector<std::string> paths = expand_shard_pattern(dir.file("train_*.bin"));
  REQUIRE(paths ==
          std::vector<std::string>{dir.file("train_000000.bin"), dir.file("train_000001.bin")});
  LlmcShardSource source(paths);
  CHECK(source.size() == 7);
  CHECK(read_all(source) == std::vector<int32_t>{1, 2, 3, 4, 10, 11, 12});
  std::vector<int32_t> across(3);
  source.read(3, 3, across.data());  // straddles the shard boundary
  CHECK(across == std::vector<int32_t>{4, 10, 11});
  source.read(4, 3, across.data());  // exactly the second shard
  CHECK(across == std::vector<int32_t>{10, 11, 12});

  CHECK(error_of([&] { expand_shard_pattern(dir.file("val_*.bin")); }) ==
        dir.file("val_*.bin") +
            ": no file matches this data path; check the path or glob pattern (relative paths are "
            "taken from the working directory)");
}

TEST_CASE("broken llm.c shards are refused with the file and the fix") {
  TempDir dir;
  const std::string path = dir.file("bad.bin");
  const std::vector<uint16_t> tokens = {1, 2, 3, 4};
  auto open_error = [&] { return error_of([&] { LlmcShardSource source({path}); }); };

  write_shard(path, tokens, {.magic = 12345});
  CHECK(open_error() == path +
                            ": not an llm.c token shard: header[0] is 12345, expected the magic "
                            "number 20240520; point the data path at llm.c .bin shards");

  write_shard(path, tokens, {.version = 3});
  CHECK(open_error() == path +
                            ": llm.c shard version 3 is not supported (version 1: uint16 GPT-2 "
                            "tokens, version 2: uint32 Llama 3 tokens); re-create the shard with "
                            "llm.c's data scripts");

  write_shard(path, tokens, {.drop_bytes = 3});
  CHECK(open_error() == path +
                            ": truncated llm.c shard: the header says 4 tokens (1032 bytes with "
                            "the header) but the file has 1029 bytes; re-create or re-download the "
                            "shard");

  write_shard(path, tokens, {.extra_bytes = 2});
  CHECK(open_error() == path +
                            ": llm.c shard has 2 bytes after its 4 tokens (expected 1032 bytes, "
                            "the file has 1034); re-create the shard");

  write_shard(path, {}, {});
  CHECK(open_error() == path +
                            ": llm.c shard header says 0 tokens; a shard must hold at least one "
                            "token");

  write_bytes(path, std::string(100, 'x'));
  CHECK(open_error() == path +
                            ": not an llm.c token shard: 100 bytes is shorter than the 1024-byte "
                            "header; re-create it with llm.c's data scripts or "
                            "scripts/make-llmc-shard");

  // One good shard does not hide a bad one after it.
  const std::string good = dir.file("good.bin");
  write_shard(good, tokens);
  write_shard(path, tokens, {.magic = 0});
  CHECK_THROWS_WITH(LlmcShardSource({good, path}), Catch::Contains(path + ": not an llm.c"));
}

TEST_CASE("synthetic source is deterministic by seed and follows its bigram table") {
  const SyntheticSource a(7, 256, 5000);
  const SyntheticSource b(7, 256, 5000);
  const SyntheticSource other_seed(8, 256, 5000);
  const std::vector<int32_t> tokens = read_all(a);
  CHECK(tokens == read_all(b));
  const std::vector<int32_t> other = read_all(other_seed);
  const auto same =
      std::inner_product(tokens.begin(), tokens.end(), other.begin(), 0, std::plus<>(),
                         [](int32_t x, int32_t y) { return x == y ? 1 : 0; });
  CHECK(same < 200);  // chance agreement is ~5000/256

  // Random access equals the sequential stream, also across a block boundary.
  std::vector<int32_t> window(100);
  a.read(SyntheticSource::kBlockLength - 50, 100, window.data());
  CHECK(std::equal(window.begin(), window.end(),
                   tokens.begin() + SyntheticSource::kBlockLength - 50));

  // Every token is in range and every step inside a block is one of the 4 distinct successors.
  std::set<std::pair<int32_t, int32_t>> transitions;
  for (size_t i = 0; i < tokens.size(); ++i) {
    REQUIRE((tokens[i] >= 0 && tokens[i] < 256));
    if (i % SyntheticSource::kBlockLength == 0) continue;
    std::set<int32_t> successors;
    for (int32_t k = 0; k < 4; ++k)
      successors.insert(a.successor(tokens[i - 1], k));
    REQUIRE(successors.size() == 4);
    REQUIRE(successors.count(tokens[i]) == 1);
    transitions.insert({tokens[i - 1], tokens[i]});
  }
  // The chain really branches (not a fixed cycle), so the data is learnable but not trivial.
  CHECK(transitions.size() > 600);
  CHECK(a.entropy_nats_per_token() == Approx((1023.0 * std::log(4.0) + std::log(256.0)) / 1024.0));
  CHECK(a.describe() == "synthetic (seed 7, vocab 256, 5000 tokens, branching 4)");
}

TEST_CASE("synthetic source rejects impossible settings") {
  CHECK(error_of([] { SyntheticSource s(1, 1, 10); }) ==
        "synthetic data: vocab 1 is too small; use a vocab of at least 2");
  CHECK(error_of([] { SyntheticSource s(1, 3, 10, 5); }) ==
        "synthetic data: branching 5 is not in [1, vocab 3]; use e.g. 3");
  CHECK(error_of([] { SyntheticSource s(1, 256, 0); }) ==
        "synthetic data: 0 tokens requested; ask for at least one (e.g. 1000000)");
}

TEST_CASE("holdout split keeps the last fraction for validation") {
  auto source = std::make_shared<SyntheticSource>(3, 100, 1000);
  const std::vector<int32_t> all = read_all(*source);
  const HoldoutSplit split = split_holdout(source, 0.1);
  REQUIRE(split.train->size() == 900);
  REQUIRE(split.val->size() == 100);
  const std::vector<int32_t> train = read_all(*split.train);
  const std::vector<int32_t> val = read_all(*split.val);
  CHECK(std::equal(train.begin(), train.end(), all.begin()));
  CHECK(std::equal(val.begin(), val.end(), all.begin() + 900));
  CHECK(split.val->vocab_hint() == 100);
  CHECK_THROWS_AS(split.val->read(50, 51, std::vector<int32_t>(51).data()), DataError);

  CHECK(error_of([&] { split_holdout(source, 1.0); }) ==
        "validation fraction 1 is not in (0, 1); hold out e.g. 0.05 (5%) of the tokens");
  CHECK_THROWS_WITH(split_holdout(source, 0.0001),
                    Catch::Contains("leaves 0 validation and 1000 training tokens"));
}

TEST_CASE("open_dataset builds train and validation sources from a config") {
  DataConfig synthetic;
  synthetic.val_fraction = 0.25;
  SyntheticConfig stream;
  stream.num_tokens = 2000;
  const Dataset held_out = open_dataset(synthetic, stream);
  CHECK(held_out.parts[0].train->size() == 1500);
  CHECK(held_out.parts[0].val->size() == 500);

  TempDir dir;
  write_bytes(dir.file("train.txt"), "abcdefgh");
  write_bytes(dir.file("val.txt"), "xyz");
  DataConfig text;
  text.source = parse_source_kind("text");
  text.path = dir.file("train.txt");
  text.val_path = dir.file("val.txt");
  const Dataset separate = open_dataset(text);
  CHECK(separate.parts[0].train->size() == 8);
  CHECK(read_all(*separate.parts[0].val) == std::vector<int32_t>{'x', 'y', 'z'});

  CHECK(parse_source_kind("llmc") == SourceKind::llmc);
  CHECK(parse_source_kind("megatron") == SourceKind::megatron);
  CHECK(error_of([] { parse_source_kind("fairseq"); }) ==
        "unknown data source kind 'fairseq'; use one of synthetic, text (bytes of a file), llmc "
        "(llm.c .bin token shards), megatron (a Megatron .bin/.idx indexed dataset)");
  DataConfig no_path;
  no_path.source = SourceKind::llmc;
  CHECK(error_of([&] { open_dataset(no_path); }) ==
        "llmc data needs a path; set the data path (e.g. data/kjv.txt for text)");
}

TEST_CASE("the bundled text loads as byte-level training data") {
  const std::string path = std::string(TRAINCTL_SOURCE_DIR) + "/" + std::string(kBundledTextPath);
  DataConfig config;
  config.source = SourceKind::text;
  config.path = path;
  const Dataset dataset = open_dataset(config);
  const int64_t total = dataset.parts[0].train->size() + dataset.parts[0].val->size();
  CHECK(total == 1027235);  // data/README.md
  const std::vector<int32_t> tokens = read_all(*dataset.parts[0].train);
  CHECK(std::string(tokens.begin(), tokens.begin() + 9) == "Genesis\n\n");
  std::array<int64_t, 256> counts{};
  for (int32_t token : tokens) {
    REQUIRE(((token >= ' ' && token <= '~') || token == '\n'));  // plain ASCII prose
    ++counts[static_cast<size_t>(token)];
  }
  double entropy = 0;
  for (int64_t count : counts) {
    if (count == 0) continue;
    const double p = static_cast<double>(count) / static_cast<double>(tokens.size());
    entropy -= p * std::log(p);
  }
  CHECK(entropy == Approx(3.026).margin(0.01));  // unigram entropy in data/README.md
}
