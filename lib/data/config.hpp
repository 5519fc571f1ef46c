// What data to read: the recipe's data section, filled directly by its schema (lib/recipe), and the
// settings of the synthetic source, which come from elsewhere in the recipe (the seed, the
// vocabulary). No dependencies, so the recipe can hold it without linking lib/data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainctl::data {

enum class SourceKind { synthetic, text, llmc, megatron };

// One dataset of a blend (data.sources): read in proportion to its weight.
struct BlendItem {
  std::string path;
  double weight = 1.0;
  bool operator==(const BlendItem&) const = default;
};

struct DataConfig {
  SourceKind source = SourceKind::synthetic;
  // text: one file; llmc: a file or a glob such as "dir/train_*.bin"; megatron: an indexed
  // dataset's prefix (or its .bin or .idx).
  std::string path;
  // Instead of path: several datasets of this kind, each sample drawn from one of them in
  // proportion to the weights (Megatron's blended datasets). Each is split into training and
  // validation tokens by val_fraction.
  std::vector<BlendItem> sources;
  std::string val_path;        // separate validation data of the same kind; empty: holdout
  double val_fraction = 0.05;  // fraction of the tokens held out for validation when no val_path
  bool operator==(const DataConfig&) const = default;
};

// "data/kjv" for "data/kjv", "data/kjv.bin" or "data/kjv.idx": Megatron names an indexed
// dataset by its prefix, and data.path may name either file of the pair too.
inline std::string indexed_prefix(const std::string& path) {
  if (path.ends_with(".bin") || path.ends_with(".idx")) return path.substr(0, path.size() - 4);
  return path;
}

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
