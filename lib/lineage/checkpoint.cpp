// The lineage test on checkpoints: which tensors carry a fingerprint (the model description's
// parameter table), their values read a block of rows at a time through CheckpointReader (the
// resharding read `ckpt export` uses, so any saving layout gives the same global tensors), and
// the birth values regenerated from model::InitialValues.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <string_view>

#include "lineage/lineage.hpp"
#include "model/params.hpp"
#include "train/checkpointing.hpp"

namespace trainctl::lineage {

namespace {

using ckpt::CheckpointError;
using ckpt::CheckpointReader;
using ckpt::Range;
using ckpt::TensorEntry;
using tensor::DType;

constexpr std::string_view kModelPrefix = "model/";
// Elements read per block: 4 Mi, 32 MiB per side in double precision, whatever the model's size.
constexpr int64_t kBlockElements = int64_t{1} << 22;

std::string manifest_path(const CheckpointReader& reader) {
  return (reader.dir() / ckpt::kManifestFile).string();
}

std::vector<int64_t> dims(const tensor::Shape& shape) {
  return std::vector<int64_t>(shape.dims.begin(), shape.dims.begin() + shape.rank);
}

// The normal-initialised parameters of the checkpoint's model, with the checkpoint's entry of
// each (its shape checked against the table's).
struct Fingerprinted {
  model::ParamSpec spec;
  const TensorEntry* entry = nullptr;
};

std::vector<Fingerprinted> fingerprinted(const CheckpointReader& reader) {
  const std::string source = manifest_path(reader);
  const model::ModelConfig config =
      train::model_from_description(reader.manifest().header.model, source);
  std::vector<Fingerprinted> out;
  const model::ParamTable table = model::build_param_table(config);
  for (const model::ParamSpec& spec : table.specs()) {
    if (spec.init != model::Init::normal) continue;
    const std::string name = std::string(kModelPrefix) + spec.name;
    const TensorEntry* entry = reader.manifest().find(name);
    if (!entry || entry->shape != dims(spec.global_shape))
      throw CheckpointError(fmt::format(
          "{}: the model description implies a tensor {} of shape {} but the checkpoint {}; the "
          "manifest does not describe its own tensors (a corrupt or hand-edited manifest?)",
          source, name, spec.global_shape.to_string(),
          entry ? fmt::format("has [{}]", fmt::join(entry->shape, ", ")) : "has none"));
    out.push_back({spec, entry});
  }
  if (out.empty())
    throw CheckpointError(
        fmt::format("{}: the model has no normal-initialised tensor to test", source));
  return out;
}

// Stored values (any floating dtype) widened to double.
void widen(const std::vector<unsigned char>& bytes, DType dtype, std::vector<double>& out,
           const std::string& tensor) {
  const size_t n = bytes.size() / tensor::dtype_size(dtype);
  out.resize(n);
  auto each = [&](auto element) {
    using T = decltype(element);
    const T* in = reinterpret_cast<const T*>(bytes.data());
    for (size_t i = 0; i < n; ++i)
      out[i] = static_cast<double>(tensor::load(in[i]));
  };
  switch (dtype) {
    case DType::f64:
      return each(double{});
    case DType::f32:
      return each(float{});
    case DType::bf16:
      return each(tensor::bf16{});
    case DType::f16:
      return each(tensor::f16{});
    case DType::e4m3: {
      const auto* in = reinterpret_cast<const tensor::e4m3*>(bytes.data());
      for (size_t i = 0; i < n; ++i)
        out[i] = tensor::to_float(in[i]);
      return;
    }
    case DType::e5m2: {
      const auto* in = reinterpret_cast<const tensor::e5m2*>(bytes.data());
      for (size_t i = 0; i < n; ++i)
        out[i] = tensor::to_float(in[i]);
      return;
    }
    case DType::i32:
    case DType::u16:
      break;
  }
  throw CheckpointError(
      fmt::format("tensor {} is {}, not a floating-point type", tensor, tensor::dtype_name(dtype)));
}

// Reads slabs [begin, end) of the first dimension of `entry`, widened to double.
class SlabReader {
 public:
  SlabReader(const CheckpointReader& reader, const TensorEntry& entry)
      : reader_(reader), entry_(entry) {}
  const std::vector<double>& read(int64_t begin, int64_t end) {
    std::vector<Range> region{{begin, end}};
    int64_t n = end - begin;
    for (size_t d = 1; d < entry_.shape.size(); ++d) {
      region.push_back({0, entry_.shape[d]});
      n *= entry_.shape[d];
    }
    bytes_.resize(static_cast<size_t>(n) * tensor::dtype_size(entry_.dtype));
    reader_.read(entry_.name, region, entry_.dtype, bytes_.data());
    widen(bytes_, entry_.dtype, values_, entry_.name);
    return values_;
  }

 private:
  const CheckpointReader& reader_;
  const TensorEntry& entry_;
  std::vector<unsigned char> bytes_;
  std::vector<double> values_;
};

// The statistic of one tensor of `shape`, the matrix view's rows being all dimensions but the
// last. fill(begin, end) returns the two sides' values of first-dimension slab [begin, end).
using SlabPair = std::function<std::pair<const std::vector<double>*, const std::vector<double>*>(
    int64_t begin, int64_t end)>;

TensorStat stream(const std::string& name, const std::vector<int64_t>& shape, const SlabPair& fill,
                  int permutations) {
  if (shape.size() < 2) {  // a vector: one row, read whole
    const int64_t n = shape.empty() ? 1 : shape[0];
    PairAccumulator acc(name, 1, n, permutations);
    const auto [x, y] = fill(0, n);
    acc.add_rows(0, *x, *y);
    return acc.finish();
  }
  const int64_t cols = shape.back();
  int64_t per_slab = 1;  // elements of one index of the first dimension
  for (size_t d = 1; d < shape.size(); ++d)
    per_slab *= shape[d];
  const int64_t rows_per_slab = per_slab / cols;
  PairAccumulator acc(name, shape[0] * rows_per_slab, cols, permutations);
  const int64_t step = std::max<int64_t>(1, kBlockElements / per_slab);
  for (int64_t begin = 0; begin < shape[0]; begin += step) {
    const int64_t end = std::min(shape[0], begin + step);
    const auto [x, y] = fill(begin, end);
    acc.add_rows(begin * rows_per_slab, *x, *y);
  }
  return acc.finish();
}

}  // namespace

Result test_seed(const CheckpointReader& model, uint64_t seed) {
  std::vector<TensorStat> stats;
  std::vector<double> birth;
  for (const Fingerprinted& f : fingerprinted(model)) {
    const model::InitialValues initial(f.spec, seed);
    const int64_t per_slab =
        f.entry->shape.size() < 2 ? 1 : f.spec.global_shape.numel() / f.entry->shape[0];
    SlabReader current(model, *f.entry);
    stats.push_back(stream(
        f.spec.name, f.entry->shape,
        [&](int64_t begin, int64_t end) {
          const std::vector<double>& values = current.read(begin, end);
          birth.resize(values.size());
          const int64_t first = begin * per_slab;  // the slab's first global element
          for (size_t i = 0; i < birth.size(); ++i)
            birth[i] = initial(first + static_cast<int64_t>(i));
          return std::make_pair(&birth, &values);
        },
        0));
  }
  return combine(std::move(stats));
}

Result test_against(const CheckpointReader& model, const CheckpointReader& other) {
  // The tensors of `other` must match first, before any value is read.
  const std::vector<Fingerprinted> tensors = fingerprinted(model);
  std::vector<const TensorEntry*> others;
  for (const Fingerprinted& f : tensors) {
    const TensorEntry* entry = other.manifest().find(f.entry->name);
    if (!entry || entry->shape != f.entry->shape)
      throw Incomparable(fmt::format(
          "{} has tensor {} of shape [{}] but {} {}: the two checkpoints are of different models, "
          "whose weights cannot be compared element by element",
          model.dir().string(), f.entry->name, fmt::join(f.entry->shape, ", "),
          other.dir().string(),
          entry ? fmt::format("has it with shape [{}]", fmt::join(entry->shape, ", "))
                : "has no such tensor"));
    others.push_back(entry);
  }
  std::vector<TensorStat> stats;
  for (size_t k = 0; k < tensors.size(); ++k) {
    SlabReader a(model, *tensors[k].entry), b(other, *others[k]);
    stats.push_back(stream(
        tensors[k].spec.name, tensors[k].entry->shape,
        [&](int64_t begin, int64_t end) {
          return std::make_pair(&a.read(begin, end), &b.read(begin, end));
        },
        kPermutations));
  }
  return combine(std::move(stats));
}

}  // namespace trainctl::lineage
