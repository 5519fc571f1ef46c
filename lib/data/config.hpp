// What data to read: the recipe's data section, filled directly by its schema (lib/recipe), and the
// settings of the synthetic source, which come from elsewhere in the recipe (the seed, the
// vocabulary). No dependencies, so the recipe can hold it without linking lib/data.
#pragma once

#include <cstdint>
#include <string>

namespace trainctl::data {

enum class SourceKind { synthetic, text, llmc };

struct DataConfig {
  SourceKind source = SourceKind::synthetic;
  std::string path;      // text: one file; llmc: a file or a glob such as "dir/train_*.bin"
  std::string val_path;  // text/llmc: separate validation data of the same kind; empty: holdout
  double val_fraction = 0.05;  // fraction of the tokens held out for validation when no val_path
  bool operator==(const DataConfig&) const = default;
};

// Successors of each token in the synthetic source's bigram table (SyntheticSource).
inline constexpr int32_t kDefaultBranching = 4;

// The synthetic source (see SyntheticSource in data/sources.hpp).
struct SyntheticConfig {
  uint64_t seed = 1234;
  int32_t vocab_size = 256;
  int64_t num_tokens = int64_t{1} << 20;
  int32_t branching = kDefaultBranching;
};

}  // namespace trainctl::data
