// Building a Recipe: read the YAML, collect one entry per key (file first, --set on top), convert
// each through the schema, fill defaults and presets, check the cross-field rules, and report every
// problem at once.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "recipe/internal.hpp"

namespace trainctl::recipe {
namespace {

using internal::closest;

// Where a key's value came from: a position in the file, or one --set argument.
struct Origin {
  int line = 0, col = 0;     // 1-based; 0 when unknown
  std::string override_arg;  // "model.hidden=256" when from --set
};

struct Entry {
  YAML::Node node;
  Origin origin;
};

std::vector<std::string_view> all_paths() {
  std::vector<std::string_view> out;
  for (const auto& k : schema())
    out.push_back(k.path);
  return out;
}

class Loader {
 public:
  explicit Loader(std::string file) : file_(std::move(file)) {}

  void read_text(std::string_view text);
  void read_override(const std::string& arg);
  Recipe build();
  std::vector<Problem> problems;

 private:
  void report(const Origin& origin, std::string message);
  void report_at(const YAML::Mark& mark, std::string message);
  void read_section(std::string_view section, const YAML::Node& map);
  void add_entry(const KeySpec& key, const YAML::Node& key_node, const YAML::Node& value);
  std::string unknown_key_message(std::string_view section, std::string_view leaf) const;

  std::string file_;
  std::map<std::string_view, Entry> entries_;  // by key path; --set replaces the file's entry
  std::vector<std::string_view> bad_;          // keys whose value could not be used
  bool unreadable_ = false;  // the YAML could not be parsed as a map: nothing else is worth saying
};

Origin origin_of(const YAML::Mark& mark) {
  if (mark.is_null()) return {};
  return {mark.line + 1, mark.column + 1, ""};
}

void Loader::report(const Origin& origin, std::string message) {
  if (!origin.override_arg.empty())
    problems.push_back({"", 0, 0, fmt::format("--set {}: {}", origin.override_arg, message)});
  else
    problems.push_back({file_, origin.line, origin.col, std::move(message)});
}

void Loader::report_at(const YAML::Mark& mark, std::string message) {
  report(origin_of(mark), std::move(message));
}

void Loader::read_text(std::string_view text) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::ParserException& e) {
    report_at(e.mark, fmt::format("YAML syntax error: {}", e.msg));
    unreadable_ = true;
    return;
  }
  if (root.IsNull()) return;  // empty file: only "missing name" will be reported
  if (!root.IsMap()) {
    report_at(root.Mark(), "a recipe is a map of sections (name:, model:, training:, ...)");
    unreadable_ = true;
    return;
  }
  std::vector<std::string_view> top;
  for (const auto& k : schema())
    if (k.section().empty()) top.push_back(k.path);
  for (auto s : section_names())
    top.push_back(s);

  std::map<std::string, int> seen;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it->first.Scalar();
    auto [first, inserted] = seen.emplace(name, it->first.Mark().line + 1);
    if (!inserted) {
      report_at(it->first.Mark(), fmt::format("duplicate section '{}' (first at line {}); merge "
                                              "them",
                                              name, first->second));
      continue;
    }
    if (const KeySpec* key = find_key(name); key && key->section().empty()) {
      add_entry(*key, it->first, it->second);
    } else if (std::find(top.begin(), top.end(), name) != top.end()) {
      read_section(name, it->second);
    } else {
      std::string guess = closest(name, top);
      if (guess.empty())
        for (const auto& k : schema())
          if (k.leaf() == name) guess = std::string(k.path);
      report_at(it->first.Mark(),
                guess.empty()
                    ? fmt::format("unknown section '{}'; the sections are: {}", name,
                                  fmt::join(top, ", "))
                    : fmt::format("unknown section '{}'; did you mean '{}'?", name, guess));
    }
  }
}

void Loader::read_section(std::string_view section, const YAML::Node& map) {
  if (map.IsNull()) return;
  if (!map.IsMap()) {
    report_at(map.Mark(), fmt::format("section '{}' must be a map of keys, e.g. `{}: {{key: "
                                      "value}}`",
                                      section, section));
    return;
  }
  std::map<std::string, int> seen;
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string& leaf = it->first.Scalar();
    std::string path = fmt::format("{}.{}", section, leaf);
    auto [first, inserted] = seen.emplace(leaf, it->first.Mark().line + 1);
    if (!inserted) {
      report_at(it->first.Mark(), fmt::format("duplicate key '{}' (first at line {}); keep one",
                                              path, first->second));
    } else if (const KeySpec* key = find_key(path)) {
      add_entry(*key, it->first, it->second);
    } else {
      report_at(it->first.Mark(), unknown_key_message(section, leaf));
    }
  }
}

std::string Loader::unknown_key_message(std::string_view section, std::string_view leaf) const {
  std::vector<std::string_view> same_section;
  for (const auto& k : schema())
    if (k.section() == section) same_section.push_back(k.leaf());
  std::string guess = closest(leaf, same_section);
  if (!guess.empty()) guess = fmt::format("{}.{}", section, guess);
  for (const auto& k : schema())  // the right key in the wrong section
    if (guess.empty() && k.leaf() == leaf) guess = std::string(k.path);
  if (guess.empty())
    return fmt::format("unknown key '{}.{}'; the keys of '{}' are: {}", section, leaf, section,
                       fmt::join(same_section, ", "));
  return fmt::format("unknown key '{}.{}'; did you mean '{}'?", section, leaf, guess);
}

void Loader::add_entry(const KeySpec& key, const YAML::Node& key_node, const YAML::Node& value) {
  // A value with nothing after the colon has its mark on the next line: point at the key instead.
  const YAML::Mark mark = value.IsNull() ? key_node.Mark() : value.Mark();
  entries_[key.path] = {value, origin_of(mark)};
}

void Loader::read_override(const std::string& arg) {
  Origin origin{0, 0, arg};
  auto eq = arg.find('=');
  if (eq == std::string::npos) {
    report(origin, "expected KEY=VALUE, e.g. --set model.layers=8");
    return;
  }
  std::string path = arg.substr(0, eq);
  const KeySpec* key = find_key(path);
  if (!key) {
    auto sections = section_names();
    if (std::find(sections.begin(), sections.end(), path) != sections.end()) {
      report(origin,
             fmt::format("'{}' is a section; set one key, e.g. --set {}.KEY=VALUE", path, path));
      return;
    }
    std::string guess = closest(path, all_paths());
    report(origin, guess.empty()
                       ? fmt::format("unknown key '{}'; see trainctl validate --explain", path)
                       : fmt::format("unknown key '{}'; did you mean '{}'?", path, guess));
    return;
  }
  try {
    entries_[key->path] = {YAML::Load(arg.substr(eq + 1)), origin};
  } catch (const YAML::ParserException& e) {
    report(origin, fmt::format("YAML syntax error in the value: {}", e.msg));
  }
}

Recipe Loader::build() {
  if (unreadable_) throw RecipeError(std::move(problems));
  Recipe recipe{};
  for (const auto& key : schema())
    if (!key.preset) key.store(recipe, key.default_value);

  std::vector<std::string_view> given;
  for (const auto& [path, entry] : entries_) {
    const KeySpec& key = *find_key(path);
    internal::Converted converted = internal::convert_node(key, entry.node);
    if (converted.value) {
      key.store(recipe, *converted.value);
      given.push_back(key.path);
    } else {
      report(entry.origin, entry.origin.override_arg.empty()
                               ? fmt::format("{}: {}", key.path, converted.error)
                               : converted.error);
      bad_.push_back(key.path);
    }
  }
  for (const auto& key : schema()) {
    bool set = std::find(given.begin(), given.end(), key.path) != given.end();
    bool bad = std::find(bad_.begin(), bad_.end(), key.path) != bad_.end();
    if (key.required && !set && !bad) {
      report({}, fmt::format("missing required key '{}' ({}); add e.g. `{}: my-run`", key.path,
                             key.help, key.path));
      bad_.push_back(key.path);
    }
  }

  // Presets: an unset preset key is only as good as the keys its preset value is computed from.
  apply_preset(recipe.model, given);
  auto is_bad = [&](std::string_view p) {
    return std::find(bad_.begin(), bad_.end(), p) != bad_.end();
  };
  auto is_given = [&](std::string_view p) {
    return std::find(given.begin(), given.end(), p) != given.end();
  };
  for (const auto& key : schema()) {
    if (!key.preset || is_given(key.path)) continue;
    bool from_bad = is_bad("model.arch") ||
                    (key.path == "model.kv_heads" && is_bad("model.heads")) ||
                    (key.path == "model.ffn_hidden" && is_bad("model.hidden"));
    if (from_bad) bad_.push_back(key.path);
  }

  auto usable = [&](std::string_view p) { return !is_bad(p); };
  for (auto& violation : internal::check_rules(recipe, usable)) {
    Origin where;
    for (auto k : violation.keys) {
      if (auto it = entries_.find(k); it != entries_.end() && is_given(k)) {
        where = it->second.origin;
        break;
      }
    }
    report(where, violation.message);
  }

  if (!problems.empty()) throw RecipeError(std::move(problems));
  return recipe;
}

}  // namespace

std::string format_problem(const Problem& p) {
  if (p.file.empty()) return fmt::format("error: {}", p.message);
  if (p.line == 0) return fmt::format("{}: error: {}", p.file, p.message);
  return fmt::format("{}:{}:{}: error: {}", p.file, p.line, p.col, p.message);
}

namespace {
std::string join_problems(const std::vector<Problem>& problems) {
  std::string out;
  for (const auto& p : problems) {
    if (!out.empty()) out += '\n';
    out += format_problem(p);
  }
  return out;
}
std::vector<Problem> sorted(std::vector<Problem> problems) {
  std::stable_sort(problems.begin(), problems.end(), [](const Problem& a, const Problem& b) {
    bool a_set = a.file.empty(), b_set = b.file.empty();  // --set problems come last, in order
    if (a_set != b_set) return b_set;
    if (a_set) return false;
    return std::pair(a.line, a.col) < std::pair(b.line, b.col);
  });
  return problems;
}
}  // namespace

RecipeError::RecipeError(std::vector<Problem> problems)
    : std::runtime_error(join_problems(sorted(problems))), problems_(sorted(std::move(problems))) {}

Recipe parse_recipe(std::string_view yaml_text, const std::string& file_label,
                    const std::vector<std::string>& overrides) {
  Loader loader(file_label);
  loader.read_text(yaml_text);
  for (const auto& arg : overrides)
    loader.read_override(arg);
  return loader.build();
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto fail = [&](std::string message) -> Recipe {
    throw RecipeError({{path, 0, 0, std::move(message)}});
  };
  if (!fs::exists(path, ec)) return fail("no such file; check the recipe path");
  if (fs::is_directory(path, ec))
    return fail("is a directory; give the path of a recipe .yaml file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(fmt::format("cannot be read ({})", std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return fail(fmt::format("cannot be read ({})", std::strerror(errno)));
  return parse_recipe(text.str(), path, overrides);
}

}  // namespace trainctl::recipe
