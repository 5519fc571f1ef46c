// The bridge between a training run and lib/ckpt: what goes into a checkpoint and how a run is
// put back from one. Logical tensors, always with the GLOBAL shape of the whole model, so a run on
// any layout can load a checkpoint saved on any other:
//   model/<param>    parameter values in the storage type
//   master/<param>   fp32 master weights (bf16/fp16 runs only)
//   <moment>/<param> the optimizer's state, by its names (train::moment_names): adam_m and
//                    adam_v (adamw), momentum (sgd), lion_m (lion), muon_m and adam_v (muon)
// The manifest's "state" is the TrainerState (train/state_json.hpp), identical on every rank (the
// sampler position is global); "model" describes the whole model (no layout in it) so a
// checkpoint of another model is refused with a message that says what differs; "layout" records
// the saving layout for people, readers never need it.
//
// Multi-rank: every rank calls capture_checkpoint and saves through its own CheckpointWriter
// (rank, world size and save id in its Options); each rank adds only the boxes it is the
// designated writer of (SaveRole), so across the job every element of every logical tensor is
// written exactly once. restore_checkpoint reads on each rank exactly its local parameters and
// its ZeRO part of the optimizer state, whatever layout saved them.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "ckpt/ckpt.hpp"
#include "ckpt/weights.hpp"
#include "model/model.hpp"
#include "train/trainer.hpp"

namespace trainctl::train {

// A checkpoint that is intact but belongs to another run: another model shape or precision, or a
// data position in other data. Unlike ckpt::CheckpointError (damage), an older checkpoint of the
// same run would not help: the recipe is what differs.
class CheckpointMismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Everything that must match for a checkpoint's tensors to mean the same thing.
nlohmann::json describe_model(const model::ModelConfig& config);
// The inverse for what describe_model records: the ModelConfig whose parameter table
// (model::build_param_table) has the checkpoint's tensors with their shapes and initialisations.
// Keys the description leaves out (arch, init_std, norm_eps, rope_theta, the MoE loss
// coefficients, fp8) keep their defaults: none changes a tensor's name, shape or kind of
// initialisation (init_std only scales the normal ones). Throws ckpt::CheckpointError naming
// `source` and the missing or mistyped field.
model::ModelConfig model_from_description(const nlohmann::json& description,
                                          const std::string& source);

// One box of a parameter: the same elements in the global tensor and in the rank's local one.
struct ParamBox {
  std::vector<ckpt::Range> global;  // inside spec.global_shape
  std::vector<ckpt::Range> local;   // inside spec.shape
};
// The boxes of the global tensor that local rows [row_begin, row_end) of `spec` are made of (a
// row: one index of the local tensor's first dimension; a scalar is one row). A local tensor is
// the product of its pieces (ParamSpec::pieces), so these are the products of the pieces that
// the rows touch: one box for an unsplit parameter, three for the full rows of a tensor-parallel
// qkv (its q, k and v heads).
std::vector<ParamBox> param_boxes(const model::ParamSpec& spec, int64_t row_begin, int64_t row_end);

// Which copies of replicated state this rank writes, by its mesh coordinates. The designated
// writer of a parameter's values has dp coordinate 0, tp coordinate 0 unless the parameter is
// split over tp, ep coordinate 0 unless it is an expert's; the last pipeline stage's copy of a
// tied embedding is never written (the first stage's is). What a ZeRO part holds (the optimizer
// state, and ZeRO-3's values) follows the same rule, except that with ZeRO every dp coordinate
// writes its own part.
struct SaveRole {
  int tp = 0;
  int ep = 0;
  int dp = 0;
  bool zero = false;  // the optimizer state is partitioned over dp (ZeRO-1 to 3)
  bool writes_values(const model::ParamSpec& spec) const;  // of whole values
  bool writes_part(const model::ParamSpec& spec) const;    // of the part's rows of `spec`
};
// The role of this rank: its coordinates on trainer.mesh() (all 0 on one rank) and whether the
// model's optimizer state is partitioned (model.parallel().zero_parts() > 1).
SaveRole save_role(const model::Transformer& model, const Trainer& trainer);

// Copies the run's state into `request` and returns it (this copy is the training loop's stall).
// Pass CheckpointWriter::new_request(): its host memory is the last save's, already mapped, so
// only the first save pays for page faults. Each parameter buffer (values, master, moments) is
// copied whole, in one host copy or one device-to-host copy, and its tensors are views into it.
ckpt::SaveRequest capture_checkpoint(ckpt::SaveRequest request, const model::Transformer& model,
                                     const Trainer& trainer, backend::Backend& backend,
                                     const std::string& recipe_hash, const nlohmann::json& layout);
// The host bytes capture_checkpoint allocates on this rank for this model: pass it to
// CheckpointWriter::reserve() at start-up so the first save does not pay for page faults.
size_t capture_bytes(const model::Transformer& model, const Trainer& trainer);
// The same into a request with fresh host memory (tests, one-off saves).
ckpt::SaveRequest capture_checkpoint(const model::Transformer& model, const Trainer& trainer,
                                     backend::Backend& backend, const std::string& recipe_hash,
                                     const nlohmann::json& layout);

// The parameter part of capture_checkpoint: copies each buffer (values, master, moments) that
// holds a box this rank writes to the host once (one host or device-to-host copy into
// request.allocate()) and adds this rank's boxes as views of it; a box that is strided in the
// local tensor (a column piece of a split dimension) is packed first.
void add_param_tensors(ckpt::SaveRequest& request, const model::ParamStore& params,
                       const SaveRole& role, backend::Backend& backend);
// The parameter part of restore_checkpoint: reads every box of this rank's parameters (values,
// and the optimizer state of its ZeRO part) from the checkpoint's global tensors. Throws
// CheckpointMismatch when a tensor's global shape or dtype differs from the model's.
void read_param_tensors(const ckpt::CheckpointReader& reader, const model::ParamStore& params,
                        backend::Backend& backend);

// The model/* tensors a run of `config` holds (global shapes, the storage dtype) with its
// description as header.model: what ckpt::WeightSource::bind checks a model.init_from source
// against.
ckpt::Manifest weights_wanted(const model::ModelConfig& config);
// model.init_from: reads this rank's parameter values (and fp32 master weights) from `source`
// (bound to weights_wanted), whatever the layout; the optimizer state stays fresh. No parameter
// gather may be running (Trainer::wait_parameters).
void load_initial_weights(const ckpt::WeightSource& source, model::ParamStore& params,
                          backend::Backend& backend);

// Loads this rank's parameters, master weights and moments (its ZeRO part) and the trainer state,
// reading the boxes it needs from the global tensors whatever layout saved them. Throws
// CheckpointMismatch when the checkpoint holds another model (naming the first difference) or a
// position in other data, and ckpt::CheckpointError when it is damaged (a checksum, a missing
// tensor, a bad state field). On a throw the model holds partly loaded values: load another
// checkpoint or start fresh.
void restore_checkpoint(const ckpt::CheckpointReader& reader, model::Transformer& model,
                        Trainer& trainer, backend::Backend& backend);

}  // namespace trainctl::train
