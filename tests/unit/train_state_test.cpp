// Checkpoint cadence and the JSON form of TrainerState: exact round trip (including 64-bit
// fingerprints and the loss scale), strict reading of bad input.
#include <catch2/catch.hpp>

#include "train/checkpoint_policy.hpp"
#include "train/state_json.hpp"

using namespace trainctl;

TEST_CASE("checkpoint policy: every N steps, every M minutes, at the end, on a signal",
          "[train][checkpoint]") {
  const train::CheckpointPolicy steps(50, 0, 200);
  CHECK_FALSE(steps.due(49, 1e9, false));
  CHECK(steps.due(50, 0, false));
  CHECK(steps.due(200, 0, false));
  CHECK(steps.due(7, 0, true));
  const train::CheckpointPolicy minutes(0, 2.0, 200);
  CHECK_FALSE(minutes.due(10, 119.0, false));
  CHECK(minutes.due(10, 120.0, false));
  const train::CheckpointPolicy off(0, 0, 200);
  CHECK_FALSE(off.due(100, 1e9, false));
  CHECK(off.due(200, 0, false));  // the end of training is always saved
}

TEST_CASE("trainer state survives JSON exactly", "[train][checkpoint]") {
  train::TrainerState s;
  s.step = 123;
  s.tokens = 456789;
  s.optimizer_updates = 120;
  s.loss_scaler = {0.1 + 0.2, 7, 3};  // a double that needs all 17 digits
  s.sampler = {9876, 2, 0xfedcba9876543210ull, 128, true, 0xffffffffffffffffull};
  const train::TrainerState back =
      train::trainer_state_from_json(nlohmann::json::parse(train::to_json(s).dump()));
  CHECK(back.step == s.step);
  CHECK(back.tokens == s.tokens);
  CHECK(back.optimizer_updates == s.optimizer_updates);
  CHECK(back.loss_scaler.scale == s.loss_scaler.scale);
  CHECK(back.loss_scaler.good_steps == 7);
  CHECK(back.loss_scaler.skipped_steps == 3);
  CHECK(back.sampler.position == 9876);
  CHECK(back.sampler.seed == 0xfedcba9876543210ull);
  CHECK(back.sampler.fingerprint == 0xffffffffffffffffull);
  CHECK(back.sampler.seq_len == 128);
  CHECK(back.sampler.shuffle);
  CHECK(back.stability == train::StabilityGuard::State{});
  CHECK_FALSE(train::to_json(s).contains("stability"));  // as checkpoints without a guard read
  s.stability = {{0.1 + 0.2, 4.5}, {1.0 / 3.0, 2.0}, 3, 1, 117, 130};
  const train::TrainerState guarded =
      train::trainer_state_from_json(nlohmann::json::parse(train::to_json(s).dump()));
  CHECK(guarded.stability == s.stability);
}

TEST_CASE("trainer state from JSON: every bad field is named", "[train][checkpoint]") {
  train::TrainerState valid;
  valid.sampler.seq_len = 16;
  const nlohmann::json good = train::to_json(valid);
  struct Bad {
    std::function<void(nlohmann::json&)> edit;
    const char* message;
  };
  const Bad cases[] = {
      {[](nlohmann::json& j) { j.erase("step"); }, "checkpoint state: step is missing"},
      {[](nlohmann::json& j) { j["step"] = -1; },
       "checkpoint state: step must be an integer >= 0, got -1"},
      {[](nlohmann::json& j) { j["tokens"] = "many"; },
       "checkpoint state: tokens must be an integer >= 0, got \"many\""},
      {[](nlohmann::json& j) { j["loss_scaler"]["scale"] = 0; },
       "checkpoint state: loss_scaler.scale must be a positive number, got 0"},
      {[](nlohmann::json& j) { j["sampler"]["fingerprint"] = 12; },
       "checkpoint state: sampler.fingerprint must be 16 hex digits, got 12"},
      {[](nlohmann::json& j) { j["sampler"]["seed"] = "00000000000000zz"; },
       "checkpoint state: sampler.seed must be 16 hex digits, got \"00000000000000zz\""},
      {[](nlohmann::json& j) { j["sampler"]["shuffle"] = 1; },
       "checkpoint state: sampler.shuffle must be true or false, got 1"},
      {[](nlohmann::json& j) { j["optimizer_updates"] = 5; },
       "checkpoint state: optimizer_updates 5 exceeds step 0"},
      {[](nlohmann::json& j) { j = nlohmann::json::array(); }, "checkpoint state: step is missing"},
      {[](nlohmann::json& j) {
         j["stability"] = {{"losses", {1.0, "x"}}, {"grad_norms", nlohmann::json::array()},
                           {"events", 0},          {"in_a_row", 0},
                           {"furthest", 0},        {"lr_factor_until", 0}};
       },
       "checkpoint state: stability.losses must be a list of numbers, got [1.0,\"x\"]"},
      {[](nlohmann::json& j) {
         j["stability"] = {{"losses", nlohmann::json::array()},
                           {"grad_norms", nlohmann::json::array()},
                           {"events", -2}};
       },
       "checkpoint state: stability.events must be an integer >= 0, got -2"},
  };
  for (const Bad& bad : cases) {
    nlohmann::json j = good;
    bad.edit(j);
    CHECK_THROWS_WITH(train::trainer_state_from_json(j), bad.message);
  }
}
