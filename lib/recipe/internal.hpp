// Internals of lib/recipe shared between its .cpp files; not part of the public API (other modules
// include recipe.hpp and schema.hpp only). Keeps yaml-cpp out of the public headers.
#pragma once

#include "recipe/suggest.hpp"

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "recipe/schema.hpp"

namespace trainctl::recipe::internal {

// A YAML value converted to a key's type, or the reason it cannot be ("expected an integer, got
// 'abc'", "must be >= 1, got 0"), without the key name: callers prefix it with where it came from.
struct Converted {
  std::optional<Value> value;
  std::string error;
};
Converted convert_node(const KeySpec& key, const YAML::Node& node);

// The model keys a model.init_from source fixes, as (key path, YAML value text), read from its
// config.json or checkpoint manifest (ckpt::WeightSource); `error` says why it cannot be read.
struct InitFromKeys {
  std::vector<std::pair<std::string, std::string>> keys;
  std::string where;  // the file the values come from
  std::string error;
};
InitFromKeys init_from_keys(const std::string& path);
// Every key init_from_keys can fix. A recipe that sets them all (a run's resolved recipe.yaml)
// does not need the source to be loaded: resuming reads the run's checkpoints instead.
std::vector<std::string_view> init_from_key_paths();

// "0.001", "1e-05", "65536": shortest text that parses back to the same double.
std::string format_number(double x);

// A broken cross-field rule. `keys` lists the keys involved, most specific first: the problem is
// reported at Origins::locate(keys) (the latest --set among them, else the first the file sets).
struct RuleViolation {
  std::vector<std::string_view> keys;
  std::string message;
};
// Checks the cross-field rules on a recipe whose single values are in range. `usable(path)` is
// false for keys whose value was wrong (rules that involve them are skipped: their value is a
// placeholder, and one mistake should produce one message).
std::vector<RuleViolation> check_rules(const Recipe& recipe,
                                       const std::function<bool(std::string_view)>& usable);

// Whether the data file(s) at `path` (non-empty; source text or llmc) exist and can be read: ""
// when they do, else the problem without the key name ("'x.txt' does not exist (relative to
// /cwd)"). text: an existing, readable regular file. llmc: the same, or a glob (*, ?, [) that
// matches at least one regular file. Relative paths are taken from the current directory.
std::string check_data_file(DataSource source, const std::string& path);

}  // namespace trainctl::recipe::internal
