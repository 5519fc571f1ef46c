// The token-source abstraction of lib/data: a finite, immutable sequence of token ids that the
// sampler reads windows from, plus views of a source (slices, a train/validation holdout split).
//
// Contract of every TokenSource:
//   - size() tokens, each an int32 id in [0, vocab) for the vocabulary the data was made for;
//   - read() is const, random access and deterministic: the same range always yields the same
//     tokens, whichever rank or thread asks (no hidden cursor), so any sample can be re-read after
//     a resume;
//   - a source never changes after construction: a file that another process changes is refused
//     at the next read with a DataError naming it (data_file.hpp), never read half-changed.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainctl::data {

// Every user-facing problem with data (missing or malformed files, a window that does not fit,
// a sampler state that belongs to other data). The message names the file or value that was wrong
// and what to do about it.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A tokenizer as a dataset records it (data prepare's sidecar).
struct TokenizerInfo {
  std::string path;    // as given to data prepare
  std::string sha256;  // of the tokenizer file
  std::string kind;    // "hf-bpe" | "sentencepiece"
  int32_t vocab_size = 0;
  int32_t eod_id = -1;
  std::string eod_token;
  bool operator==(const TokenizerInfo&) const = default;

  // "tok/gpt2.json (hf-bpe, vocab 50257, eod 50256)"
  std::string describe() const;
};

// A file a source reads, as it was when the source opened it.
struct SourceFile {
  std::string path;
  uint64_t bytes = 0;
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;

  // Number of tokens.
  virtual int64_t size() const = 0;

  // Copies tokens [offset, offset + count) into out[0, count). Throws DataError when the range
  // is not inside [0, size()).
  virtual void read(int64_t offset, int64_t count, int32_t* out) const = 0;

  // The vocabulary size the tokens were made for (every id is below it): 256 for byte-level text,
  // the configured vocab for synthetic data, 50257 (GPT-2) for llm.c version-1 shards. The model's
  // vocabulary must be at least this large.
  virtual int32_t vocab_hint() const = 0;

  // One line for logs and error messages, e.g. "text data/kjv.txt (1027235 bytes)".
  virtual std::string describe() const = 0;

  // Where token `offset` lives, for messages: "data/train_000.bin, token 1234" (the file and the
  // position in it where the source has files).
  virtual std::string where(int64_t offset) const;

  // True when every id is below vocab_hint() by construction (bytes, synthetic tokens), so
  // scan_vocab need not read the data; false where the file decides (llm.c's uint16 ids).
  virtual bool ids_below_hint() const { return false; }

  // The tokenizer the tokens were made with, where the data records it (a dataset from trainctl
  // data prepare); nullptr otherwise. When it is known, vocab_hint() is its vocabulary and a
  // model must be at least as large.
  virtual const TokenizerInfo* tokenizer() const { return nullptr; }

  // The files the tokens come from (none for synthetic data), for the run's provenance.json.
  virtual std::vector<SourceFile> files() const { return {}; }

 protected:
  // Throws the DataError for a read outside [0, size()); shared by implementations.
  void check_range(int64_t offset, int64_t count) const;
};

// What scan_vocab found: the first id outside [0, vocab), the largest id of the source and the
// digest of the tokens it read.
struct VocabScan {
  int64_t tokens_read = 0;
  int64_t first_outside = -1;  // offset of the first id outside [0, vocab); -1: none
  int32_t first_outside_id = 0;
  int32_t max_id = -1;  // -1 when the source was not read (synthetic data)
  // token_digest of the tokens read; meaningful when tokens_read > 0 or the range was empty.
  uint64_t digest = 0;
};

// The content digest of a source's tokens, the identity provenance.json records: the sum, modulo
// 2^64, over the source's chunks of kDigestChunk tokens (chunk c: tokens [c * kDigestChunk,
// (c + 1) * kDigestChunk)) of XXH3-64 of the chunk's ids as little-endian int32, seeded with c.
// A sum, so that ranks that each scan whole chunks of one source add their parts into the
// digest of the whole, whatever the number of ranks; the seed keeps chunks in their places.
inline constexpr int64_t kDigestChunk = int64_t{1} << 16;
uint64_t token_digest(const int32_t* ids, int64_t count, int64_t chunk_index);

// Reads the whole source front to back in chunks, checks every id against [0, vocab) (data the
// model cannot embed is refused when it is opened, not at the step that reads it) and digests
// the tokens (the same pass). Skips the read only for data without files (synthetic: its recipe
// keys are its identity). Sequential reads through the page cache: about 2 G tokens (4 GB) a
// second of llm.c shards on one core (bench/data_scan_bench).
VocabScan scan_vocab(const TokenSource& source, int32_t vocab);
// The same over tokens [begin, end) only: ranks of one job each check their part. `begin` is a
// multiple of kDigestChunk (the digests of the parts then add up to the whole's), and so is `end`
// unless it is the source's end.
VocabScan scan_vocab(const TokenSource& source, int32_t vocab, int64_t begin, int64_t end);

// A view of tokens [offset, offset + count) of `base` (shared, so the view keeps it alive).
// Throws DataError when the range does not fit inside base.
std::shared_ptr<const TokenSource> slice_source(std::shared_ptr<const TokenSource> base,
                                                int64_t offset, int64_t count);

struct HoldoutSplit {
  std::shared_ptr<const TokenSource> train;  // tokens [0, size - num_val)
  std::shared_ptr<const TokenSource> val;    // the last num_val tokens
};

// Holds out the last `val_fraction` of `source` (rounded to whole tokens) as validation data and
// keeps the rest for training; the two never overlap. val_fraction must be in (0, 1) and both
// parts must be non-empty, otherwise DataError.
HoldoutSplit split_holdout(std::shared_ptr<const TokenSource> source, double val_fraction);

}  // namespace trainctl::data
