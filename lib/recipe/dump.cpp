// Printing a Recipe: the resolved YAML dump, its hash, the --explain table, plus the small derived
// quantities on Recipe itself.
#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include "recipe/internal.hpp"

namespace trainctl::recipe {

int Recipe::world_size() const {
  return parallel.world_size();
}
int Recipe::data_parallel_size() const {
  return parallel.dp * parallel.ep;
}
int Recipe::grad_accum_steps() const {
  return training.global_batch / (training.micro_batch * data_parallel_size());
}
int64_t Recipe::tokens_per_step() const {
  return static_cast<int64_t>(training.global_batch) * model.seq_len;
}

Recipe default_recipe(Arch arch) {
  Recipe recipe{};
  for (const auto& key : schema())
    if (!key.preset) key.store(recipe, key.default_value);
  recipe.name = "default";
  recipe.model.arch = arch;
  recipe.data.source = DataSource::synthetic;
  apply_preset(recipe.model, {});
  return recipe;
}

std::string dump_recipe(const Recipe& recipe) {
  std::string out = "# resolved recipe: every key, defaults and presets filled in\n";
  std::string_view section;
  for (const auto& key : schema()) {
    if (key.section() == "parallel" && recipe.parallel.automatic) {
      if (section != "parallel") out += "parallel: auto\n";
      section = key.section();
      continue;
    }
    if (key.section() != section) {
      section = key.section();
      out += fmt::format("{}:\n", section);
    }
    out += fmt::format("{}{}: {}\n", section.empty() ? "" : "  ", key.leaf(),
                       format_value(key, key.fetch(recipe)));
  }
  return out;
}

std::string recipe_hash(const Recipe& recipe) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a 64 offset basis
  for (unsigned char c : dump_recipe(recipe)) {
    hash ^= c;
    hash *= 1099511628211ull;  // FNV-1a 64 prime
  }
  return fmt::format("{:016x}", hash);
}

std::string explain_table() {
  struct Row {
    std::string key, type, default_text, allowed, help;
  };
  std::vector<Row> rows{{"key", "type", "default", "allowed", "help"}};
  for (const auto& key : schema()) {
    Row row{std::string(key.path), std::string(kind_name(key.kind)), "", "", std::string(key.help)};
    if (key.required)
      row.default_text = "(required)";
    else if (key.preset)
      row.default_text = "(preset) " + preset_doc(key);
    else
      row.default_text = format_value(key, key.default_value);
    if (!key.allowed_doc.empty())
      row.allowed = key.allowed_doc;
    else if (key.kind == Kind::choice)
      row.allowed = fmt::format("{}", fmt::join(key.choices, " | "));
    else if (key.kind == Kind::boolean)
      row.allowed = "true | false";
    else
      row.allowed = key.range.describe();
    if (key.kind == Kind::number_pair || key.kind == Kind::integer_list)
      row.allowed = "each " + row.allowed;
    rows.push_back(std::move(row));
  }
  std::size_t w[4] = {};
  for (const auto& r : rows) {
    w[0] = std::max(w[0], r.key.size());
    w[1] = std::max(w[1], r.type.size());
    w[2] = std::max(w[2], r.default_text.size());
    w[3] = std::max(w[3], r.allowed.size());
  }
  std::string out;
  for (const auto& r : rows)
    out += fmt::format("{:<{}}  {:<{}}  {:<{}}  {:<{}}  {}\n", r.key, w[0], r.type, w[1],
                       r.default_text, w[2], r.allowed, w[3], r.help);
  return out;
}

}  // namespace trainctl::recipe
