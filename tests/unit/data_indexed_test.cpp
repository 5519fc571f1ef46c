// Megatron indexed datasets (.bin/.idx): the writer's bytes against the documented layout, the
// reader on them, every refusal of a pair that does not belong together, the sidecar, and llm.c
// version 2 shards.
#include <catch2/catch.hpp>

#include <cstring>

#include "data/indexed_dataset.hpp"
#include "data_test_util.hpp"

using namespace trainctl::data;
using namespace trainctl::data::test;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <typename T>
void append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// The .idx Megatron's _IndexWriter writes for one sequence per document, built by hand from the
// layout in megatron/core/datasets/indexed_dataset.py.
std::string expected_index(uint8_t code, int64_t item_bytes, const std::vector<int32_t>& sizes) {
  std::string out("MMIDIDX\0\0", 9);
  append<uint64_t>(out, 1);
  append<uint8_t>(out, code);
  append<uint64_t>(out, sizes.size());
  append<uint64_t>(out, sizes.size() + 1);
  for (int32_t size : sizes)
    append<int32_t>(out, size);
  int64_t pointer = 0;
  for (int32_t size : sizes) {
    append<int64_t>(out, pointer);
    pointer += size * item_bytes;
  }
  for (int64_t d = 0; d <= static_cast<int64_t>(sizes.size()); ++d)
    append<int64_t>(out, d);
  return out;
}

void write_dataset(const std::string& prefix, IndexedDType dtype,
                   const std::vector<std::vector<int32_t>>& documents) {
  IndexedDatasetWriter writer(prefix, dtype);
  for (const auto& document : documents)
    writer.add_document(document);
  writer.finish();
}

}  // namespace

TEST_CASE("the writer's files are Megatron's layout byte for byte and read back") {
  TempDir dir;
  const std::string prefix = dir.file("corpus");
  const std::vector<std::vector<int32_t>> documents = {{5, 6, 7, 0}, {}, {65535, 0}, {9, 0}};
  write_dataset(prefix, IndexedDType::uint16, documents);

  CHECK(read_file(prefix + ".idx") == expected_index(8, 2, {4, 0, 2, 2}));
  std::string bin;
  for (const auto& document : documents)
    for (int32_t id : document)
      append<uint16_t>(bin, static_cast<uint16_t>(id));
  CHECK(read_file(prefix + ".bin") == bin);
  CHECK(fs::directory_iterator(dir.path) != fs::directory_iterator());
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.path))
    ++files;
  CHECK(files == 2);  // no temporary file is left

  for (const std::string& name : {prefix, prefix + ".bin", prefix + ".idx"}) {
    const IndexedSource source(name);
    CHECK(source.size() == 8);
    CHECK(read_all(source) == std::vector<int32_t>{5, 6, 7, 0, 65535, 0, 9, 0});
    CHECK(source.num_documents() == 4);
    CHECK(source.num_sequences() == 4);
    CHECK(source.document_offset(1) == 4);
    CHECK(source.document_offset(2) == 4);
    CHECK(source.document_offset(4) == 8);
    CHECK(source.vocab_hint() == 65536);  // no sidecar: the dtype's bound
    CHECK(source.tokenizer() == nullptr);
    CHECK(source.where(5) == prefix + ".bin, document 2, token 1");
    CHECK(source.describe() == "indexed dataset " + prefix + " (4 documents, 8 uint16 tokens)");
  }
}

TEST_CASE("int32 datasets hold ids of large vocabularies") {
  TempDir dir;
  const std::string prefix = dir.file("big");
  CHECK(indexed_dtype_for_vocab(65499) == IndexedDType::uint16);
  CHECK(indexed_dtype_for_vocab(65500) == IndexedDType::int32);
  CHECK(indexed_dtype_for_vocab(128256) == IndexedDType::int32);
  write_dataset(prefix, IndexedDType::int32, {{128000, 1, 128255}, {70000}});
  CHECK(read_file(prefix + ".idx") == expected_index(4, 4, {3, 1}));
  const IndexedSource source(prefix);
  CHECK(read_all(source) == std::vector<int32_t>{128000, 1, 128255, 70000});
  std::vector<int32_t> middle(2);
  source.read(1, 2, middle.data());
  CHECK(middle == std::vector<int32_t>{1, 128255});
}

TEST_CASE("the writer refuses an id its dtype cannot hold and leaves nothing behind") {
  TempDir dir;
  const std::string prefix = dir.file("small");
  {
    IndexedDatasetWriter writer(prefix, IndexedDType::uint16);
    writer.add_document(std::vector<int32_t>{1, 2});
    CHECK(error_of([&] { writer.add_document(std::vector<int32_t>{65536}); }) ==
          prefix + ": token id 65536 does not fit the dataset's dtype uint16");
    // Destroyed without finish(): its temporary file goes, no .bin/.idx appears.
  }
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("an index that does not match its .bin is refused with the file and the value") {
  TempDir dir;
  const std::string prefix = dir.file("d");
  const std::string idx = prefix + ".idx";
  auto open_error = [&] { return error_of([&] { IndexedSource source(prefix); }); };
  const std::string fix =
      "; recreate the dataset (trainctl data prepare, or Megatron's tools/preprocess_data.py)";
  write_dataset(prefix, IndexedDType::uint16, {{1, 2, 3}, {4, 5}});
  const std::string good = read_file(idx);

  std::string bytes = good;
  bytes[0] = 'X';
  write_bytes(idx, bytes);
  CHECK(open_error() == idx +
                            ": not a Megatron index: it does not start with MMIDIDX (a .bin/.idx "
                            "pair of another format, such as fairseq's cached datasets, cannot be "
                            "read)" +
                            fix);

  bytes = good;
  bytes[17] = 7;  // float32
  write_bytes(idx, bytes);
  CHECK(open_error() == idx +
                            ": its dtype is float32, which does not hold token ids (uint8, int16, "
                            "uint16 or int32 do)" +
                            fix);

  write_bytes(idx, good.substr(0, good.size() - 8));
  CHECK(open_error() == idx +
                            ": its header counts 2 sequences and 3 documents, which take 82 bytes, "
                            "but the file has 74 (truncated or from another dataset)" +
                            fix);

  write_bytes(idx, good);
  write_bytes(prefix + ".bin", read_file(prefix + ".bin") + std::string(2, '\0'));
  CHECK(open_error() == idx + ": its 2 sequences hold 10 bytes of uint16 tokens, but " + prefix +
                            ".bin has 12 bytes (the pair does not belong together, or one of them "
                            "is truncated)" +
                            fix);

  write_dataset(prefix, IndexedDType::uint16, {{1, 2, 3}, {4, 5}});
  bytes = good;
  const int64_t second_pointer = 7;  // a gap between the sequences
  std::memcpy(bytes.data() + 34 + 8 + 8, &second_pointer, 8);
  write_bytes(idx, bytes);
  CHECK(open_error() == idx + ": sequence 1 starts at byte 7 of " + prefix +
                            ".bin, but the sequences before it end at byte 6 (trainctl reads the "
                            "sequences as one stream, as they lie in .bin)" +
                            fix);

  bytes = good;
  const int64_t last_document = 1;
  std::memcpy(bytes.data() + static_cast<long>(good.size()) - 8, &last_document, 8);
  write_bytes(idx, bytes);
  CHECK(open_error() == idx +
                            ": its document index must run from 0 to the sequence count 2 with at "
                            "least one document, but it has 3 entries from 0 to 1" +
                            fix);

  fs::remove(idx);
  CHECK(open_error().starts_with(idx + ": cannot open data file: No such file or directory"));
}

TEST_CASE("a dataset of empty documents is refused: it holds no tokens") {
  TempDir dir;
  const std::string prefix = dir.file("empty");
  IndexedDatasetWriter writer(prefix, IndexedDType::uint16);
  writer.add_document(std::vector<int32_t>{});
  writer.finish();
  // The .bin is empty: DataFile refuses it before the index is read.
  CHECK(error_of([&] { IndexedSource source(prefix); }) ==
        prefix + ".bin: the file is empty; give a data file that holds at least one token");
}

TEST_CASE("the sidecar names the tokenizer and must describe the dataset beside it") {
  TempDir dir;
  const std::string prefix = dir.file("tok");
  write_dataset(prefix, IndexedDType::uint16, {{1, 2, 0}, {3, 0}});
  IndexedSidecar sidecar;
  sidecar.tokenizer = {"tok/gpt2.json", std::string(64, 'a'), "hf-bpe", 50257, 0, "<|endoftext|>"};
  sidecar.documents = 2;
  sidecar.tokens = 5;
  sidecar.inputs = {"a.txt"};
  write_bytes(prefix + ".json", sidecar.to_json());
  {
    const IndexedSource source(prefix);
    REQUIRE(source.sidecar().has_value());
    CHECK(source.sidecar()->tokenizer == sidecar.tokenizer);
    CHECK(source.vocab_hint() == 50257);
    REQUIRE(source.tokenizer() != nullptr);
    CHECK(source.tokenizer()->describe() == "tok/gpt2.json (hf-bpe, vocab 50257, eod 0)");
    // The holdout views keep the tokenizer: the run's vocabulary check reads it through them.
    const HoldoutSplit split = split_holdout(std::make_shared<IndexedSource>(prefix), 0.4);
    REQUIRE(split.val->tokenizer() != nullptr);
    CHECK(*split.val->tokenizer() == sidecar.tokenizer);
  }
  sidecar.tokens = 6;
  write_bytes(prefix + ".json", sidecar.to_json());
  CHECK(error_of([&] { IndexedSource source(prefix); }) ==
        prefix + ".json: the sidecar describes 2 documents and 6 tokens, but " + prefix +
            " holds 2 documents and 5 tokens: it belongs to another dataset; remove it or prepare "
            "the dataset again");
  write_bytes(prefix + ".json", "{\"format\": \"trainctl-indexed-dataset\", \"tokens\": 5}");
  CHECK(error_of([&] {
          IndexedSource source(prefix);
        }).starts_with(prefix + ".json: unreadable dataset sidecar ("));
  // Another tool's PREFIX.json (a corpus, a config) is not a sidecar: left alone.
  for (const std::string other : {"{\"format\": \"something\"}", "[1, 2]", "not json"}) {
    write_bytes(prefix + ".json", other);
    const IndexedSource source(prefix);
    CHECK_FALSE(source.sidecar().has_value());
    CHECK(source.vocab_hint() == 65536);
  }
}

TEST_CASE("llm.c version 2 shards hold uint32 Llama 3 ids; versions do not mix") {
  TempDir dir;
  const std::string v2 = dir.file("v2.bin");
  std::array<int32_t, 256> header{};
  header[0] = LlmcShardSource::kMagic;
  header[1] = 2;
  header[2] = 3;
  std::string bytes(reinterpret_cast<const char*>(header.data()), sizeof(header));
  for (uint32_t id : {128000u, 7u, 128255u})
    append<uint32_t>(bytes, id);
  write_bytes(v2, bytes);
  const LlmcShardSource source({v2});
  CHECK(source.version() == 2);
  CHECK(source.vocab_hint() == 128256);
  CHECK(read_all(source) == std::vector<int32_t>{128000, 7, 128255});
  CHECK(source.describe() == "llm.c shard " + v2 + " (version 2, uint32) (3 tokens)");

  const std::string v1 = dir.file("v1.bin");
  write_shard(v1, {1, 2});
  CHECK(error_of([&] {
          LlmcShardSource mixed({v1, v2});
        }) == v2 + ": llm.c shard version 2 among shards of version 1 (first: " + v1 +
                  "); every shard of one dataset must hold the same token type: use shards of one "
                  "tokenizer");

  append<uint32_t>(bytes, 0x80000000u);
  header[2] = 4;
  std::memcpy(bytes.data(), header.data(), sizeof(header));
  write_bytes(v2, bytes);
  const LlmcShardSource corrupt({v2});
  CHECK(error_of([&] { read_all(corrupt); }) ==
        v2 + ": token 3 is 2147483648, above any vocabulary (ids are uint32 in version 2 "
             "shards); the shard is corrupt: re-create it");
}
