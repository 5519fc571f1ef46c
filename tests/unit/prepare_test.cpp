// lib/prepare's inputs: which files a folder gives and in which order, and the records of plain,
// gzip and zstd JSON Lines and text files, compressed here by zlib and libzstd themselves.
#include <zlib.h>
#include <zstd.h>
#include <catch2/catch.hpp>

#include <filesystem>

#include "data_test_util.hpp"
#include "prepare/inputs.hpp"

using namespace trainctl::prepare;
namespace fs = std::filesystem;

namespace {

// data_test_util's folder, and a writer that makes the folders a file sits in.
struct TempDir : trainctl::data::test::TempDir {
  std::string write(const std::string& name, const std::string& bytes) const {
    const fs::path file = path / name;
    fs::create_directories(file.parent_path());
    trainctl::data::test::write_bytes(file.string(), bytes);
    return file.string();
  }
};

std::string gzip(const std::string& text) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&z, text.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string zstd(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const size_t size = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
  REQUIRE(!ZSTD_isError(size));
  out.resize(size);
  return out;
}

std::vector<std::pair<std::string, int64_t>> records(const InputFile& input) {
  RecordReader reader(input, 0);
  std::vector<std::pair<std::string, int64_t>> out;
  Record record;
  while (reader.next(record))
    out.emplace_back(record.text, record.line);
  CHECK(reader.bytes_read() == input.bytes);
  return out;
}

}  // namespace

TEST_CASE("a folder gives its text and JSON Lines files, recursively, in sorted order") {
  TempDir dir;
  dir.write("corpus/b/2.txt", "x");
  dir.write("corpus/a.jsonl.zst", zstd("{}"));
  dir.write("corpus/b/1.json.gz", gzip("{}"));
  dir.write("corpus/notes.csv", "skipped");
  const std::vector<InputFile> inputs = list_inputs({(dir.path / "corpus").string()});
  REQUIRE(inputs.size() == 3);
  CHECK(inputs[0].path == (dir.path / "corpus/a.jsonl.zst").string());
  CHECK(inputs[0].format == InputFormat::jsonl);
  CHECK(inputs[0].compression == Compression::zstd);
  CHECK(inputs[1].path == (dir.path / "corpus/b/1.json.gz").string());
  CHECK(inputs[1].compression == Compression::gzip);
  CHECK(inputs[2].format == InputFormat::text);
  CHECK(inputs[2].bytes == 1);

  const std::string twice = (dir.path / "corpus/b/2.txt").string();
  CHECK_THROWS_WITH(list_inputs({(dir.path / "corpus").string(), twice}),
                    twice +
                        ": named twice among the inputs (directly or inside a folder); name "
                        "it once");
  CHECK_THROWS_WITH(list_inputs({(dir.path / "corpus/notes.csv").string()}),
                    (dir.path / "corpus/notes.csv").string() +
                        ": data prepare reads .txt, .jsonl or .json, each optionally .gz or .zst; "
                        "rename the file or convert it");
  dir.write("empty/readme.md", "");
  CHECK_THROWS_WITH(list_inputs({(dir.path / "empty").string()}),
                    (dir.path / "empty").string() +
                        ": the folder holds no input file (.txt, .jsonl or .json, each optionally "
                        ".gz or .zst)");
}

TEST_CASE("JSON Lines records: blank lines skipped, CRLF and a last line without a newline") {
  TempDir dir;
  // Lines longer than a read (1 MiB) too, so a record spans reads.
  const std::string long_line = "{\"text\": \"" + std::string(3 << 20, 'x') + "\"}";
  const std::string text = "{\"a\": 1}\r\n\n  \t\n" + long_line + "\n{\"b\": 2}";
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"{\"a\": 1}", 1}, {long_line, 4}, {"{\"b\": 2}", 5}};
  for (const auto& [name, bytes] :
       {std::pair{"plain.jsonl", text}, {"gz.jsonl.gz", gzip(text)}, {"z.jsonl.zst", zstd(text)}}) {
    INFO(name);
    const std::vector<InputFile> inputs = list_inputs({dir.write(name, bytes)});
    CHECK(records(inputs[0]) == expected);
  }
  // Two concatenated zstd frames and two gzip members read as one stream, as zstdcat and zcat do.
  const std::vector<InputFile> joined =
      list_inputs({dir.write("two.jsonl.zst", zstd("{\"a\": 1}\n") + zstd("{\"b\": 2}\n")),
                   dir.write("two.jsonl.gz", gzip("{\"a\": 1}\n") + gzip("{\"b\": 2}\n"))});
  for (const InputFile& input : joined)
    CHECK(records(input) ==
          std::vector<std::pair<std::string, int64_t>>{{"{\"a\": 1}", 1}, {"{\"b\": 2}", 2}});
}

TEST_CASE("a text file is one document; corrupt or truncated compressed data is refused") {
  TempDir dir;
  const std::string text = "line one\r\n\nline three\n";
  CHECK(records(list_inputs({dir.write("doc.txt.zst", zstd(text))})[0]) ==
        std::vector<std::pair<std::string, int64_t>>{{text, 0}});
  CHECK(records(list_inputs({dir.write("empty.txt", "")})[0]) ==
        std::vector<std::pair<std::string, int64_t>>{{"", 0}});

  const std::string compressed = zstd(std::string(10000, 'a') + "\n");
  const std::string cut = dir.write("cut.jsonl.zst", compressed.substr(0, compressed.size() - 4));
  CHECK_THROWS_WITH(records(list_inputs({cut})[0]),
                    cut +
                        ": the zstd data ends inside a frame (truncated); recompress or "
                        "re-download it");
  std::string broken = gzip(std::string(10000, 'a'));
  broken[broken.size() / 2] ^= 0x55;
  const std::string bad = dir.write("bad.jsonl.gz", broken);
  CHECK_THROWS_WITH(records(list_inputs({bad})[0]),
                    Catch::Matchers::StartsWith(bad + ": corrupt gzip data"));
}
