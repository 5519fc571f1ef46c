// The bridge between a training run and lib/ckpt: what goes into a checkpoint and how a run is
// put back from one. Logical tensors (global shapes, so another layout can load them):
//   model/<param>    parameter values in the storage type
//   master/<param>   fp32 master weights (bf16/fp16 runs only)
//   adam_m/<param>, adam_v/<param>   AdamW moments
// The manifest's "state" is the TrainerState (train/state_json.hpp); "model" describes the shape
// so a checkpoint of another model is refused with a message that says what differs.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "backend/backend.hpp"
#include "ckpt/ckpt.hpp"
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

// Copies the run's state into `request` and returns it (this copy is the training loop's stall).
// Pass CheckpointWriter::new_request(): its host memory is the last save's, already mapped, so
// only the first save pays for page faults. Each parameter buffer (values, master, moments) is
// copied whole, in one host copy or one device-to-host copy, and its tensors are views into it.
ckpt::SaveRequest capture_checkpoint(ckpt::SaveRequest request, const model::Transformer& model,
                                     const Trainer& trainer, backend::Backend& backend,
                                     const std::string& recipe_hash, const nlohmann::json& layout);
// The same into a request with fresh host memory (tests, one-off saves).
ckpt::SaveRequest capture_checkpoint(const model::Transformer& model, const Trainer& trainer,
                                     backend::Backend& backend, const std::string& recipe_hash,
                                     const nlohmann::json& layout);

// Loads parameters, master weights, moments and the trainer state. Throws CheckpointMismatch when
// the checkpoint holds another model (naming the first difference) or a position in other data,
// and ckpt::CheckpointError when it is damaged (a checksum, a missing tensor, a bad state field).
// On a throw the model holds partly loaded values: load another checkpoint or start fresh.
void restore_checkpoint(const ckpt::CheckpointReader& reader, model::Transformer& model,
                        Trainer& trainer, backend::Backend& backend);

}  // namespace trainctl::train
