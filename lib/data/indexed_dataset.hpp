// Megatron-LM's indexed datasets (the "MMIDIDX" .bin/.idx pair that megatron/core/datasets/
// indexed_dataset.py writes and reads, and tools/preprocess_data.py produces): the reader is a
// TokenSource, the writer is what `trainctl data prepare` uses.
//
// Layout (all little-endian):
//   PREFIX.bin  the tokens of every sequence, back to back, in the index's dtype
//   PREFIX.idx  "MMIDIDX\0\0" (9 bytes), version u64 = 1, dtype code u8, sequence count S u64,
//               document count D u64, then int32 sizes[S] (tokens per sequence), int64
//               pointers[S] (byte offset of each sequence in .bin), int64 document_indices[D]
//               (the first sequence of each document, then S: D = documents + 1), and, only in
//               multimodal datasets, int8 modes[S].
//   dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16;
//   token datasets use uint16 below a vocabulary of 65500 and int32 above (Megatron's rule).
//
// trainctl reads the tokens as one stream (sequence after sequence, as they lie in .bin) and
// cuts it into windows of seq_len + 1 tokens, as Megatron's GPTDataset does: a window may span
// documents, which data prepare separates with the end-of-document token.
//
// A sidecar PREFIX.json, written by data prepare (not by Megatron, and optional), names the
// tokenizer the tokens come from: see IndexedSidecar.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/config.hpp"
#include "data/data_file.hpp"
#include "data/token_source.hpp"
#include "files/files.hpp"

namespace trainctl::data {

// The element types Megatron's DType enum numbers; only the integer ones hold tokens.
enum class IndexedDType : uint8_t {
  uint8 = 1,
  int8 = 2,
  int16 = 3,
  int32 = 4,
  int64 = 5,
  float64 = 6,
  float32 = 7,
  uint16 = 8
};

// Megatron's choice for a vocabulary: uint16 when vocab_size < 65500, int32 otherwise.
IndexedDType indexed_dtype_for_vocab(int64_t vocab_size);
// "uint16", "int32", ...
std::string_view indexed_dtype_name(IndexedDType dtype);

// What data prepare records beside a dataset (PREFIX.json). Every field is checked on open
// against the dataset it sits beside, so a sidecar left from another dataset is refused; a
// PREFIX.json that is not a sidecar (another tool's file) is left alone.
struct IndexedSidecar {
  TokenizerInfo tokenizer;  // every id is below its vocab_size; eod_id ends each document
  int64_t documents = 0;
  int64_t tokens = 0;
  std::vector<std::string> inputs;  // the files data prepare read, in order

  std::string to_json() const;
  // Parses and checks the fields; throws DataError naming `path` and the field. Nothing for text
  // that is not a sidecar (not JSON, or no "format": "trainctl-indexed-dataset"): a PREFIX.json
  // of someone else's is not ours to judge.
  static std::optional<IndexedSidecar> parse(const std::string& text, const std::string& path);
};

// A Megatron indexed dataset as a TokenSource. The .idx is read and checked whole on open (its
// magic, version, dtype, counts, and that its sizes and pointers describe the .bin exactly); the
// tokens are read from .bin with pread when asked for (DataFile: a file that changes is refused).
class IndexedSource final : public TokenSource {
 public:
  // `path`: the prefix, or either file of the pair. Throws DataError naming the file and the
  // value that is wrong: a missing .bin or .idx, a bad header, a dtype that does not hold token
  // ids, an index that does not match its .bin, no tokens, a sidecar that belongs elsewhere.
  explicit IndexedSource(const std::string& path);

  int64_t size() const override { return num_tokens_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override;
  // The sidecar's vocab_size; without one, the dtype's bound (65536 for uint16).
  int32_t vocab_hint() const override;
  std::string describe() const override;
  std::string where(int64_t offset) const override;  // "data/x.bin, document 12, token 40"
  const TokenizerInfo* tokenizer() const override;   // from the sidecar, when there is one
  std::vector<SourceFile> files() const override;    // PREFIX.bin, PREFIX.idx

  IndexedDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return static_cast<int64_t>(pointers_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(document_starts_.size()) - 1; }
  // The tokens of document `doc` are [document_offset(doc), document_offset(doc + 1)).
  int64_t document_offset(int64_t doc) const;
  const std::optional<IndexedSidecar>& sidecar() const { return sidecar_; }
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_;
  detail::DataFile bin_;
  uint64_t idx_bytes_ = 0;  // read whole when opened: only its size is kept
  IndexedDType dtype_ = IndexedDType::uint16;
  int64_t item_bytes_ = 2;
  int64_t num_tokens_ = 0;
  std::vector<int64_t> pointers_;         // byte offset of each sequence in .bin
  std::vector<int64_t> document_starts_;  // first sequence of each document, then S
  std::optional<IndexedSidecar> sidecar_;
};

// Writes PREFIX.bin and PREFIX.idx. Nothing appears under those names until finish(): the
// tokens go to temporary files beside them, which finish() syncs and renames into place (.bin
// first, so a crash between the two renames leaves a pair whose sizes disagree, which the reader
// refuses, never a pair that reads wrong). A writer destroyed before finish() removes its
// temporary files.
class IndexedDatasetWriter {
 public:
  // Throws files::FileError when the files cannot be created.
  IndexedDatasetWriter(std::string prefix, IndexedDType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one document of one sequence. Throws DataError when an id does not fit the dtype.
  void add_document(std::span<const int32_t> tokens);
  // Writes the index and moves both files into place.
  void finish();

  int64_t num_documents() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t bin_bytes() const { return num_tokens_ * item_bytes_; }

 private:
  void flush();

  std::string prefix_;
  IndexedDType dtype_;
  int64_t item_bytes_;
  std::string bin_tmp_, idx_tmp_;
  files::UniqueFd bin_fd_;
  std::vector<unsigned char> buffer_;
  std::vector<int32_t> sizes_;
  int64_t num_tokens_ = 0;
  bool finished_ = false;
};

}  // namespace trainctl::data
