// Where each key's value came from, and problems located there. The loader fills an Origins while
// it reads the file and the --set arguments; callers use it for problems found after loading.
#include <stdexcept>

#include <fmt/format.h>

#include "recipe/schema.hpp"

namespace trainctl::recipe {

Origins::Origins(std::string file, std::map<std::string, KeyOrigin, std::less<>> set_keys)
    : file_(std::move(file)), set_keys_(std::move(set_keys)) {}

KeyOrigin Origins::of(std::string_view key_path) const {
  const KeySpec* key = find_key(key_path);
  if (!key)
    throw std::invalid_argument(fmt::format(
        "Origins: '{}' is not a recipe key (see trainctl validate --explain)", key_path));
  if (auto it = set_keys_.find(key_path); it != set_keys_.end()) return it->second;
  KeyOrigin origin;
  origin.source = key->preset ? KeyOrigin::Source::preset : KeyOrigin::Source::default_value;
  return origin;
}

std::string Origins::describe(std::string_view key_path) const {
  const KeyOrigin origin = of(key_path);
  switch (origin.source) {
    case KeyOrigin::Source::file:
      return fmt::format("{}:{}:{}", file_, origin.line, origin.col);
    case KeyOrigin::Source::set:
      return fmt::format("--set {}", origin.set_arg);
    case KeyOrigin::Source::preset:
      return "preset";
    case KeyOrigin::Source::default_value:
      return "default";
  }
  return "default";
}

Problem Origins::located(const KeyOrigin& origin, std::string message) const {
  if (origin.source == KeyOrigin::Source::set)
    return {"", 0, 0, fmt::format("--set {}: {}", origin.set_arg, message)};
  if (origin.source == KeyOrigin::Source::file)
    return {file_, origin.line, origin.col, std::move(message)};
  return {file_, 0, 0, std::move(message)};
}

Problem Origins::problem(std::string_view key_path, std::string message) const {
  const KeyOrigin origin = of(key_path);
  // A --set names its key already; elsewhere the key is named as in the loader's value problems.
  if (origin.source == KeyOrigin::Source::set) return located(origin, std::move(message));
  return located(origin, fmt::format("{}: {}", key_path, message));
}

std::string_view Origins::locate(const std::vector<std::string_view>& keys) const {
  std::string_view latest_set, first_in_file;
  int latest_index = -1;
  for (std::string_view key : keys) {
    const KeyOrigin origin = of(key);
    if (origin.source == KeyOrigin::Source::set && origin.set_index > latest_index) {
      latest_set = key;
      latest_index = origin.set_index;
    } else if (origin.source == KeyOrigin::Source::file && first_in_file.empty()) {
      first_in_file = key;
    }
  }
  return latest_set.empty() ? first_in_file : latest_set;
}

Problem Origins::rule_problem(const std::vector<std::string_view>& keys,
                              std::string message) const {
  std::string_view key = locate(keys);
  return located(key.empty() ? KeyOrigin{} : of(key), std::move(message));
}

}  // namespace trainctl::recipe
