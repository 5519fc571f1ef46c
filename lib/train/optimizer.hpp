// The optimizers over a ParamStore (optimizer.name). Each keeps its per-element state in the
// store's moment buffers (moment_names: what a checkpoint calls them; Adafactor's factored
// statistics are its own, state()), over the store's optimizer part [optimizer_begin(),
// optimizer_end()) (its ZeRO part; all of it without ZeRO); for bf16/fp16 storage the update runs
// on the fp32 master weights and the storage copy is their rounding. Weight decay applies to
// matrices and embeddings, not to norms and biases (ParamSpec::weight_decay). g below is the
// gradient times grad_scale (un-scaling and clipping).
//
//   adamw  Loshchilov & Hutter (PyTorch's AdamW): m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//          w = w (1 - lr wd) - lr mhat / (sqrt(vhat) + eps). State m, v (8 bytes per parameter).
//   sgd    PyTorch's SGD: g += wd w; m = mu m + g; w -= lr (nesterov ? g + mu m : m); without
//          momentum w -= lr g. State m (none without momentum).
//   lion   Chen et al. 2023 ("Symbolic Discovery of Optimization Algorithms"):
//          w = w (1 - lr wd) - lr sign(b1 m + (1 - b1) g); m = b2 m + (1 - b2) g. State m.
//   muon   Jordan et al. 2024 in Moonlight's form (Liu et al. 2025, "Muon is Scalable for LLM
//          Training"), for the 2-D weights of the blocks (attention qkv and projection, MLP and
//          expert fc1/fc2; q, k and v orthogonalised as separate matrices, each expert as its own):
//            m = mu m + g;  u = nesterov ? g + mu m : m
//            O = NewtonSchulz_k(u / (|u|_F + 1e-7))  (quintic, a, b, c = 3.4445, -4.7750, 2.0315)
//            w = w (1 - lr wd) - lr 0.2 sqrt(max(rows, cols)) O
//          The 0.2 sqrt(max) factor gives O the RMS of an AdamW update, so both groups share the
//          schedule's lr and weight decay. Embeddings, head, norms, biases and the router take
//          AdamW (betas, eps). State m for all, v (AdamW's) kept for the whole part.
//   adafactor  Shazeer & Stern 2018 ("Adafactor: Adaptive Learning Rates with Sublinear Memory
//          Cost") as PyTorch's torch.optim.Adafactor, for every parameter, each expert of a stacked
//          expert weight or bias as a parameter of its own; t counts steps from 1:
//            1 - beta2_t = t^beta2_decay;  rho = min(lr, 1 / sqrt(t))
//            alpha = max(eps2, RMS(w)) rho   (eps2 = 1e-3; RMS over the whole parameter)
//            matrices [R, C]: r = lerp(r, mean_j g^2, 1 - beta2_t) (R), c = lerp(c, mean_i g^2, ..)
//                             (C); V = r c^T / max(mean(r), eps1)
//            vectors:         V = v = lerp(v, g^2, 1 - beta2_t)
//            U = g / sqrt(max(V, eps1^2));  U /= max(1, RMS(U) / clip_threshold)
//            w = w (1 - lr wd) - alpha U     (eps1: f32's machine epsilon, PyTorch's default)
//          State: R + C numbers per matrix, n per vector, kept whole on every rank holding part of
//          the parameter (they are computed from the whole gradient, gathered as Muon's is), saved
//          as adafactor_row/, adafactor_col/ and adafactor_v/ tensors of the global shape. The
//          statistics and the update are computed on the host in float64 (a CUDA run copies the
//          gradients over each step: there is no Adafactor kernel yet).
//
// Muon and the layouts: the orthogonalisation needs each whole matrix. Every rank rebuilds the
// global matrices of its stage from their pieces (an all-gather of u over the ZeRO group, then a
// sum over tp of each tp-split matrix placed at its global rows and columns, whose other entries
// are zero, so the sum is exact), orthogonalises them all (the GEMMs one rank would run, on the
// same matrix), and applies the rows of its own part. The cost is the extra communication of one
// gradient-sized gather and the Newton-Schulz GEMMs repeated on every rank of a tp and ZeRO group
// (Moonlight's "distributed Muon" does the gather and keeps only its part in the same way).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "comm/mesh.hpp"
#include "model/config.hpp"
#include "model/params.hpp"
#include "train/config.hpp"

namespace trainctl::train {

// optimizer.name's spelling ("adamw", ...), and the name back (nullopt: no such optimizer).
std::string optimizer_name(OptimizerName name);
std::optional<OptimizerName> optimizer_of(std::string_view name);

// The optimizer's per-element state buffers by their checkpoint names, moment1's first: what the
// ParamStore must keep (model::ModelParallel::optimizer_moments).
model::MomentNames moment_names(const OptimizerConfig& config);

// Muon orthogonalises this parameter (a 2-D weight of a block) rather than AdamW updating it.
bool muon_matrix(const model::ParamSpec& spec);

// Newton-Schulz orthogonalisation of x ([rows, cols], G dtype) in place: x / (|x|_F + 1e-7),
// then `steps` of Muon's quintic iteration X = a X + (b A + c A^2) X with A = X X^T (X^T X on
// the right when rows > cols, so A is the smaller Gram matrix), through the backend's GEMMs.
struct NewtonSchulzScratch {
  tensor::Tensor next;  // rows * cols elements at least, G
  tensor::Tensor gram;  // min(rows, cols)^2 at least, G
  tensor::Tensor poly;  // min(rows, cols)^2 at least, G
};
void newton_schulz(backend::Backend& be, const tensor::Tensor& x, int steps,
                   const NewtonSchulzScratch& scratch);

class Optimizer {
 public:
  // model: the shapes Muon splits qkv by. zero_sharded: the store holds one ZeRO part of several
  // (over mesh->dp_cp()). mesh: the rank's groups (null on one rank).
  // seed: bf16 moments' stochastic rounding (determinism.seed).
  Optimizer(const OptimizerConfig& config, backend::Backend& be, const model::ParamStore& params,
            const model::ModelConfig& model, bool zero_sharded, const comm::Mesh* mesh,
            uint64_t seed = 0);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update with learning rate `lr`; every gradient is first multiplied by `grad_scale`.
  // Updates only the elements of the store's optimizer part; a parameter cut by it is updated on
  // the part inside it (Muon: with the whole matrix's orthogonalisation).
  void step(model::ParamStore& params, double lr, double grad_scale);
  int64_t updates() const { return updates_; }  // completed steps (Adam's t)
  // Device bytes of the optimizer's own buffers beside the store's moments (Muon's working
  // buffers, Adafactor's state and working buffers; 0 for the others). planner/memory.cpp models
  // them.
  size_t bytes() const;

  // The optimizer's own state beyond the store's moments (Adafactor's factored statistics): one
  // device buffer (G dtype; empty Tensor for the other optimizers), saved by checkpoints as the
  // tensors below, each a box of a global tensor at an element offset of the buffer.
  struct StateTensor {
    std::string name;                   // "adafactor_row/layers.0.attn.qkv.weight"
    std::vector<int64_t> global_shape;  // of the whole model
    std::vector<std::pair<int64_t, int64_t>>
        box;                                 // [begin, end) per dimension: what this rank holds
    int64_t offset = 0;                      // in state()
    const model::ParamSpec* spec = nullptr;  // the parameter it belongs to
  };
  tensor::Tensor state() const;
  const std::vector<StateTensor>& state_tensors() const;
  void restore(int64_t updates) { updates_ = updates; }

 private:
  struct Muon;
  struct Adafactor;
  void adafactor_step(model::ParamStore& params, double lr, double grad_scale);
  void adamw(model::ParamStore& params, double lr, double grad_scale,
             const std::vector<backend::Backend::AdamWRange>& ranges) const;

  OptimizerConfig config_;
  backend::Backend& be_;
  tensor::DType grad_dtype_;
  int64_t updates_ = 0;
  std::vector<backend::Backend::AdamWRange> all_;  // every parameter of the part
  std::unique_ptr<Muon> muon_;
  std::unique_ptr<Adafactor> adafactor_;
};

}  // namespace trainctl::train
