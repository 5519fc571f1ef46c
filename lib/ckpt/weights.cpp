#include "ckpt/weights.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ckpt/export.hpp"
#include "ckpt/file_io.hpp"
#include "ckpt/reader.hpp"
#include "ckpt/scan.hpp"
#include "files/files.hpp"
#include "tensor/dtype.hpp"

namespace trainctl::ckpt {

namespace {

using nlohmann::json;

constexpr uint64_t kMaxConfigBytes = 16ULL << 20;
constexpr uint64_t kMaxIndexBytes = 64ULL << 20;
constexpr uint64_t kMaxTensorBytes = 1ULL << 62;
constexpr std::string_view kModelPrefix = "model/";

[[noreturn]] void refuse(const std::string& text) {
  throw WeightsError(text);
}

// ---- values ------------------------------------------------------------------------------------

double load_value(DType dtype, const unsigned char* p) {
  switch (dtype) {
    case DType::f64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::f32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::bf16: {
      tensor::bf16 v;
      std::memcpy(&v.bits, p, 2);
      return tensor::to_float(v);
    }
    case DType::f16: {
      tensor::f16 v;
      std::memcpy(&v.bits, p, 2);
      return tensor::to_float(v);
    }
    default:
      return 0;  // unreachable: only these are accepted (parse_safetensors_header, dtype_ok)
  }
}

// Rounds to nearest even; a double narrows to float first, which for values that came from a
// 16-bit or 32-bit tensor is exact.
void store_value(DType dtype, double value, unsigned char* p) {
  switch (dtype) {
    case DType::f64:
      std::memcpy(p, &value, 8);
      return;
    case DType::f32: {
      const auto v = static_cast<float>(value);
      std::memcpy(p, &v, 4);
      return;
    }
    case DType::bf16: {
      const tensor::bf16 v = tensor::to_bf16(static_cast<float>(value));
      std::memcpy(p, &v.bits, 2);
      return;
    }
    case DType::f16: {
      const tensor::f16 v = tensor::to_f16(static_cast<float>(value));
      std::memcpy(p, &v.bits, 2);
      return;
    }
    default:
      return;
  }
}

bool dtype_ok(DType dtype) {
  return dtype == DType::f64 || dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

void convert(DType from, const unsigned char* src, DType to, unsigned char* dst, int64_t count) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(count) * dtype_size(to));
    return;
  }
  if (from == DType::f32 && to == DType::bf16) {  // fp32 weights into a bf16 run
    for (int64_t i = 0; i < count; ++i) {
      float v;
      std::memcpy(&v, src + static_cast<size_t>(i) * 4, 4);
      const tensor::bf16 b = tensor::to_bf16(v);
      std::memcpy(dst + static_cast<size_t>(i) * 2, &b.bits, 2);
    }
    return;
  }
  if (from == DType::bf16 && to == DType::f32) {  // bf16 weights into fp32 (or a master copy)
    for (int64_t i = 0; i < count; ++i) {
      tensor::bf16 b;
      std::memcpy(&b.bits, src + static_cast<size_t>(i) * 2, 2);
      const float v = tensor::to_float(b);
      std::memcpy(dst + static_cast<size_t>(i) * 4, &v, 4);
    }
    return;
  }
  const size_t in = dtype_size(from), out = dtype_size(to);
  for (int64_t i = 0; i < count; ++i)
    store_value(to, load_value(from, src + static_cast<size_t>(i) * in),
                dst + static_cast<size_t>(i) * out);
}

int64_t count_of(const std::vector<Range>& box) {
  int64_t n = 1;
  for (const Range& r : box)
    n *= r.size();
  return n;
}

std::optional<DType> safetensors_dtype_named(std::string_view name) {
  for (DType d : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::e4m3, DType::e5m2,
                  DType::i32, DType::u16})
    if (safetensors_dtype(d) == name) return d;
  return std::nullopt;
}

json read_json(const fs::path& path, uint64_t limit, std::string_view what) {
  try {
    const std::string text = files::read_regular_file(path, limit, what);
    if (const size_t at = json_too_deep(text); at != std::string_view::npos)
      refuse(fmt::format("{}: JSON nested deeper than 64 levels at byte {}", path.string(), at));
    return json::parse(text);
  } catch (const files::FileError& e) {
    refuse(e.what());
  } catch (const json::exception& e) {
    refuse(fmt::format("{}: not JSON: {}", path.string(), e.what()));
  }
}

// ---- safetensors -------------------------------------------------------------------------------

struct TensorFile {
  fs::path path;
  io::File file;
  std::map<std::string, SafetensorsTensor> tensors;
};

TensorFile open_safetensors(const fs::path& path) {
  TensorFile f{path, {}, {}};
  try {
    f.file = io::File::open_read(path);
    const uint64_t size = f.file.size();
    if (size < 8)
      refuse(
          fmt::format("{}: {} bytes, too short for a safetensors file (8-byte header length "
                      "first)",
                      path.string(), size));
    unsigned char length_bytes[8];
    f.file.read_exact(length_bytes, 8, 0);
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i)
      length = length << 8 | length_bytes[i];
    if (length > kMaxSafetensorsHeader || length > size - 8)
      refuse(
          fmt::format("{}: the header length {} is past the file's end ({} bytes) or over the "
                      "format's {} byte limit: not a safetensors file, or a damaged one",
                      path.string(), length, size, kMaxSafetensorsHeader));
    std::string header(length, '\0');
    f.file.read_exact(header.data(), length, 8);
    f.tensors = parse_safetensors_header(header, size - 8 - length, path.string());
    for (auto& [name, t] : f.tensors)
      t.begin += 8 + length, t.end += 8 + length;
  } catch (const WeightsError&) {
    throw;
  } catch (const CheckpointError& e) {
    refuse(e.what());
  }
  return f;
}

// ---- Hugging Face folder -----------------------------------------------------------------------

class HfWeights final : public WeightSource {
 public:
  explicit HfWeights(const fs::path& dir) : dir_(dir) {
    const fs::path config_file = dir / "config.json";
    config_ = read_json(config_file, kMaxConfigBytes, "Hugging Face config");
    description_ = describe_hf_config(config_, config_file.string());
    std::error_code ec;
    const fs::path index_file = dir / "model.safetensors.index.json";
    std::map<std::string, std::string> weight_map;  // name -> file (index only)
    std::vector<std::string> names;
    if (fs::exists(index_file, ec)) {
      const json index = read_json(index_file, kMaxIndexBytes, "safetensors index");
      const auto it = index.find("weight_map");
      if (it == index.end() || !it->is_object())
        refuse(fmt::format("{}: no \"weight_map\" object", index_file.string()));
      for (const auto& [name, file] : it->items()) {
        if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos ||
            file.get<std::string>().empty() || file.get<std::string>().starts_with("."))
          refuse(fmt::format("{}: weight_map[\"{}\"] = {} is not a file name in the folder",
                             index_file.string(), name, file.dump()));
        weight_map[name] = file.get<std::string>();
        if (std::find(names.begin(), names.end(), file.get<std::string>()) == names.end())
          names.push_back(file.get<std::string>());
      }
    } else if (fs::exists(dir / "model.safetensors", ec)) {
      names.push_back("model.safetensors");
    } else {
      refuse(fmt::format(
          "{}: no model.safetensors and no model.safetensors.index.json; trainctl reads "
          "safetensors weights only (save the model with save_pretrained(..., "
          "safe_serialization=True))",
          dir.string()));
    }
    for (const std::string& name : names) {
      files_.push_back(open_safetensors(dir / name));
      for (const auto& [tensor, entry] : files_.back().tensors) {
        if (!weight_map.empty() && weight_map.count(tensor) && weight_map.at(tensor) != name)
          continue;  // the index places it in another file
        if (!where_.emplace(tensor, files_.size() - 1).second)
          refuse(fmt::format("{}: tensor {} is in two files", dir.string(), tensor));
      }
    }
    for (const auto& [tensor, file] : weight_map)
      if (!where_.count(tensor))
        refuse(fmt::format("{}: the index places {} in {}, which does not hold it",
                           index_file.string(), tensor, file));
  }

  const json& description() const override { return description_; }
  std::string where() const override { return (dir_ / "config.json").string(); }

  void bind(const Manifest& wanted) override {
    ExportPlan plan;
    try {
      plan = plan_export(wanted, where());
    } catch (const CheckpointError& e) {
      refuse(e.what());
    }
    if (plan.naming == Naming::trainctl)
      refuse(fmt::format("{}: no Hugging Face naming for this model", where()));
    gpt2_ = plan.naming == Naming::gpt2;
    std::set<std::string> used;
    pieces_.clear();
    for (const ExportTensor& t : plan.tensors) {
      const auto [name, entry] = find(t.name);
      if (entry == nullptr)
        refuse(fmt::format(
            "{}: the folder has no tensor {} (the model's {} needs it); the folder is not the "
            "model its config.json describes, or holds another naming",
            dir_.string(), gpt2_ ? "transformer." + t.name : t.name, t.source));
      if (entry->shape != t.shape)
        refuse(fmt::format("{}: tensor {} has shape [{}], but a model of this config needs [{}]",
                           dir_.string(), name, fmt::join(entry->shape, ", "),
                           fmt::join(t.shape, ", ")));
      used.insert(name);
      pieces_[t.source].push_back({t, entry, &files_[where_.at(name)]});
    }
    const bool tied = wanted.header.model.value("tied_embeddings", false);
    for (const auto& [name, file] : where_) {
      if (used.count(name)) continue;
      // Buffers older exports carry (not parameters), and a tied head saved anyway.
      if (name.ends_with("rotary_emb.inv_freq") || name.ends_with(".attn.bias") ||
          name.ends_with(".attn.masked_bias") || (tied && name == "lm_head.weight"))
        continue;
      refuse(
          fmt::format("{}: tensor {} has no place in the model config.json describes; the "
                      "weights and the config do not belong together",
                      dir_.string(), name));
    }
  }

  void read(const std::string& name, const std::vector<Range>& region, DType dtype,
            void* dst) const override {
    const auto it = pieces_.find(name);
    if (it == pieces_.end()) refuse(fmt::format("{}: nothing maps to {}", dir_.string(), name));
    auto* out = static_cast<unsigned char*>(dst);
    const size_t out_size = dtype_size(dtype);
    std::vector<unsigned char> bytes;
    for (const Piece& piece : it->second) {
      const std::vector<Range>& from = piece.tensor.region;
      // The overlap of the asked box and this piece, in global coordinates.
      std::vector<Range> overlap(region.size());
      bool empty = false;
      for (size_t d = 0; d < region.size(); ++d) {
        overlap[d] = {std::max(region[d].begin, from[d].begin),
                      std::min(region[d].end, from[d].end)};
        empty = empty || overlap[d].size() <= 0;
      }
      if (empty) continue;
      const SafetensorsTensor& e = *piece.entry;
      const size_t in_size = dtype_size(e.dtype);
      bytes.resize(e.end - e.begin);
      piece.file->file.read_exact(bytes.data(), bytes.size(), e.begin);
      // Walk the overlap row-major; the piece's element index is row-major over its region's
      // extents (leading extents of 1 dropped change nothing), transposed for a 2-D piece.
      const size_t dims = region.size();
      const bool transpose = piece.tensor.transpose;
      if (transpose) {  // 2-D: element (r, c) of the piece is element (c, r) of the file's tensor
        const int64_t rows = from[0].size();
        const size_t width = static_cast<size_t>(region[1].size());
        constexpr int64_t kTile = 64;  // both sides stay in cache
        for (int64_t r0 = overlap[0].begin; r0 < overlap[0].end; r0 += kTile)
          for (int64_t c0 = overlap[1].begin; c0 < overlap[1].end; c0 += kTile)
            for (int64_t r = r0; r < std::min(r0 + kTile, overlap[0].end); ++r) {
              unsigned char* row =
                  out + static_cast<size_t>(r - region[0].begin) * width * out_size;
              const unsigned char* column =
                  bytes.data() + static_cast<size_t>(r - from[0].begin) * in_size;
              const int64_t c_end = std::min(c0 + kTile, overlap[1].end);
              if (e.dtype == DType::f32 && dtype == DType::f32) {  // the common case, unconverted
                for (int64_t c = c0; c < c_end; ++c)
                  std::memcpy(row + static_cast<size_t>(c - region[1].begin) * 4,
                              column + static_cast<size_t>((c - from[1].begin) * rows) * 4, 4);
                continue;
              }
              for (int64_t c = c0; c < c_end; ++c)
                convert(e.dtype, column + static_cast<size_t>((c - from[1].begin) * rows) * in_size,
                        dtype, row + static_cast<size_t>(c - region[1].begin) * out_size, 1);
            }
        continue;
      }
      // Runs along the last dimension are contiguous on both sides.
      std::vector<int64_t> at(dims);
      for (size_t d = 0; d < dims; ++d)
        at[d] = overlap[d].begin;
      const int64_t run = dims == 0 ? 1 : overlap[dims - 1].size();
      const int64_t runs = count_of(overlap) / run;
      for (int64_t i = 0; i < runs; ++i) {
        int64_t out_index = 0, in_index = 0;
        for (size_t d = 0; d < dims; ++d) {
          out_index = out_index * region[d].size() + (at[d] - region[d].begin);
          in_index = in_index * from[d].size() + (at[d] - from[d].begin);
        }
        convert(e.dtype, bytes.data() + static_cast<size_t>(in_index) * in_size, dtype,
                out + static_cast<size_t>(out_index) * out_size, run);
        for (size_t d = run == 1 ? dims : dims - 1; d-- > 0;) {  // the next run's start
          if (++at[d] < overlap[d].end) break;
          at[d] = overlap[d].begin;
        }
      }
    }
  }

 private:
  struct Piece {
    ExportTensor tensor;
    const SafetensorsTensor* entry;
    const TensorFile* file;
  };

  // GPT-2 tensors under save_pretrained's "transformer." prefix or without it (the original
  // OpenAI checkpoints).
  std::pair<std::string, const SafetensorsTensor*> find(const std::string& name) const {
    for (const std::string& candidate : gpt2_&& name != "lm_head.weight"
                                            ? std::vector<std::string>{"transformer." + name, name}
                                            : std::vector<std::string>{name}) {
      const auto it = where_.find(candidate);
      if (it != where_.end()) return {candidate, &files_[it->second].tensors.at(candidate)};
    }
    return {name, nullptr};
  }

  fs::path dir_;
  json config_, description_;
  std::vector<TensorFile> files_;
  std::map<std::string, size_t> where_;  // tensor -> index in files_
  std::map<std::string, std::vector<Piece>> pieces_;
  bool gpt2_ = false;
};

// ---- trainctl checkpoint -----------------------------------------------------------------------

class CheckpointWeights final : public WeightSource {
 public:
  explicit CheckpointWeights(const fs::path& step) : reader_(open_reader(step)) {}

  const json& description() const override { return reader_.manifest().header.model; }
  std::string where() const override { return reader_.dir().string(); }

  void bind(const Manifest& wanted) override {
    std::set<std::string> names;
    for (const TensorEntry& t : wanted.tensors) {
      names.insert(t.name);
      const TensorEntry* have = reader_.manifest().find(t.name);
      if (have == nullptr)
        refuse(fmt::format("{}: the checkpoint has no tensor {}", where(), t.name));
      if (have->shape != t.shape)
        refuse(fmt::format("{}: tensor {} is [{}] there but [{}] in this model", where(), t.name,
                           fmt::join(have->shape, ", "), fmt::join(t.shape, ", ")));
      if (!dtype_ok(have->dtype))
        refuse(fmt::format("{}: tensor {} is {}, which init_from does not convert", where(), t.name,
                           tensor::dtype_name(have->dtype)));
    }
    for (const TensorEntry& t : reader_.manifest().tensors)
      if (t.name.starts_with(kModelPrefix) && !names.count(t.name))
        refuse(fmt::format("{}: tensor {} has no place in this model", where(), t.name));
  }

  void read(const std::string& name, const std::vector<Range>& region, DType dtype,
            void* dst) const override {
    const TensorEntry& t = reader_.tensor(name);
    if (t.dtype == dtype) return reader_.read(name, region, dtype, dst);
    std::vector<unsigned char> stored(static_cast<size_t>(count_of(region)) * dtype_size(t.dtype));
    reader_.read(name, region, t.dtype, stored.data());
    convert(t.dtype, stored.data(), dtype, static_cast<unsigned char*>(dst), count_of(region));
  }

 private:
  static CheckpointReader open_reader(const fs::path& path) {
    std::error_code ec;
    fs::path step = path;
    if (!fs::exists(path / kManifestFile, ec)) {
      const fs::path dir = fs::is_directory(path / "checkpoints", ec) ? path / "checkpoints" : path;
      const ScanReport report = scan(dir);
      const ScanEntry* newest = report.newest_valid();
      if (newest == nullptr)
        refuse(
            fmt::format("{}: holds no valid checkpoint (model.init_from takes a Hugging Face "
                        "folder with config.json, or a trainctl step, checkpoints or run "
                        "directory)",
                        path.string()));
      step = newest->path;
    }
    try {
      return CheckpointReader::open(step);
    } catch (const CheckpointError& e) {
      refuse(e.what());
    }
  }

  CheckpointReader reader_;
};

int64_t integer(const json& config, const char* key, const std::string& file,
                std::optional<int64_t> fallback = std::nullopt) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    if (fallback) return *fallback;
    refuse(fmt::format("{}: no \"{}\"", file, key));
  }
  if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
      it->get<int64_t>() > std::numeric_limits<int32_t>::max())
    refuse(fmt::format("{}: \"{}\" is {}, not a size", file, key, it->dump()));
  return it->get<int64_t>();
}

double number(const json& config, const char* key, const std::string& file, double fallback) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_number() || !(it->get<double>() > 0))
    refuse(fmt::format("{}: \"{}\" is {}, not a positive number", file, key, it->dump()));
  return it->get<double>();
}

bool flag(const json& config, const char* key, bool fallback, const std::string& file) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    refuse(fmt::format("{}: \"{}\" is {}, not true or false", file, key, it->dump()));
  return it->get<bool>();
}

json describe_config(const json& config, const std::string& file);

}  // namespace

std::map<std::string, SafetensorsTensor> parse_safetensors_header(std::string_view header,
                                                                  uint64_t data_bytes,
                                                                  const std::string& file) {
  json j;
  if (const size_t at = json_too_deep(header); at != std::string_view::npos)
    refuse(fmt::format("{}: the safetensors header nests JSON deeper than 64 levels at byte {}",
                       file, at));
  try {
    j = json::parse(header);
  } catch (const json::exception& e) {
    refuse(fmt::format("{}: the safetensors header is not JSON: {}", file, e.what()));
  }
  if (!j.is_object()) refuse(fmt::format("{}: the safetensors header is not a JSON object", file));
  std::map<std::string, SafetensorsTensor> tensors;
  for (const auto& item : j.items()) {
    const std::string& name = item.key();
    const json& entry = item.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) refuse(fmt::format("{}: \"__metadata__\" is not an object", file));
      continue;
    }
    const auto bad = [&](const std::string& what) {
      refuse(fmt::format("{}: tensor {}: {}", file, name, what));
    };
    if (!entry.is_object()) bad("not an object");
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string() || shape_it == entry.end() ||
        !shape_it->is_array() || offsets_it == entry.end() || !offsets_it->is_array() ||
        offsets_it->size() != 2)
      bad("needs \"dtype\" (a string), \"shape\" (a list) and \"data_offsets\" ([begin, end])");
    const std::optional<DType> dtype = safetensors_dtype_named(dtype_it->get<std::string>());
    if (!dtype || !dtype_ok(*dtype))
      bad(fmt::format("dtype {} is not read (F64, F32, BF16, F16 are)", dtype_it->dump()));
    SafetensorsTensor t;
    t.dtype = *dtype;
    uint64_t bytes = dtype_size(*dtype);
    for (const json& d : *shape_it) {
      if (!d.is_number_unsigned())
        bad(fmt::format("shape {} is not a list of sizes", shape_it->dump()));
      const uint64_t extent = d.get<uint64_t>();
      if (extent != 0 && bytes > kMaxTensorBytes / extent)
        bad(fmt::format("shape {} holds more than 2^62 bytes", shape_it->dump()));
      bytes *= extent;
      t.shape.push_back(static_cast<int64_t>(extent));
    }
    for (const json& o : *offsets_it)
      if (!o.is_number_unsigned())
        bad(fmt::format("data_offsets {} are not two byte offsets", offsets_it->dump()));
    t.begin = (*offsets_it)[0].get<uint64_t>();
    t.end = (*offsets_it)[1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_bytes || t.end - t.begin != bytes)
      bad(
          fmt::format("data_offsets [{}, {}] do not hold its {} bytes inside the {} data bytes of "
                      "the file",
                      t.begin, t.end, bytes, data_bytes));
    tensors.emplace(name, std::move(t));
  }
  std::vector<std::pair<uint64_t, const std::string*>> starts;
  for (const auto& [name, t] : tensors)
    if (t.end > t.begin) starts.emplace_back(t.begin, &name);
  std::sort(starts.begin(), starts.end());
  for (size_t i = 1; i < starts.size(); ++i)
    if (tensors.at(*starts[i - 1].second).end > starts[i].first)
      refuse(fmt::format("{}: tensors {} and {} overlap", file, *starts[i - 1].second,
                         *starts[i].second));
  return tensors;
}

json describe_hf_config(const json& config, const std::string& file) {
  try {
    return describe_config(config, file);
  } catch (const json::exception& e) {
    refuse(fmt::format("{}: a field has the wrong type: {}", file, e.what()));
  }
}

namespace {

json describe_config(const json& config, const std::string& file) {
  if (!config.is_object()) refuse(fmt::format("{}: not a JSON object", file));
  const std::string type = config.value("model_type", "");
  json d;
  if (type == "gpt2") {
    const int64_t hidden = integer(config, "n_embd", file);
    const std::string act = config.value("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      refuse(
          fmt::format("{}: activation_function \"{}\": the engine's GELU is the tanh form "
                      "(gelu_new)",
                      file, act));
    if (flag(config, "scale_attn_by_inverse_layer_idx", false, file) ||
        !flag(config, "scale_attn_weights", true, file))
      refuse(
          fmt::format("{}: GPT-2 attention scaled other than by 1/sqrt(head_dim) "
                      "(scale_attn_weights, scale_attn_by_inverse_layer_idx) is not the "
                      "engine's",
                      file));
    const int64_t heads = integer(config, "n_head", file);
    d = {{"arch", "gpt"},
         {"layers", integer(config, "n_layer", file)},
         {"hidden", hidden},
         {"heads", heads},
         {"kv_heads", heads},
         {"ffn_hidden", integer(config, "n_inner", file, 4 * hidden)},
         {"vocab", integer(config, "vocab_size", file)},
         {"seq_len", integer(config, "n_positions", file)},
         {"norm", "layernorm"},
         {"activation", "gelu"},
         {"activation_fn", "gelu_tanh"},
         {"norm_eps", number(config, "layer_norm_epsilon", file, 1e-5)},
         {"position", "learned"},
         {"tied_embeddings", flag(config, "tie_word_embeddings", true, file)},
         {"bias", true},
         {"experts", 0}};
    return d;
  }
  if (type != "llama" && type != "mixtral")
    refuse(
        fmt::format("{}: model_type \"{}\": model.init_from reads gpt2 (GPT2LMHeadModel), "
                    "llama (LlamaForCausalLM) and mixtral (MixtralForCausalLM)",
                    file, type));
  const int64_t hidden = integer(config, "hidden_size", file);
  const int64_t heads = integer(config, "num_attention_heads", file);
  const int64_t kv_heads = integer(config, "num_key_value_heads", file, heads);
  if (heads == 0 || hidden % heads != 0 ||
      integer(config, "head_dim", file, hidden / heads) != hidden / heads)
    refuse(
        fmt::format("{}: head_dim {} is not hidden_size / num_attention_heads ({} / {}): the "
                    "engine's heads split the hidden size",
                    file, config.value("head_dim", json()).dump(), hidden, heads));
  if (config.value("hidden_act", "silu") != "silu")
    refuse(fmt::format("{}: hidden_act {}: the engine's gated MLP uses silu", file,
                       config.at("hidden_act").dump()));
  double theta = number(config, "rope_theta", file, 10000.0);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_object()) refuse(fmt::format("{}: \"{}\" is not an object", file, key));
    const std::string rope_type = it->value("rope_type", it->value("type", "default"));
    if (rope_type != "default")
      refuse(fmt::format("{}: {} rope_type \"{}\": the engine has plain RoPE only (no scaling)",
                         file, key, rope_type));
    theta = number(*it, "rope_theta", file, theta);
  }
  const bool attention_bias = flag(config, "attention_bias", false, file);
  const bool mlp_bias = flag(config, "mlp_bias", false, file);
  if (attention_bias != mlp_bias)
    refuse(
        fmt::format("{}: attention_bias {} but mlp_bias {}: the engine's model.bias puts "
                    "biases in both or neither",
                    file, attention_bias, mlp_bias));
  d = {{"arch", "llama"},
       {"layers", integer(config, "num_hidden_layers", file)},
       {"hidden", hidden},
       {"heads", heads},
       {"kv_heads", kv_heads},
       {"ffn_hidden", integer(config, "intermediate_size", file)},
       {"vocab", integer(config, "vocab_size", file)},
       {"norm", "rmsnorm"},
       {"activation", "swiglu"},
       {"activation_fn", "silu"},
       {"norm_eps", number(config, "rms_norm_eps", file, 1e-6)},
       {"position", "rope"},
       {"rope_theta", theta},
       {"tied_embeddings", flag(config, "tie_word_embeddings", false, file)},
       {"bias", attention_bias},
       {"experts", 0}};
  if (type == "mixtral") {
    if (attention_bias) refuse(fmt::format("{}: Mixtral with biases is not Mixtral", file));
    const auto window = config.find("sliding_window");
    if (window != config.end() && !window->is_null())
      refuse(
          fmt::format("{}: sliding_window {}: the engine's attention is full causal; set it "
                      "to null when the window is at least the sequence length",
                      file, window->dump()));
    d["experts"] = integer(config, "num_local_experts", file);
    d["top_k"] = integer(config, "num_experts_per_tok", file);
    d["moe_every"] = 1;
    d["expert_ffn_hidden"] = d["ffn_hidden"];
    d["router"] = "softmax_topk_renorm";
    d["capacity_factor"] = 0.0;
  }
  return d;
}

}  // namespace

std::unique_ptr<WeightSource> WeightSource::open(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) refuse(fmt::format("{}: no such file or directory", path.string()));
  if (fs::exists(path / "config.json", ec)) return std::make_unique<HfWeights>(path);
  return std::make_unique<CheckpointWeights>(path);
}

}  // namespace trainctl::ckpt
