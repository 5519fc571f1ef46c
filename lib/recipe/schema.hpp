// The recipe schema: every key declared once, in one table, with its type, default, allowed values
// and one line of help. Loading, defaults, range checks, `trainctl validate --explain` and the dump
// are all driven by this table, so adding a key is one row here plus the member it binds to: in the
// config struct of the module that uses it (model/config.hpp, data/config.hpp, train/config.hpp)
// or in one of recipe.hpp's own sections. Defaults that depend on model.arch come from the preset
// table (ArchPreset), the only other place a default is written.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "recipe/recipe.hpp"

namespace trainctl::recipe {

// The type of a key, deduced from its struct member.
enum class Kind {
  integer,
  number,
  boolean,
  string,
  choice,
  number_pair,
  loss_scale,
  integer_list,
  blend_list  // data.sources: a list of {path, weight}
};

// A key's value between parsing and storing. integer and choice (index into choices) use int64_t.
using Value = std::variant<int64_t, double, bool, std::string, std::array<double, 2>, LossScale,
                           std::vector<int64_t>, std::vector<data::BlendItem>>;

// Allowed numeric interval; an absent bound is unbounded. Applies to each element of a number_pair
// or an integer_list, and to the number of a fixed loss_scale.
struct Range {
  std::optional<double> low, high;
  bool low_open = false, high_open = false;
  bool contains(double x) const;
  std::string describe() const;  // ">= 1", "> 0", "[0, 0.5]", "(0, 1]"; "" when unbounded
};

struct KeySpec {
  std::string_view path;  // "model.layers"; "name" for the one top-level key
  Kind kind;
  Value default_value = int64_t{0};  // unused when `preset` or `required`
  bool preset = false;               // default comes from model.arch (see ArchPreset)
  bool required = false;             // no default: the recipe must set it
  Range range;
  std::span<const std::string_view> choices;  // Kind::choice
  int64_t integer_max = 0;                    // Kind::integer: the largest value the member holds
  // Extra per-key rule (e.g. the name pattern): returns "" when ok, else the problem text.
  std::string (*check)(const Value&) = nullptr;
  std::string_view allowed_doc;  // replaces the generated "allowed" column when set
  std::string_view help;
  void (*store)(Recipe&, const Value&) = nullptr;
  Value (*fetch)(const Recipe&) = nullptr;

  std::string_view section() const;  // "model"; "" for top-level keys
  std::string_view leaf() const;     // "layers"
};

// All keys, in the order the dump and --explain print them (sections in Recipe member order).
const std::vector<KeySpec>& schema();
// The key with this full path, or nullptr.
const KeySpec* find_key(std::string_view path);
// Section names in order ("model", "moe", ...), without the top-level keys.
const std::vector<std::string_view>& section_names();

// What model.arch fills in for the keys the recipe leaves unset. One row per arch.
struct ArchPreset {
  Arch arch;
  Norm norm;
  Activation activation;
  Position position;
  bool tied_embeddings;
  bool bias;
  int (*kv_heads)(const ModelConfig&);
  int (*ffn_hidden)(const ModelConfig&);
  std::string_view kv_heads_doc, ffn_hidden_doc;
};
const ArchPreset& arch_preset(Arch arch);
// The presets' default for one preset key, as text for --explain ("gpt: layernorm; llama:
// rmsnorm").
std::string preset_doc(const KeySpec& key);
// Fills the preset keys of `model` that are not in `given` (full paths like "model.norm").
void apply_preset(ModelConfig& model, const std::vector<std::string_view>& given);

// The value as YAML text: what the dump writes and what parsing reads back to the same value.
std::string format_value(const KeySpec& key, const Value& value);
std::string_view kind_name(Kind kind);  // "int", "float", "bool", ...

}  // namespace trainctl::recipe
