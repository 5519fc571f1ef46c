// TrainerState <-> JSON, the "state" section of a checkpoint manifest. Reading is strict: a
// missing or mistyped field is a std::runtime_error naming it (a manifest comes from disk).
// 64-bit fingerprints are written as hex strings (JSON readers in other languages keep only
// 53 bits of a number).
#pragma once

#include <nlohmann/json.hpp>

#include "train/trainer.hpp"

namespace trainctl::train {

nlohmann::json to_json(const TrainerState& state);
TrainerState trainer_state_from_json(const nlohmann::json& json);

}  // namespace trainctl::train
