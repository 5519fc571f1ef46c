// Parameters: every logical tensor of the model is declared once in a ParamTable (name, shape,
// initialisation, weight decay) and lives at an offset in ONE contiguous buffer per kind, so
// gradient buckets, ZeRO shards and checkpoint slices are plain ranges of that buffer:
//   values  (storage type S)              grads   (G: f32, or f64 when S is f64)
//   master  (f32, only when S is bf16/f16) moments m, v (f32, or f64 when S is f64)
// Names follow one scheme ("layers.3.attn.qkv.weight") used by init, checkpoints and export.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.hpp"
#include "model/config.hpp"

namespace trainctl::model {

using backend::Backend;
using tensor::DType;
using tensor::Shape;
using tensor::Tensor;

enum class Init { normal, zeros, ones };

struct ParamSpec {
  std::string name;
  Shape shape;
  Init init = Init::normal;
  double std = 0.0;          // for Init::normal
  bool weight_decay = true;  // false for norms and biases
  int64_t offset = 0;        // element offset in the contiguous buffers
};

class ParamTable {
 public:
  const ParamSpec& add(std::string name, Shape shape, Init init, double std, bool decay);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& find(const std::string& name) const;  // throws std::out_of_range
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  int64_t numel() const { return numel_; }

 private:
  std::vector<ParamSpec> specs_;
  std::unordered_map<std::string, size_t> index_;
  int64_t numel_ = 0;
};

// The table of a model: embeddings, blocks (attention, dense MLP or MoE), final norm, head.
ParamTable build_param_table(const ModelConfig& config);

// A parameter with its gradient: what a layer holds.
struct Param {
  Tensor value;
  Tensor grad;
};

// Owns the parameter, gradient, master-weight and optimizer-moment buffers of one model.
class ParamStore {
 public:
  ParamStore(Backend& backend, ParamTable table, DType storage);

  // Fills every parameter from the counter RNG keyed by (seed, name, element index): identical
  // values whatever the layout or backend. Master weights get the f32 value, the storage copy its
  // rounding.
  void initialize(uint64_t seed);
  void zero_grads();

  Param param(const std::string& name) const;
  const ParamTable& table() const { return table_; }
  DType storage() const { return storage_; }
  bool has_master() const { return master_.data() != nullptr; }

  // Whole buffers (for the optimizer, gradient norms, checkpoints).
  Tensor values() const;
  Tensor grads() const;
  Tensor master() const;  // empty Tensor when S is f32/f64
  Tensor moment1() const;
  Tensor moment2() const;
  // The range of one parameter inside one of the buffers above.
  static Tensor slice(const Tensor& whole, const ParamSpec& spec);

  struct Bytes {
    size_t params = 0, grads = 0, optimizer = 0;
  };
  Bytes bytes() const;

 private:
  Backend& backend_;
  ParamTable table_;
  DType storage_;
  backend::Allocation values_, grads_, master_, m_, v_;
};

}  // namespace trainctl::model
