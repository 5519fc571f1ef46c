// lib/prepare: `trainctl data prepare`, text to a Megatron indexed dataset.
//
//   inputs (prepare/inputs.hpp) --reader--> batches of records --N workers: JSON field, encode,
//   + end-of-document--> batches of ids --in input order--> IndexedDatasetWriter (PREFIX.bin/.idx)
//   then the sidecar PREFIX.json (the tokenizer's path, SHA-256, vocabulary and eod id).
//
// The output does not depend on the number of workers: batches are written in the order they
// were read. Everything that can be checked before reading (inputs, tokenizer, the output folder,
// an existing dataset at PREFIX) is checked before anything is created; a problem found while
// reading (a line that is not JSON, text that is not UTF-8) stops the run with its file and line,
// and the writer's temporary files are removed: PREFIX.* is only ever a complete dataset.
// Depends on lib/data (the writer) and lib/tokenize.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/indexed_dataset.hpp"
#include "prepare/inputs.hpp"

namespace trainctl::prepare {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or folders
  std::string tokenizer;            // tokenizer.json, .model, or a folder holding one
  std::string eod;                  // end-of-document token; empty: the tokenizer's default
  std::string out;                  // the dataset's prefix: writes out.bin, out.idx, out.json
  std::string jsonl_key = "text";   // the field of each JSON line that holds the document
  int workers = 0;                  // tokenizing threads; 0: one per hardware thread
  bool overwrite = false;           // replace a dataset already at `out`
};

struct PrepareProgress {
  uint64_t bytes_read = 0;   // of the input files (compressed bytes where compressed)
  uint64_t bytes_total = 0;  // all input files
  int64_t documents = 0;     // written so far
  int64_t tokens = 0;
  double seconds = 0;
};

struct PrepareSummary {
  std::string prefix;
  int64_t documents = 0;      // written (each ends with the eod token)
  int64_t empty_skipped = 0;  // documents with no text, not written (as Megatron's tools do)
  int64_t tokens = 0;         // eod tokens included
  uint64_t text_bytes = 0;    // of document text tokenized
  uint64_t input_bytes = 0;   // of the input files
  double seconds = 0;
  int workers = 0;
  data::IndexedDType dtype = data::IndexedDType::uint16;
  data::IndexedSidecar sidecar;
};

// Prepares the dataset. `progress` is called from the calling thread about twice a second and
// once at the end. Throws PrepareError for bad input (exit 2), files::FileError for a failure to
// write (exit 1).
PrepareSummary prepare_dataset(const PrepareOptions& options,
                               const std::function<void(const PrepareProgress&)>& progress = {});

}  // namespace trainctl::prepare
