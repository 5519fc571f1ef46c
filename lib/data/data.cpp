#include "data/data.hpp"

#include <fmt/format.h>

namespace trainctl::data {

std::string_view source_kind_name(SourceKind kind) {
  switch (kind) {
    case SourceKind::synthetic:
      return "synthetic";
    case SourceKind::text:
      return "text";
    case SourceKind::llmc:
      return "llmc";
  }
  return "unknown";
}

SourceKind parse_source_kind(std::string_view name) {
  for (SourceKind kind : {SourceKind::synthetic, SourceKind::text, SourceKind::llmc}) {
    if (name == source_kind_name(kind)) return kind;
  }
  throw DataError(fmt::format(
      "unknown data source kind '{}'; use one of synthetic, text (bytes of a file), llmc (llm.c "
      ".bin token shards)",
      name));
}

std::shared_ptr<const TokenSource> open_source(SourceKind kind, const std::string& path) {
  if (path.empty()) {
    throw DataError(fmt::format("{} data needs a path; set the data path (e.g. {} for text)",
                                source_kind_name(kind), kBundledTextPath));
  }
  switch (kind) {
    case SourceKind::text:
      return std::make_shared<TextSource>(path);
    case SourceKind::llmc:
      return std::make_shared<LlmcShardSource>(expand_shard_pattern(path));
    case SourceKind::synthetic:
      break;
  }
  throw DataError("synthetic data has no path; open it with SyntheticSource or open_dataset");
}

Dataset open_dataset(const DataConfig& config, const SyntheticConfig& synthetic) {
  std::shared_ptr<const TokenSource> all;
  if (config.source == SourceKind::synthetic) {
    if (!config.val_path.empty()) {
      throw DataError(fmt::format(
          "synthetic data takes no validation path (got '{}'); remove it: the validation tokens "
          "are held out from the synthetic stream",
          config.val_path));
    }
    all = std::make_shared<SyntheticSource>(synthetic.seed, synthetic.vocab_size,
                                            synthetic.num_tokens, synthetic.branching);
  } else {
    all = open_source(config.source, config.path);
    if (!config.val_path.empty()) return Dataset{all, open_source(config.source, config.val_path)};
  }
  HoldoutSplit split = split_holdout(all, config.val_fraction);
  return Dataset{split.train, split.val};
}

}  // namespace trainctl::data
