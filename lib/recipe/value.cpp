// Converting one YAML value to a key's type with its range and choices checked, and back to text.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "recipe/internal.hpp"
#include "recipe/suggest.hpp"

namespace trainctl::recipe {
namespace internal {
namespace {

std::string describe_node(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return fmt::format("'{}'", node.Scalar());
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "nothing";
  }
}

// What a value of this key looks like, for "expected X, got Y".
std::string expected_text(const KeySpec& key) {
  switch (key.kind) {
    case Kind::integer:
      return "an integer";
    case Kind::number:
      return "a number";
    case Kind::boolean:
      return "true or false";
    case Kind::string:
      return "a string";
    case Kind::choice:
      return fmt::format("one of {}", fmt::join(key.choices, " | "));
    case Kind::number_pair:
      return "a list of 2 numbers like [0.9, 0.95]";
    case Kind::loss_scale:
      return "dynamic, none or a number > 0";
    case Kind::integer_list:
      return "a list of integers like [2, 2]";
    case Kind::blend_list:
      return "a list of datasets like [{path: data/a, weight: 0.7}, {path: data/b, weight: 0.3}]";
  }
  return "?";
}

std::optional<double> parse_number(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  double x = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
  if (ec != std::errc{} || end != text.data() + text.size() || !std::isfinite(x)) return {};
  return x;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Optimal string alignment distance (Levenshtein plus adjacent transpositions).
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i)
    d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j)
    d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::string out_of_range(const Range& range, double x) {
  return fmt::format("must be {}, got {}", range.describe(), format_number(x));
}

Converted convert_scalar(const KeySpec& key, const YAML::Node& node) {
  const std::string& text = node.Scalar();
  switch (key.kind) {
    case Kind::integer: {
      std::string_view t = text;
      if (!t.empty() && t.front() == '+') t.remove_prefix(1);
      int64_t x = 0;
      auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), x);
      if (ec == std::errc::result_out_of_range)
        return {{}, fmt::format("must be <= {}, got {}", key.integer_max, text)};
      if (ec != std::errc{} || end != t.data() + t.size())
        return {{}, fmt::format("expected an integer, got '{}'", text)};
      if (x > key.integer_max)
        return {{}, fmt::format("must be <= {}, got {}", key.integer_max, x)};
      if (!key.range.contains(static_cast<double>(x)))
        return {{}, fmt::format("must be {}, got {}", key.range.describe(), x)};
      return {Value{x}, ""};
    }
    case Kind::number: {
      auto x = parse_number(text);
      if (!x) return {{}, fmt::format("expected a number, got '{}'", text)};
      if (!key.range.contains(*x)) return {{}, out_of_range(key.range, *x)};
      return {Value{*x}, ""};
    }
    case Kind::boolean: {
      std::string t = lower(text);
      if (t == "true" || t == "yes" || t == "on") return {Value{true}, ""};
      if (t == "false" || t == "no" || t == "off") return {Value{false}, ""};
      return {{}, fmt::format("expected true or false, got '{}'", text)};
    }
    case Kind::string:
      return {Value{text}, ""};
    case Kind::choice: {
      for (std::size_t i = 0; i < key.choices.size(); ++i)
        if (key.choices[i] == text) return {Value{static_cast<int64_t>(i)}, ""};
      std::string message =
          fmt::format("expected one of {}, got '{}'", fmt::join(key.choices, " | "), text);
      std::string guess = closest(text, {key.choices.begin(), key.choices.end()});
      if (!guess.empty()) message += fmt::format("; did you mean '{}'?", guess);
      return {{}, message};
    }
    case Kind::number_pair:
      return {{}, fmt::format("expected a list of 2 numbers like [0.9, 0.95], got '{}'", text)};
    case Kind::integer_list:
      return {{}, fmt::format("expected a list of integers like [2, 2], got '{}'", text)};
    case Kind::blend_list:
      return {{}, fmt::format("expected {}, got '{}'", expected_text(key), text)};
    case Kind::loss_scale: {
      if (text == "dynamic") return {Value{LossScale{LossScaleMode::dynamic, 0.0}}, ""};
      if (text == "none") return {Value{LossScale{LossScaleMode::none, 0.0}}, ""};
      auto x = parse_number(text);
      if (!x) return {{}, fmt::format("expected dynamic, none or a number > 0, got '{}'", text)};
      if (!key.range.contains(*x))
        return {{},
                fmt::format("a static loss scale must be {}, got {}", key.range.describe(),
                            format_number(*x))};
      return {Value{LossScale{LossScaleMode::fixed, *x}}, ""};
    }
  }
  return {{}, "unsupported key type"};
}

// data.sources: each item a map {path: text, weight: number > 0} (weight defaults to 1), or a
// bare path of weight 1.
Converted convert_blend_list(const YAML::Node& node) {
  std::vector<data::BlendItem> items;
  constexpr std::string_view kFields[] = {"path", "weight"};
  for (std::size_t i = 0; i < node.size(); ++i) {
    const YAML::Node& item = node[i];
    data::BlendItem blend;
    if (item.IsScalar()) {
      blend.path = item.Scalar();
    } else if (item.IsMap()) {
      for (const auto& field : item) {
        const std::string name = field.first.IsScalar() ? field.first.Scalar() : "?";
        if (std::find(std::begin(kFields), std::end(kFields), name) == std::end(kFields)) {
          std::string message = fmt::format(
              "item {}: unknown field '{}' (a dataset has path and "
              "weight)",
              i + 1, name);
          std::string guess = closest(name, {std::begin(kFields), std::end(kFields)});
          if (!guess.empty()) message += fmt::format("; did you mean '{}'?", guess);
          return {{}, message};
        }
      }
      if (!item["path"] || !item["path"].IsScalar())
        return {{},
                fmt::format("item {}: a dataset needs a path, like {{path: data/a, weight: "
                            "0.5}}",
                            i + 1)};
      blend.path = item["path"].Scalar();
      if (item["weight"]) {
        auto weight =
            item["weight"].IsScalar() ? parse_number(item["weight"].Scalar()) : std::nullopt;
        if (!weight)
          return {{},
                  fmt::format("item {}: weight: expected a number, got {}", i + 1,
                              describe_node(item["weight"]))};
        blend.weight = *weight;
      }
    } else {
      return {{},
              fmt::format("item {}: expected a dataset like {{path: data/a, weight: 0.5}}, "
                          "got {}",
                          i + 1, describe_node(item))};
    }
    if (blend.path.empty()) return {{}, fmt::format("item {}: the path is empty", i + 1)};
    if (!(blend.weight > 0))
      return {
          {},
          fmt::format("item {}: weight must be > 0, got {}", i + 1, format_number(blend.weight))};
    items.push_back(std::move(blend));
  }
  return {Value{std::move(items)}, ""};
}

}  // namespace

Converted convert_node(const KeySpec& key, const YAML::Node& node) {
  Converted result;
  if (key.kind == Kind::string && node.IsNull()) {
    result = {Value{std::string{}}, ""};  // `path:` with nothing after it is the empty string
  } else if (key.kind == Kind::number_pair && node.IsSequence()) {
    if (node.size() != 2)
      return {{},
              fmt::format("expected a list of 2 numbers like [0.9, 0.95], got {} item{}",
                          node.size(), node.size() == 1 ? "" : "s")};
    std::array<double, 2> pair{};
    for (std::size_t i = 0; i < 2; ++i) {
      auto x = node[i].IsScalar() ? parse_number(node[i].Scalar()) : std::nullopt;
      if (!x) return {{}, fmt::format("expected a number, got {}", describe_node(node[i]))};
      if (!key.range.contains(*x))
        return {
            {},
            fmt::format("each value must be {}, got {}", key.range.describe(), format_number(*x))};
      pair[i] = *x;
    }
    result = {Value{pair}, ""};
  } else if (key.kind == Kind::integer_list && node.IsSequence()) {
    std::vector<int64_t> list;
    for (std::size_t i = 0; i < node.size(); ++i) {
      KeySpec item = key;
      item.kind = Kind::integer;
      item.check = nullptr;
      if (!node[i].IsScalar())
        return {{},
                fmt::format("item {}: expected an integer, got {}", i + 1, describe_node(node[i]))};
      Converted x = convert_scalar(item, node[i]);
      if (!x.value) return {{}, fmt::format("item {}: {}", i + 1, x.error)};
      list.push_back(std::get<int64_t>(*x.value));
    }
    result = {Value{std::move(list)}, ""};
  } else if (key.kind == Kind::blend_list && node.IsSequence()) {
    Converted list = convert_blend_list(node);
    if (!list.value) return list;
    result = std::move(list);
  } else if (node.IsScalar()) {
    result = convert_scalar(key, node);
  } else {
    return {{}, fmt::format("expected {}, got {}", expected_text(key), describe_node(node))};
  }
  if (result.value && key.check) {
    std::string error = key.check(*result.value);
    if (!error.empty()) return {{}, error};
  }
  return result;
}

std::string format_number(double x) {
  return fmt::format("{}", x);
}

}  // namespace internal

std::string closest(std::string_view word, const std::vector<std::string_view>& candidates) {
  std::string best;
  std::size_t best_distance = 0;
  std::string w = internal::lower(word);
  for (auto c : candidates) {
    std::size_t d = internal::edit_distance(w, internal::lower(c));
    if (best.empty() || d < best_distance) {
      best = std::string(c);
      best_distance = d;
    }
  }
  std::size_t limit = word.size() <= 3 ? 1 : std::max<std::size_t>(2, word.size() / 3);
  return best_distance <= limit ? best : std::string{};
}

bool Range::contains(double x) const {
  if (low && (low_open ? x <= *low : x < *low)) return false;
  if (high && (high_open ? x >= *high : x > *high)) return false;
  return true;
}

std::string Range::describe() const {
  using internal::format_number;
  if (low && high)
    return fmt::format("in {}{}, {}{}", low_open ? '(' : '[', format_number(*low),
                       format_number(*high), high_open ? ')' : ']');
  if (low) return fmt::format("{} {}", low_open ? ">" : ">=", format_number(*low));
  if (high) return fmt::format("{} {}", high_open ? "<" : "<=", format_number(*high));
  return "";
}

std::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::integer:
      return "int";
    case Kind::number:
      return "float";
    case Kind::boolean:
      return "bool";
    case Kind::string:
      return "string";
    case Kind::choice:
      return "choice";
    case Kind::number_pair:
      return "[float, float]";
    case Kind::loss_scale:
      return "loss scale";
    case Kind::integer_list:
      return "[int, ...]";
    case Kind::blend_list:
      return "[{path, weight}, ...]";
  }
  return "?";
}

std::string format_value(const KeySpec& key, const Value& value) {
  using internal::format_number;
  // Floats keep a '.' or exponent so the dump shows them as floats; all round-trip exactly.
  auto as_float = [](double x) {
    std::string s = format_number(x);
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
    return s;
  };
  switch (key.kind) {
    case Kind::integer:
      return std::to_string(std::get<int64_t>(value));
    case Kind::number:
      return as_float(std::get<double>(value));
    case Kind::boolean:
      return std::get<bool>(value) ? "true" : "false";
    case Kind::choice:
      return std::string(key.choices[std::get<int64_t>(value)]);
    case Kind::number_pair: {
      const auto& p = std::get<std::array<double, 2>>(value);
      return fmt::format("[{}, {}]", as_float(p[0]), as_float(p[1]));
    }
    case Kind::integer_list:
      return fmt::format("[{}]", fmt::join(std::get<std::vector<int64_t>>(value), ", "));
    case Kind::blend_list: {
      std::vector<std::string> items;
      KeySpec path_key = key;
      path_key.kind = Kind::string;
      for (const data::BlendItem& item : std::get<std::vector<data::BlendItem>>(value))
        items.push_back(fmt::format("{{path: {}, weight: {}}}",
                                    format_value(path_key, Value{item.path}),
                                    as_float(item.weight)));
      return fmt::format("[{}]", fmt::join(items, ", "));
    }
    case Kind::loss_scale: {
      const auto& s = std::get<LossScale>(value);
      if (s.mode == LossScaleMode::fixed) return as_float(s.value);
      return s.mode == LossScaleMode::dynamic ? "dynamic" : "none";
    }
    case Kind::string: {
      std::string out = "\"";
      for (char c : std::get<std::string>(value)) {
        if (c == '"' || c == '\\') {
          out += '\\';
          out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
      }
      return out + "\"";
    }
  }
  return "";
}

}  // namespace trainctl::recipe
