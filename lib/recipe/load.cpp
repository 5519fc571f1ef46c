// Building a Recipe: read the YAML, collect one entry per key (file first, --set on top), convert
// each through the schema, fill defaults and presets, check the cross-field rules and the data
// files, and report every problem at once, each at the place the user wrote the value (Origins).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/depthguard.h>

#include "files/files.hpp"
#include "recipe/internal.hpp"

namespace trainctl::recipe {
namespace {

// The parallel.* keys `parallel: auto` hands to the planner: the layout. The timeout and the
// overlap of gradient reduction are not part of it.
bool planner_chooses(std::string_view path) {
  return path.starts_with("parallel.") && path != "parallel.timeout_s" &&
         path != "parallel.overlap_grad_sync";
}

struct Entry {
  YAML::Node node;
  KeyOrigin origin;
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
  LoadedRecipe build();
  std::vector<Problem> problems;

 private:
  void report(const KeyOrigin& origin, std::string message);
  void report_at(const YAML::Mark& mark, std::string message);
  void read_section(std::string_view section, const YAML::Node& map);
  void add_entry(const KeySpec& key, const YAML::Node& key_node, const YAML::Node& value);
  std::string unknown_key_message(std::string_view section, std::string_view leaf) const;
  std::string unknown_top_message(const std::string& name,
                                  const std::vector<std::string_view>& sections,
                                  const std::vector<std::string_view>& top_keys) const;

  std::string file_;
  std::map<std::string_view, Entry> entries_;  // by key path; --set replaces the file's entry
  std::vector<std::string_view> bad_;          // keys whose value could not be used
  int num_overrides_ = 0;                      // --set arguments read so far
  bool unreadable_ = false;  // the YAML could not be parsed as a map: nothing else is worth saying
  bool parallel_auto_ = false;  // `parallel: auto` (or --set parallel=auto): the planner decides
};

KeyOrigin origin_of(const YAML::Mark& mark) {
  KeyOrigin origin;
  if (mark.is_null()) return origin;
  origin.source = KeyOrigin::Source::file;
  origin.line = mark.line + 1;
  origin.col = mark.column + 1;
  return origin;
}

void Loader::report(const KeyOrigin& origin, std::string message) {
  if (origin.source == KeyOrigin::Source::set)
    problems.push_back({"", 0, 0, fmt::format("--set {}: {}", origin.set_arg, message)});
  else
    problems.push_back({file_, origin.line, origin.col, std::move(message)});
}

// The first tab in the indentation of `error_line` (0-based, as in YAML::Mark) or of the line
// before it (yaml-cpp's mark can land one line late): {line, col}, 1-based; {0, 0} when none.
// yaml-cpp reports a tab-indented line as "illegal map value" at some column, which hides the
// cause.
std::pair<int, int> indentation_tab(std::string_view text, int error_line) {
  std::vector<std::string_view> lines;
  for (std::size_t start = 0; start <= text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  for (int line = error_line; line >= 0 && line >= error_line - 1; --line) {
    if (line >= static_cast<int>(lines.size())) continue;
    std::string_view l = lines[line];
    std::size_t indent_end = l.find_first_not_of(" \t");
    std::size_t tab = l.substr(0, indent_end).find('\t');
    if (tab != std::string_view::npos) return {line + 1, static_cast<int>(tab) + 1};
  }
  return {0, 0};
}

// Where the second document of a file starts: the "---" that opens it (the last one at or before
// its first node; the last one of the file when it is empty).
KeyOrigin second_document_origin(std::string_view text, const YAML::Node& second) {
  const int node_line =
      second.Mark().is_null() ? std::numeric_limits<int>::max() : second.Mark().line + 1;
  KeyOrigin at;
  at.source = KeyOrigin::Source::file;
  int line = 1;
  size_t start = 0;
  while (start <= text.size() && line <= node_line) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    if (text.substr(start, end - start).starts_with("---")) {
      at.line = line;
      at.col = 1;
    }
    start = end + 1;
    ++line;
  }
  return at;
}

void Loader::report_at(const YAML::Mark& mark, std::string message) {
  report(origin_of(mark), std::move(message));
}

void Loader::read_text(std::string_view text) {
  YAML::Node root;
  try {
    // Every document is read, so a second one is refused instead of silently ignored.
    std::vector<YAML::Node> documents = YAML::LoadAll(std::string(text));
    if (documents.size() > 1) {
      unreadable_ = true;
      report(second_document_origin(text, documents[1]),
             fmt::format("a recipe is one YAML document, and this file holds {} (separated by "
                         "---); keep one recipe per file and remove the others",
                         documents.size()));
      return;
    }
    if (!documents.empty()) root = documents.front();
  } catch (const YAML::DeepRecursion& e) {
    unreadable_ = true;
    report_at(e.mark, fmt::format("YAML nested {} levels deep, more than a parser may follow; a "
                                  "recipe needs a few levels: flatten it",
                                  e.depth()));
    return;
  } catch (const YAML::ParserException& e) {
    unreadable_ = true;
    if (auto [line, col] = indentation_tab(text, e.mark.line); line > 0) {
      KeyOrigin at;
      at.source = KeyOrigin::Source::file;
      at.line = line;
      at.col = col;
      report(at, "tabs are not allowed for YAML indentation; indent with spaces");
      return;
    }
    report_at(e.mark, fmt::format("YAML syntax error: {}", e.msg));
    return;
  }
  if (root.IsNull()) return;  // empty file: only "missing name" will be reported
  if (!root.IsMap()) {
    report_at(root.Mark(), "a recipe is a map of sections (name:, model:, training:, ...)");
    unreadable_ = true;
    return;
  }
  std::vector<std::string_view> top_keys;  // top-level keys that are not sections ("name")
  for (const auto& k : schema())
    if (k.section().empty()) top_keys.push_back(k.path);
  const std::vector<std::string_view>& sections = section_names();
  std::vector<std::string_view> top = top_keys;
  top.insert(top.end(), sections.begin(), sections.end());

  std::map<std::string, int> seen;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it->first.Scalar();
    auto [first, inserted] = seen.emplace(name, it->first.Mark().line + 1);
    const KeySpec* top_key = find_key(name);
    if (top_key && !top_key->section().empty()) top_key = nullptr;
    if (!inserted) {
      report_at(it->first.Mark(),
                top_key ? fmt::format("duplicate key '{}' (first at line {}); keep one", name,
                                      first->second)
                        : fmt::format("duplicate section '{}' (first at line {}); merge them", name,
                                      first->second));
      continue;
    }
    if (top_key) {
      add_entry(*top_key, it->first, it->second);
    } else if (std::find(top.begin(), top.end(), name) != top.end()) {
      read_section(name, it->second);
    } else {
      report_at(it->first.Mark(), unknown_top_message(name, sections, top_keys));
    }
  }
}

void Loader::read_section(std::string_view section, const YAML::Node& map) {
  if (map.IsNull()) return;
  if (section == "parallel" && map.IsScalar() && map.Scalar() == "auto") {
    parallel_auto_ = true;
    return;
  }
  if (!map.IsMap()) {
    report_at(
        map.Mark(),
        fmt::format(
            "section '{}' must be a map of keys, e.g. `{}: {{key: value}}`{}", section, section,
            section == "parallel" ? ", or `parallel: auto` to let the planner choose" : ""));
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

// A top-level name that is neither a section nor a top-level key. The near miss may be either.
std::string Loader::unknown_top_message(const std::string& name,
                                        const std::vector<std::string_view>& sections,
                                        const std::vector<std::string_view>& top_keys) const {
  std::vector<std::string_view> top = top_keys;
  top.insert(top.end(), sections.begin(), sections.end());
  std::string guess = closest(name, top);
  if (!guess.empty() && std::find(top_keys.begin(), top_keys.end(), guess) != top_keys.end())
    return fmt::format("unknown top-level key '{}'; did you mean '{}'?", name, guess);
  if (guess.empty())
    for (const auto& k : schema())  // a section's key written at the top level
      if (k.leaf() == name) guess = std::string(k.path);
  if (!guess.empty()) return fmt::format("unknown section '{}'; did you mean '{}'?", name, guess);
  return fmt::format("unknown section '{}'; the sections are: {} ('{}' is the only top-level key)",
                     name, fmt::join(sections, ", "), fmt::join(top_keys, "', '"));
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
  KeyOrigin origin;
  origin.source = KeyOrigin::Source::set;
  origin.set_arg = arg;
  origin.set_index = num_overrides_++;
  auto eq = arg.find('=');
  if (eq == std::string::npos) {
    report(origin, "expected KEY=VALUE, e.g. --set model.layers=8");
    return;
  }
  std::string path = arg.substr(0, eq);
  if (path == "parallel" && arg.substr(eq + 1) == "auto") {
    // Replaces the file's parallel section (a later --set parallel.KEY still conflicts).
    parallel_auto_ = true;
    std::erase_if(entries_, [](const auto& entry) {
      return planner_chooses(entry.first) && entry.second.origin.source == KeyOrigin::Source::file;
    });
    return;
  }
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

LoadedRecipe Loader::build() {
  if (unreadable_) throw RecipeError(std::move(problems));
  std::map<std::string, KeyOrigin, std::less<>> set_keys;
  for (const auto& [path, entry] : entries_)
    set_keys.emplace(path, entry.origin);
  Origins origins(file_, std::move(set_keys));
  Recipe recipe{};
  for (const auto& key : schema())
    if (!key.preset) key.store(recipe, key.default_value);
  recipe.parallel.automatic = parallel_auto_;
  if (parallel_auto_)
    for (const auto& [path, entry] : entries_)
      if (planner_chooses(path))
        problems.push_back(origins.problem(
            path,
            "`parallel: auto` lets the planner choose every parallel.* key; remove this key "
            "or the `auto`"));

  std::vector<std::string_view> given;
  for (const auto& [path, entry] : entries_) {
    const KeySpec& key = *find_key(path);
    internal::Converted converted = internal::convert_node(key, entry.node);
    if (converted.value) {
      key.store(recipe, *converted.value);
      given.push_back(key.path);
    } else {
      problems.push_back(origins.problem(key.path, converted.error));
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

  // model.init_from: the model keys come from the source; a key the recipe sets must agree.
  if (std::find(given.begin(), given.end(), "model.init_from") != given.end() &&
      !recipe.model.init_from.empty()) {
    const internal::InitFromKeys source = internal::init_from_keys(recipe.model.init_from);
    const std::vector<std::string_view> fixed = internal::init_from_key_paths();
    const bool complete = std::all_of(fixed.begin(), fixed.end(), [&](std::string_view p) {
      return std::find(given.begin(), given.end(), p) != given.end();
    });
    // A resolved recipe (a resume's) sets every key: a source gone since is the run's business
    // (check_session_input refuses it for a fresh run, a resume does not read it).
    if (!source.error.empty() && !complete) {
      problems.push_back(origins.problem("model.init_from", source.error));
      bad_.push_back("model.init_from");
    }
    for (const auto& [path, text] : source.keys) {
      const KeySpec& key = *find_key(path);
      internal::Converted value = internal::convert_node(key, YAML::Load(text));
      if (!value.value) {
        problems.push_back(
            origins.problem("model.init_from",
                            fmt::format("{}: {} = {}: {}", source.where, path, text, value.error)));
        continue;
      }
      if (std::find(given.begin(), given.end(), key.path) == given.end()) {
        key.store(recipe, *value.value);
        given.push_back(key.path);
        continue;
      }
      const std::string ours = format_value(key, key.fetch(recipe));
      const std::string theirs = format_value(key, *value.value);
      if (ours != theirs)
        problems.push_back(origins.problem(
            key.path,
            fmt::format("{} is {} here but {} in {} (model.init_from); remove the key to take "
                        "the source's value, or set {}: {}",
                        key.path, ours, theirs, source.where, key.path, theirs)));
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
  for (auto& violation : internal::check_rules(recipe, usable))
    problems.push_back(origins.rule_problem(violation.keys, std::move(violation.message)));

  if (usable("data.source") && recipe.data.source != DataSource::synthetic) {
    for (std::string_view key : {"data.path", "data.val_path"}) {
      const std::string& path = key == "data.path" ? recipe.data.path : recipe.data.val_path;
      if (!usable(key) || path.empty()) continue;
      std::string error = internal::check_data_file(recipe.data.source, path);
      if (!error.empty()) problems.push_back(origins.problem(key, std::move(error)));
    }
    if (usable("data.sources"))
      for (const data::BlendItem& item : recipe.data.sources) {
        std::string error = internal::check_data_file(recipe.data.source, item.path);
        if (!error.empty()) problems.push_back(origins.problem("data.sources", std::move(error)));
      }
  }

  if (!problems.empty()) throw RecipeError(std::move(problems));
  return {std::move(recipe), std::move(origins)};
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

std::string format_report(const std::vector<Problem>& problems, std::string_view recipe_path) {
  std::string out;
  for (const auto& p : problems)
    out += format_problem(p) + '\n';
  out += fmt::format("{} problem{} in {}\n", problems.size(), problems.size() == 1 ? "" : "s",
                     recipe_path);
  return out;
}

RecipeError::RecipeError(std::vector<Problem> problems)
    : std::runtime_error(join_problems(sorted(problems))), problems_(sorted(std::move(problems))) {}

LoadedRecipe parse_recipe_with_origins(std::string_view yaml_text, const std::string& file_label,
                                       const std::vector<std::string>& overrides) {
  Loader loader(file_label);
  loader.read_text(yaml_text);
  for (const auto& arg : overrides)
    loader.read_override(arg);
  return loader.build();
}

Recipe parse_recipe(std::string_view yaml_text, const std::string& file_label,
                    const std::vector<std::string>& overrides) {
  return parse_recipe_with_origins(yaml_text, file_label, overrides).recipe;
}

LoadedRecipe load_recipe_with_origins(const std::string& path,
                                      const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto fail = [&](std::string message) -> LoadedRecipe {
    throw RecipeError({{path, 0, 0, std::move(message)}});
  };
  if (!fs::exists(path, ec)) return fail("no such file; check the recipe path");
  if (fs::is_directory(path, ec))
    return fail("is a directory; give the path of a recipe .yaml file");
  // Without blocking (a FIFO in the recipe's place), and refused above the limit before a byte
  // is parsed: YAML costs about a hundred times its text in memory.
  std::string text;
  try {
    text = files::read_regular_file(path, kMaxRecipeBytes, "recipe");
  } catch (const files::FileError& e) {
    if (e.os_error() != 0)
      return fail(fmt::format("cannot be read ({})", std::strerror(e.os_error())));
    return fail(e.reason());  // the problem names the file already
  }
  return parse_recipe_with_origins(text, path, overrides);
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  return load_recipe_with_origins(path, overrides).recipe;
}

}  // namespace trainctl::recipe
