// The inputs of `trainctl data prepare`: files and folders of text and JSON Lines, plain or
// compressed (gzip with zlib, zstd with libzstd), read as a stream of documents.
//
//   .txt (.txt.gz, .txt.zst)       one document per file, the whole file
//   .jsonl .json (.gz, .zst)       one document per line: a JSON object whose --jsonl-key field
//                                  (default "text") is the document; blank lines are skipped
//
// A folder is searched recursively for those names; files are taken in sorted path order, so
// the same inputs always give the same dataset.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainctl::prepare {

// A problem with what the user gave (exit 2): the message names the file (and line) and the fix.
class PrepareError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class InputFormat { text, jsonl };
enum class Compression { none, gzip, zstd };

struct InputFile {
  std::string path;
  InputFormat format = InputFormat::text;
  Compression compression = Compression::none;
  uint64_t bytes = 0;  // on disk (compressed)
};

// Expands `paths` (files or folders) into input files. Throws PrepareError for a path that does
// not exist, a file whose name is not one of the formats above, a folder holding none, or a file
// named twice.
std::vector<InputFile> list_inputs(const std::vector<std::string>& paths);

// One document as read, before JSON parsing (workers parse in parallel).
struct Record {
  std::string text;  // text: the document; jsonl: the line
  int32_t file = 0;  // index into the input list
  int64_t line = 0;  // jsonl: 1-based line number; text: 0
};

// Reads one input file's records in order, decompressing as it goes.
class RecordReader {
 public:
  // Throws PrepareError when the file cannot be opened.
  RecordReader(const InputFile& input, int32_t file_index);
  ~RecordReader();
  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;

  // The next record, or false at the end of the file. Throws PrepareError for a read error or
  // corrupt compressed data (naming the file).
  bool next(Record& record);
  // Bytes of the file consumed so far (compressed bytes for compressed files): the progress.
  uint64_t bytes_read() const;

  class Stream;  // a decompressing byte stream (inputs.cpp)

 private:
  bool fill();  // reads more decompressed bytes into buffer_; false at the end

  InputFile input_;
  int32_t file_index_;
  std::unique_ptr<Stream> stream_;
  std::string buffer_;
  size_t start_ = 0;  // first unread byte of buffer_
  int64_t line_ = 0;
  bool done_ = false;
};

}  // namespace trainctl::prepare
