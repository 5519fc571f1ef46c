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
    case SourceKind::megatron:
      return "megatron";
  }
  return "unknown";
}

SourceKind parse_source_kind(std::string_view name) {
  for (SourceKind kind :
       {SourceKind::synthetic, SourceKind::text, SourceKind::llmc, SourceKind::megatron}) {
    if (name == source_kind_name(kind)) return kind;
  }
  throw DataError(fmt::format(
      "unknown data source kind '{}'; use one of synthetic, text (bytes of a file), llmc (llm.c "
      ".bin token shards), megatron (a Megatron .bin/.idx indexed dataset)",
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
    case SourceKind::megatron:
      return std::make_shared<IndexedSource>(path);
    case SourceKind::synthetic:
      break;
  }
  throw DataError("synthetic data has no path; open it with SyntheticSource or open_dataset");
}

Dataset open_dataset(const DataConfig& config, const SyntheticConfig& synthetic) {
  if (config.source == SourceKind::synthetic) {
    if (!config.val_path.empty()) {
      throw DataError(fmt::format(
          "synthetic data takes no validation path (got '{}'); remove it: the validation tokens "
          "are held out from the synthetic stream",
          config.val_path));
    }
    auto all = std::make_shared<SyntheticSource>(synthetic.seed, synthetic.vocab_size,
                                                 synthetic.num_tokens, synthetic.branching);
    HoldoutSplit split = split_holdout(all, config.val_fraction);
    return Dataset{{{split.train, split.val, 1.0}}};
  }
  if (!config.sources.empty()) {
    if (!config.path.empty() || !config.val_path.empty())
      throw DataError(fmt::format(
          "a blend (data.sources) takes no data.path or data.val_path (got '{}'); each dataset of "
          "the blend holds out data.val_fraction for validation",
          config.path.empty() ? config.val_path : config.path));
    Dataset dataset;
    for (const BlendItem& item : config.sources) {
      HoldoutSplit split =
          split_holdout(open_source(config.source, item.path), config.val_fraction);
      dataset.parts.push_back({split.train, split.val, item.weight});
    }
    return dataset;
  }
  auto all = open_source(config.source, config.path);
  if (!config.val_path.empty())
    return Dataset{{{all, open_source(config.source, config.val_path), 1.0}}};
  HoldoutSplit split = split_holdout(all, config.val_fraction);
  return Dataset{{{split.train, split.val, 1.0}}};
}

std::vector<SamplerPart> Dataset::train_parts() const {
  std::vector<SamplerPart> out;
  for (const DatasetPart& part : parts)
    out.push_back({part.train.get(), part.weight});
  return out;
}

std::vector<SamplerPart> Dataset::val_parts() const {
  std::vector<SamplerPart> out;
  for (const DatasetPart& part : parts) {
    if (!part.val) return {};
    out.push_back({part.val.get(), part.weight});
  }
  return out;
}

int64_t Dataset::train_tokens() const {
  int64_t total = 0;
  for (const DatasetPart& part : parts)
    total += part.train->size();
  return total;
}

int64_t Dataset::val_tokens() const {
  int64_t total = 0;
  for (const DatasetPart& part : parts)
    total += part.val ? part.val->size() : 0;
  return total;
}

std::string Dataset::describe() const {
  if (parts.size() == 1) return parts[0].train->describe();
  double total = 0;
  for (const DatasetPart& part : parts)
    total += part.weight;
  std::string out = fmt::format("a blend of {} datasets:", parts.size());
  for (size_t i = 0; i < parts.size(); ++i)
    out += fmt::format("{} {} ({:.4g}%)", i ? "," : "", parts[i].train->describe(),
                       100 * parts[i].weight / total);
  return out;
}

}  // namespace trainctl::data
