// lib/data: where training tokens come from and in which order they are read.
//
//   DataConfig --open_dataset()--> Dataset{train, val} (TokenSources)
//   train --Sampler(seq_len, seed)--> next_batch / next_batch_slice (resumable via SamplerState)
//   val   --ValidationSet(seq_len)--> the same fixed batches every evaluation
//
// Depends only on the standard library and fmt; the caller converts its recipe into DataConfig.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "data/sampler.hpp"
#include "data/sources.hpp"
#include "data/token_source.hpp"

namespace trainctl::data {

// The bundled default text (King James Bible, Genesis to Ruth; public domain), relative to the
// repository root. See data/README.md.
inline constexpr std::string_view kBundledTextPath = "data/kjv.txt";

enum class SourceKind { synthetic, text, llmc };

// "synthetic", "text", "llmc".
std::string_view source_kind_name(SourceKind kind);
// The inverse; throws DataError naming the accepted names for anything else.
SourceKind parse_source_kind(std::string_view name);

struct DataConfig {
  SourceKind kind = SourceKind::synthetic;
  std::string path;      // text: one file; llmc: a file or a glob such as "dir/train_*.bin"
  std::string val_path;  // text/llmc: separate validation data of the same kind; empty: holdout
  double val_fraction = 0.05;  // fraction of the tokens held out for validation when no val_path
  // synthetic only (see SyntheticSource):
  uint64_t seed = 1234;
  int32_t vocab_size = 256;
  int64_t num_tokens = int64_t{1} << 20;
  int32_t branching = SyntheticSource::kDefaultBranching;
};

struct Dataset {
  std::shared_ptr<const TokenSource> train;
  std::shared_ptr<const TokenSource> val;
};

// Opens one source of `kind` at `path` (a glob for llmc). Not for synthetic (no path).
std::shared_ptr<const TokenSource> open_source(SourceKind kind, const std::string& path);

// Opens the training and validation sources the config describes: from val_path when given,
// otherwise the last val_fraction of the training data (split_holdout). Throws DataError for a
// missing path, a val_path on synthetic data, or any problem with the files.
Dataset open_dataset(const DataConfig& config);

}  // namespace trainctl::data
