// lib/data: where training tokens come from and in which order they are read.
//
//   DataConfig (data/config.hpp) --open_dataset()--> Dataset{train, val} (TokenSources)
//   train --Sampler(seq_len, seed)--> next_batch / next_batch_slice (resumable via SamplerState)
//   val   --ValidationSet(seq_len)--> the same fixed batches every evaluation
//
// Depends only on the standard library and fmt; the recipe holds a DataConfig as its data section.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/config.hpp"
#include "data/indexed_dataset.hpp"
#include "data/sampler.hpp"
#include "data/sources.hpp"
#include "data/token_source.hpp"

namespace trainctl::data {

// The bundled default text (King James Bible, Genesis to Ruth; public domain), relative to the
// repository root. See data/README.md.
inline constexpr std::string_view kBundledTextPath = "data/kjv.txt";

// "synthetic", "text", "llmc", "megatron".
std::string_view source_kind_name(SourceKind kind);
// The inverse; throws DataError naming the accepted names for anything else.
SourceKind parse_source_kind(std::string_view name);

// One dataset of the recipe: its training and validation tokens and its weight in a blend.
struct DatasetPart {
  std::shared_ptr<const TokenSource> train;
  std::shared_ptr<const TokenSource> val;
  double weight = 1.0;
};

struct Dataset {
  std::vector<DatasetPart> parts;  // one, unless data.sources blends several

  // The parts as a Sampler (or ValidationSet) reads them; the sources stay owned by `parts`.
  std::vector<SamplerPart> train_parts() const;
  std::vector<SamplerPart> val_parts() const;
  // Tokens of all parts together.
  int64_t train_tokens() const;
  int64_t val_tokens() const;
  // One line for the log: the source, or "a blend of N datasets: a (70%), b (30%)".
  std::string describe() const;
};

// Opens one source of `kind` at `path` (a glob for llmc, a prefix for megatron). Not for
// synthetic (no path).
std::shared_ptr<const TokenSource> open_source(SourceKind kind, const std::string& path);

// Opens the training and validation sources the config describes: from val_path when given,
// otherwise the last val_fraction of the training data (split_holdout), for each dataset of a
// blend (data.sources) alike; `synthetic` is used only when config.source is synthetic. Throws
// DataError for a missing path, a val_path on synthetic data or with a blend, or any problem with
// the files.
Dataset open_dataset(const DataConfig& config, const SyntheticConfig& synthetic = {});

}  // namespace trainctl::data
