// manifest.json: serialisation and the strict, total parser. Every value read from the text is
// type- and range-checked before it is used; nothing is allocated by a size the text claims.
#include <algorithm>
#include <array>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ckpt/format.hpp"
#include "tensor/checksum.hpp"

namespace trainctl::ckpt {

using nlohmann::json;

namespace {

constexpr int kMaxJsonDepth = 64;
constexpr size_t kMaxDims = 16;
constexpr size_t kMaxSlicesPerTensor = size_t{1} << 20;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw CheckpointError(
      fmt::format("{}: {}; the checkpoint is corrupt or from another program: "
                  "use an earlier checkpoint (`trainctl ckpt verify` names it)",
                  source, what));
}

// nlohmann's parser recurses per nesting level: refuse absurd depth before parsing.
void check_depth(std::string_view text, const std::string& source) {
  if (const size_t at = json_too_deep(text, kMaxJsonDepth); at != std::string_view::npos)
    fail(source, fmt::format("JSON nested deeper than {} levels at byte {}", kMaxJsonDepth, at));
}

}  // namespace

size_t json_too_deep(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string_view::npos;
}

namespace {

const json& field(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end()) throw std::runtime_error(fmt::format("{}: missing \"{}\"", where, key));
  return *it;
}

uint64_t as_u64(const json& value, const std::string& where, uint64_t max) {
  uint64_t v = 0;
  if (value.is_number_unsigned()) {
    v = value.get<uint64_t>();
  } else if (value.is_number_integer()) {
    const auto s = value.get<int64_t>();
    if (s < 0) throw std::runtime_error(fmt::format("{}: {} is negative", where, s));
    v = static_cast<uint64_t>(s);
  } else {
    throw std::runtime_error(
        fmt::format("{}: expected a non-negative integer, got {}", where, value.type_name()));
  }
  if (v > max) throw std::runtime_error(fmt::format("{}: {} is larger than {}", where, v, max));
  return v;
}

int64_t as_i64(const json& value, const std::string& where) {
  return static_cast<int64_t>(
      as_u64(value, where, static_cast<uint64_t>(std::numeric_limits<int64_t>::max())));
}

const std::string& as_string(const json& value, const std::string& where) {
  if (!value.is_string())
    throw std::runtime_error(
        fmt::format("{}: expected a string, got {}", where, value.type_name()));
  return value.get_ref<const std::string&>();
}

const json& as_kind(const json& value, bool object, const std::string& where) {
  if (object ? !value.is_object() : !value.is_array())
    throw std::runtime_error(fmt::format("{}: expected {}, got {}", where,
                                         object ? "an object" : "an array", value.type_name()));
  return value;
}

bool valid_file_name(std::string_view name) {
  if (name.empty() || name.size() > 255 || name == "." || name == ".." || name == kManifestFile)
    return false;
  return std::none_of(name.begin(), name.end(),
                      [](char c) { return c == '/' || c == '\\' || c == '\0'; });
}

SliceRecord parse_slice(const json& j, size_t dims, const std::string& where) {
  as_kind(j, true, where);
  SliceRecord s;
  s.file = as_string(field(j, "file", where), where + ".file");
  s.offset = as_u64(field(j, "offset", where), where + ".offset", uint64_t{1} << 62);
  s.length = as_u64(field(j, "length", where), where + ".length", uint64_t{1} << 62);
  s.crc32c =
      static_cast<uint32_t>(as_u64(field(j, "crc32c", where), where + ".crc32c", 0xffffffffu));
  const json& index = as_kind(field(j, "index", where), false, where + ".index");
  if (index.size() != dims)
    throw std::runtime_error(fmt::format("{}.index: {} ranges for a tensor of {} dimensions", where,
                                         index.size(), dims));
  s.index.reserve(dims);
  for (size_t d = 0; d < dims; ++d) {
    const std::string at = fmt::format("{}.index[{}]", where, d);
    const json& r = as_kind(index[d], false, at);
    if (r.size() != 2) throw std::runtime_error(at + ": expected [begin, end]");
    s.index.push_back({as_i64(r[0], at), as_i64(r[1], at)});
  }
  return s;
}

TensorEntry parse_tensor(const json& j, size_t position) {
  std::string where = fmt::format("tensors[{}]", position);
  as_kind(j, true, where);
  TensorEntry t;
  t.name = as_string(field(j, "name", where), where + ".name");
  where = fmt::format("tensor '{}'", t.name);
  const std::string& dtype = as_string(field(j, "dtype", where), where + " dtype");
  const auto parsed = parse_dtype(dtype);
  if (!parsed) throw std::runtime_error(fmt::format("{}: unknown dtype \"{}\"", where, dtype));
  t.dtype = *parsed;
  const json& shape = as_kind(field(j, "shape", where), false, where + " shape");
  if (shape.size() > kMaxDims)
    throw std::runtime_error(
        fmt::format("{}: {} dimensions (at most {})", where, shape.size(), kMaxDims));
  for (const json& d : shape)
    t.shape.push_back(as_i64(d, where + " shape"));
  const json& slices = as_kind(field(j, "slices", where), false, where + " slices");
  if (slices.size() > kMaxSlicesPerTensor)
    throw std::runtime_error(
        fmt::format("{}: {} slices (at most {})", where, slices.size(), kMaxSlicesPerTensor));
  t.slices.reserve(slices.size());
  for (size_t i = 0; i < slices.size(); ++i)
    t.slices.push_back(
        parse_slice(slices[i], t.shape.size(), fmt::format("{} slice {}", where, i)));
  return t;
}

// The fields, once check_format_and_checksum has passed.
Manifest parse_fields(const json& root) {
  Manifest m;
  m.header.step = as_i64(field(root, "step", "manifest"), "step");
  m.header.recipe_hash = as_string(field(root, "recipe_hash", "manifest"), "recipe_hash");
  m.created = as_string(field(root, "created", "manifest"), "created");
  m.header.layout = as_kind(field(root, "layout", "manifest"), true, "layout");
  m.header.model = as_kind(field(root, "model", "manifest"), true, "model");
  m.header.state = as_kind(field(root, "state", "manifest"), true, "state");
  if (root.contains("provenance"))
    m.header.provenance = as_kind(root.at("provenance"), true, "provenance");
  const json& files = as_kind(field(root, "files", "manifest"), true, "files");
  for (const auto& [name, entry] : files.items()) {
    const std::string where = fmt::format("files[\"{}\"]", name);
    as_kind(entry, true, where);
    m.files[name] =
        FileEntry{as_u64(field(entry, "bytes", where), where + ".bytes", uint64_t{1} << 62),
                  static_cast<uint32_t>(
                      as_u64(field(entry, "crc32c", where), where + ".crc32c", 0xffffffffu))};
  }
  const json& tensors = as_kind(field(root, "tensors", "manifest"), false, "tensors");
  m.tensors.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    m.tensors.push_back(parse_tensor(tensors[i], i));
  return m;
}

// Format and version first (a newer format may hash differently), then the self-checksum,
// before any other field is trusted.
void check_format_and_checksum(const json& root) {
  as_kind(root, true, "the document");
  const std::string& format = as_string(field(root, "format", "manifest"), "format");
  if (format != kFormatName)
    throw std::runtime_error(fmt::format("format is \"{}\", expected \"{}\"", format, kFormatName));
  const uint64_t version = as_u64(field(root, "version", "manifest"), "version", 1u << 30);
  if (version != static_cast<uint64_t>(kFormatVersion))
    throw std::runtime_error(
        fmt::format("format version {} is not supported (this build reads version {})", version,
                    kFormatVersion));
  const auto it = root.find(kManifestChecksumKey);
  if (it == root.end())
    throw std::runtime_error(fmt::format(
        "corrupt: manifest checksum missing (no \"{}\"; version {} manifests carry one)",
        kManifestChecksumKey, kFormatVersion));
  const auto stored = static_cast<uint32_t>(
      as_u64(*it, std::string(kManifestChecksumKey), std::numeric_limits<uint32_t>::max()));
  const uint32_t actual = manifest_checksum(root);
  if (stored != actual)
    throw std::runtime_error(fmt::format(
        "corrupt: manifest checksum mismatch ({} is {:#010x}, the content hashes to {:#010x}: "
        "the file changed after it was written)",
        kManifestChecksumKey, stored, actual));
}

bool boxes_overlap(const std::vector<Range>& a, const std::vector<Range>& b) {
  for (size_t d = 0; d < a.size(); ++d)
    if (a[d].end <= b[d].begin || b[d].end <= a[d].begin) return false;
  return true;
}

[[noreturn]] void fail_overlap(const TensorEntry& t, const SliceRecord& a, const SliceRecord& b,
                               const std::string& source) {
  fail(source, fmt::format("tensor '{}': slices {} and {} overlap", t.name, format_index(a.index),
                           format_index(b.index)));
}

// Looks for two overlapping slices by a sweep along dimension 0, giving up after a fixed number
// of comparisons (the sweep is quadratic for some layouts); only run once an overlap is known to
// exist, to name it.
void find_overlap_bounded(const TensorEntry& t, const std::string& source) {
  std::vector<const SliceRecord*> order;
  for (const auto& s : t.slices)
    order.push_back(&s);
  std::sort(order.begin(), order.end(), [](const SliceRecord* a, const SliceRecord* b) {
    return a->index[0].begin < b->index[0].begin;
  });
  uint64_t budget = uint64_t{1} << 26;
  for (size_t i = 0; i < order.size(); ++i)
    for (size_t k = i + 1; k < order.size() && order[k]->index[0].begin < order[i]->index[0].end;
         ++k) {
      if (budget-- == 0) return;
      if (boxes_overlap(order[i]->index, order[k]->index))
        fail_overlap(t, *order[i], *order[k], source);
    }
}

// Checks that the slices of `t` (each already inside its shape) cover every element exactly once,
// in O(n 2^k log n) for n slices split along k <= kMaxSplitDims dimensions, whatever their layout.
//
// Why it is exact: the indicator of a box [a, b) is a signed sum over its 2^k corners v
// (v_d in {a_d, b_d}, sign (-1)^(number of d with v_d = b_d)) of "x >= v componentwise". So
// sum(slice indicators) - (tensor box indicator) = sum over corners v of R(v) [x >= v], where R
// adds up the signs of every slice corner and subtracts the tensor box's. R == 0 everywhere
// means every element is covered exactly once. Otherwise let p be the lexicographically smallest
// corner with R(p) != 0: every other corner v <= p (componentwise) is lexicographically smaller,
// so R(v) == 0 and the coverage at p minus [p in the tensor] is R(p) != 0. p lies inside the
// tensor (outside it both are 0), so p is covered by no slice (a hole) or by two or more
// (named). Dimensions that every slice spans whole are left out: they change no coverage.
void check_tiling(const TensorEntry& t, uint64_t numel, uint64_t covered,
                  const std::string& source) {
  if (numel == 0) return;     // no slice fits inside an empty shape: the range checks refused them
  std::vector<size_t> split;  // the dimensions along which some slice is not whole
  for (size_t d = 0; d < t.shape.size(); ++d)
    if (std::any_of(t.slices.begin(), t.slices.end(), [&](const SliceRecord& s) {
          return s.index[d].begin != 0 || s.index[d].end != t.shape[d];
        }))
      split.push_back(d);
  if (split.size() > kMaxSplitDims)
    fail(source, fmt::format("tensor '{}': slices split it along {} dimensions (at most {})",
                             t.name, split.size(), kMaxSplitDims));
  struct Corner {
    std::array<int64_t, kMaxSplitDims> at{};
    int64_t weight = 0;
  };
  const size_t corners = size_t{1} << split.size();
  std::vector<Corner> all;
  all.reserve((t.slices.size() + 1) * corners);
  auto add_corners = [&](auto range_of, int64_t weight) {
    for (size_t mask = 0; mask < corners; ++mask) {
      Corner c;
      c.weight = weight;
      for (size_t j = 0; j < split.size(); ++j) {
        const Range r = range_of(split[j]);
        const bool end = (mask >> j) & 1;
        c.at[j] = end ? r.end : r.begin;
        if (end) c.weight = -c.weight;
      }
      all.push_back(c);
    }
  };
  for (const auto& s : t.slices)
    add_corners([&](size_t d) { return s.index[d]; }, 1);
  add_corners([&](size_t d) { return Range{0, t.shape[d]}; }, -1);
  std::sort(all.begin(), all.end(), [](const Corner& a, const Corner& b) { return a.at < b.at; });
  for (size_t i = 0; i < all.size();) {
    int64_t residual = 0;
    size_t k = i;
    for (; k < all.size() && all[k].at == all[i].at; ++k)
      residual += all[k].weight;
    if (residual == 0) {
      i = k;
      continue;
    }
    // p = all[i].at: covered by no slice or by two or more.
    std::vector<int64_t> element(t.shape.size(), 0);
    for (size_t j = 0; j < split.size(); ++j)
      element[split[j]] = all[i].at[j];
    const SliceRecord* first = nullptr;
    for (const auto& s : t.slices) {
      bool contains = true;
      for (size_t j = 0; j < split.size() && contains; ++j)
        contains = s.index[split[j]].begin <= all[i].at[j] && all[i].at[j] < s.index[split[j]].end;
      if (!contains) continue;
      if (first) fail_overlap(t, *first, s, source);
      first = &s;
    }
    if (covered < numel)
      fail(source,
           fmt::format("tensor '{}': slices cover {} of its {} elements", t.name, covered, numel));
    find_overlap_bounded(t, source);
    fail(source, fmt::format("tensor '{}': slices add up to at least its {} elements but element "
                             "[{}] is in none of them, so some overlap",
                             t.name, numel, fmt::join(element, ",")));
  }
}

}  // namespace

const TensorEntry* Manifest::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType d : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::e4m3, DType::e5m2,
                  DType::i32, DType::u16})
    if (tensor::dtype_name(d) == name) return d;
  return std::nullopt;
}

std::string step_dir_name(int64_t step) {
  return fmt::format("step_{:08d}", step);
}

std::optional<int64_t> parse_step_dir_name(std::string_view name) {
  constexpr std::string_view prefix = "step_";
  if (name.size() < prefix.size() + 8 || name.size() > prefix.size() + 18 ||
      name.substr(0, prefix.size()) != prefix)
    return std::nullopt;
  int64_t step = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  return step;
}

std::string shard_file_name(int rank) {
  return fmt::format("rank_{}.bin", rank);
}

std::string format_index(const std::vector<Range>& index) {
  std::string s = "[";
  for (size_t d = 0; d < index.size(); ++d)
    s += fmt::format("{}[{},{})", d ? "," : "", index[d].begin, index[d].end);
  return s + "]";
}

json manifest_to_json(const Manifest& m) {
  json tensors = json::array();
  for (const auto& t : m.tensors) {
    json slices = json::array();
    for (const auto& s : t.slices) {
      json index = json::array();
      for (const auto& r : s.index)
        index.push_back({r.begin, r.end});
      slices.push_back({{"file", s.file},
                        {"offset", s.offset},
                        {"length", s.length},
                        {"index", index},
                        {"crc32c", s.crc32c}});
    }
    tensors.push_back({{"name", t.name},
                       {"dtype", std::string(tensor::dtype_name(t.dtype))},
                       {"shape", t.shape},
                       {"slices", slices}});
  }
  json files = json::object();
  for (const auto& [name, f] : m.files)
    files[name] = {{"bytes", f.bytes}, {"crc32c", f.crc32c}};
  json root = {{"format", kFormatName},   {"version", kFormatVersion},
               {"step", m.header.step},   {"recipe_hash", m.header.recipe_hash},
               {"created", m.created},    {"layout", m.header.layout},
               {"model", m.header.model}, {"state", m.header.state},
               {"tensors", tensors},      {"files", files}};
  if (!m.header.provenance.is_null()) root["provenance"] = m.header.provenance;
  root[std::string(kManifestChecksumKey)] = manifest_checksum(root);
  return root;
}

uint32_t manifest_checksum(const json& manifest) {
  if (!manifest.is_object()) {
    const std::string text = manifest.dump();
    return tensor::crc32c(text.data(), text.size());
  }
  // Equal to crc32c(copy-without-the-key.dump()) without copying the (large) tensor list.
  uint32_t crc = tensor::crc32c("{", 1);
  bool first = true;
  for (auto it = manifest.begin(); it != manifest.end(); ++it) {
    if (it.key() == kManifestChecksumKey) continue;
    std::string part = first ? "" : ",";
    first = false;
    part += json(it.key()).dump();
    part += ':';
    part += it.value().dump();
    crc = tensor::crc32c(part.data(), part.size(), crc);
  }
  return tensor::crc32c("}", 1, crc);
}

void validate_manifest(const Manifest& m, const std::string& source) {
  for (const auto& [name, f] : m.files) {
    if (!valid_file_name(name)) fail(source, fmt::format("file name \"{}\" is not allowed", name));
    if (f.bytes < kShardHeaderBytes)
      fail(source, fmt::format("file {} has {} bytes, less than its {}-byte header", name, f.bytes,
                               kShardHeaderBytes));
  }
  std::map<std::string_view, size_t> names;
  std::map<std::string_view, std::vector<std::pair<uint64_t, uint64_t>>> extents;  // per file
  for (const auto& t : m.tensors) {
    if (t.name.empty()) fail(source, "a tensor has an empty name");
    if (!names.emplace(t.name, 0).second)
      fail(source, fmt::format("tensor '{}' appears twice", t.name));
    const uint64_t element = tensor::dtype_size(t.dtype);
    const uint64_t limit = (uint64_t{1} << 62) / element;
    uint64_t numel = 1;
    for (int64_t d : t.shape)
      if (d != 0 && numel > limit / static_cast<uint64_t>(d))
        fail(source, fmt::format("tensor '{}': shape too large", t.name));
      else
        numel *= static_cast<uint64_t>(d);
    uint64_t covered = 0;  // the slices' volumes, summed up to numel + 1
    for (const auto& s : t.slices) {
      const std::string where =
          fmt::format("tensor '{}' slice {} in {}", t.name, format_index(s.index), s.file);
      uint64_t volume = 1;
      for (size_t d = 0; d < s.index.size(); ++d) {
        const Range r = s.index[d];
        if (r.begin < 0 || r.begin >= r.end || r.end > t.shape[d])
          fail(source, fmt::format("{}: range {} outside dimension {} of size {}", where,
                                   format_index({r}), d, t.shape[d]));
        volume *= static_cast<uint64_t>(r.size());  // bounded by numel: no overflow
      }
      if (s.length != volume * element)
        fail(source, fmt::format("{}: length {} but the index covers {} elements of {} bytes",
                                 where, s.length, volume, element));
      const auto file = m.files.find(s.file);
      if (file == m.files.end())
        fail(source, fmt::format("{}: file not listed in \"files\"", where));
      if (s.offset < kShardHeaderBytes || s.offset > file->second.bytes ||
          s.length > file->second.bytes - s.offset)
        fail(source, fmt::format("{}: bytes [{}, {}) outside the file's {} bytes", where, s.offset,
                                 s.offset + s.length, file->second.bytes));
      extents[file->first].push_back({s.offset, s.length});
      covered = std::min(covered + volume, numel + 1);  // volume <= numel < 2^62: no overflow
    }
    if (t.shape.empty() && t.slices.size() > 1)
      fail(source, fmt::format("tensor '{}': {} slices of a scalar", t.name, t.slices.size()));
    check_tiling(t, numel, covered, source);
    if (covered != numel)
      fail(source,
           fmt::format("tensor '{}': slices cover {} of its {} elements", t.name, covered, numel));
  }
  for (auto& [file, list] : extents) {
    std::sort(list.begin(), list.end());
    for (size_t i = 1; i < list.size(); ++i)
      if (list[i].first < list[i - 1].first + list[i - 1].second)
        fail(source, fmt::format("two slices share bytes at offset {} of {}", list[i].first, file));
  }
}

Manifest parse_manifest(std::string_view text, const std::string& source) {
  // Before parsing: the JSON tree costs up to ~37 bytes per byte of text (format.hpp).
  if (text.size() > kMaxManifestBytes)
    fail(source, fmt::format("{} bytes, more than the {} a manifest may have", text.size(),
                             kMaxManifestBytes));
  check_depth(text, source);
  Manifest m;
  {
    json root;  // freed before the checks below, which need memory of their own
    try {
      root = json::parse(text.begin(), text.end());
    } catch (const json::exception& e) {
      fail(source, fmt::format("not valid JSON ({})", e.what()));
    }
    try {
      check_format_and_checksum(root);
      m = parse_fields(root);
    } catch (const CheckpointError&) {
      throw;
    } catch (const std::exception& e) {
      fail(source, e.what());
    }
  }
  validate_manifest(m, source);
  return m;
}

}  // namespace trainctl::ckpt
