// From the validated Recipe to the plain configs of the modules (model, data, train). The modules
// never see the recipe; this is the one place that knows both shapes.
#pragma once

#include "data/data.hpp"
#include "model/config.hpp"
#include "recipe/recipe.hpp"
#include "train/trainer.hpp"

namespace trainctl::run {

model::ModelConfig to_model_config(const recipe::Recipe& recipe);
data::DataConfig to_data_config(const recipe::Recipe& recipe);
train::TrainConfig to_train_config(const recipe::Recipe& recipe);

}  // namespace trainctl::run
