#include "train/state_json.hpp"

#include <fmt/core.h>

#include <cstdlib>
#include <stdexcept>

#include "train/optimizer.hpp"

namespace trainctl::train {

namespace {

std::string hex64(uint64_t v) {
  return fmt::format("{:016x}", v);
}

const nlohmann::json& field(const nlohmann::json& j, const char* section, const char* name) {
  if (!j.is_object() || !j.contains(name))
    throw std::runtime_error(fmt::format("checkpoint state: {}{} is missing", section, name));
  return j.at(name);
}

int64_t get_int(const nlohmann::json& j, const char* section, const char* name, int64_t min) {
  const nlohmann::json& v = field(j, section, name);
  if (!v.is_number_integer() || v.get<int64_t>() < min)
    throw std::runtime_error(fmt::format("checkpoint state: {}{} must be an integer >= {}, got {}",
                                         section, name, min, v.dump()));
  return v.get<int64_t>();
}

double get_positive(const nlohmann::json& j, const char* section, const char* name) {
  const nlohmann::json& v = field(j, section, name);
  if (!v.is_number() || !(v.get<double>() > 0))
    throw std::runtime_error(fmt::format("checkpoint state: {}{} must be a positive number, got {}",
                                         section, name, v.dump()));
  return v.get<double>();
}

uint64_t get_hex(const nlohmann::json& j, const char* section, const char* name) {
  const nlohmann::json& v = field(j, section, name);
  const std::string s = v.is_string() ? v.get<std::string>() : std::string();
  char* end = nullptr;
  const uint64_t value = s.size() == 16 ? std::strtoull(s.c_str(), &end, 16) : 0;
  if (s.size() != 16 || end != s.c_str() + 16)
    throw std::runtime_error(fmt::format("checkpoint state: {}{} must be 16 hex digits, got {}",
                                         section, name, v.dump()));
  return value;
}

std::vector<double> get_numbers(const nlohmann::json& j, const char* section, const char* name) {
  const nlohmann::json& v = field(j, section, name);
  std::vector<double> out;
  if (v.is_array())
    for (const nlohmann::json& x : v) {
      if (!x.is_number()) break;
      out.push_back(x.get<double>());
    }
  if (!v.is_array() || out.size() != v.size())
    throw std::runtime_error(fmt::format("checkpoint state: {}{} must be a list of numbers, got {}",
                                         section, name, v.dump()));
  return out;
}

}  // namespace

nlohmann::json to_json(const TrainerState& s) {
  nlohmann::json j = {{"step", s.step},
                      {"tokens", s.tokens},
                      {"optimizer_updates", s.optimizer_updates},
                      {"loss_scaler",
                       {{"scale", s.loss_scaler.scale},
                        {"good_steps", s.loss_scaler.good_steps},
                        {"skipped_steps", s.loss_scaler.skipped_steps}}},
                      {"sampler",
                       {{"position", s.sampler.position},
                        {"epoch", s.sampler.epoch},
                        {"seed", hex64(s.sampler.seed)},
                        {"seq_len", s.sampler.seq_len},
                        {"shuffle", s.sampler.shuffle},
                        {"fingerprint", hex64(s.sampler.fingerprint)}}}};
  // Optimizers other than AdamW only: checkpoints of AdamW runs read as before.
  if (s.optimizer != "adamw") j["optimizer"] = s.optimizer;
  // The guard's state only once it has one: checkpoints of runs without events or spike tests
  // read as before.
  const StabilityGuard::State& g = s.stability;
  if (g != StabilityGuard::State{})
    j["stability"] = {{"losses", g.losses},     {"grad_norms", g.grad_norms},
                      {"events", g.events},     {"in_a_row", g.in_a_row},
                      {"furthest", g.furthest}, {"lr_factor_until", g.lr_factor_until}};
  return j;
}

TrainerState trainer_state_from_json(const nlohmann::json& j) {
  TrainerState s;
  s.step = get_int(j, "", "step", 0);
  s.tokens = get_int(j, "", "tokens", 0);
  s.optimizer_updates = get_int(j, "", "optimizer_updates", 0);
  if (j.contains("optimizer")) {
    const nlohmann::json& name = j["optimizer"];
    if (!name.is_string() || !optimizer_of(name.get<std::string>()))
      throw std::runtime_error(
          "checkpoint state: optimizer must be adamw, sgd, lion, muon or adafactor, got " +
          name.dump());
    s.optimizer = name.get<std::string>();
  }
  const nlohmann::json& scaler = field(j, "", "loss_scaler");
  s.loss_scaler.scale = get_positive(scaler, "loss_scaler.", "scale");
  s.loss_scaler.good_steps = get_int(scaler, "loss_scaler.", "good_steps", 0);
  s.loss_scaler.skipped_steps = get_int(scaler, "loss_scaler.", "skipped_steps", 0);
  const nlohmann::json& sampler = field(j, "", "sampler");
  s.sampler.position = get_int(sampler, "sampler.", "position", 0);
  s.sampler.epoch = get_int(sampler, "sampler.", "epoch", 0);
  s.sampler.seed = get_hex(sampler, "sampler.", "seed");
  s.sampler.seq_len = static_cast<int32_t>(get_int(sampler, "sampler.", "seq_len", 1));
  const nlohmann::json& shuffle = field(sampler, "sampler.", "shuffle");
  if (!shuffle.is_boolean())
    throw std::runtime_error("checkpoint state: sampler.shuffle must be true or false, got " +
                             shuffle.dump());
  s.sampler.shuffle = shuffle.get<bool>();
  s.sampler.fingerprint = get_hex(sampler, "sampler.", "fingerprint");
  if (j.contains("stability")) {
    const nlohmann::json& g = j["stability"];
    s.stability.losses = get_numbers(g, "stability.", "losses");
    s.stability.grad_norms = get_numbers(g, "stability.", "grad_norms");
    s.stability.events = get_int(g, "stability.", "events", 0);
    s.stability.in_a_row = get_int(g, "stability.", "in_a_row", 0);
    s.stability.furthest = get_int(g, "stability.", "furthest", 0);
    s.stability.lr_factor_until = get_int(g, "stability.", "lr_factor_until", 0);
  }
  if (s.optimizer_updates > s.step)
    throw std::runtime_error(fmt::format("checkpoint state: optimizer_updates {} exceeds step {}",
                                         s.optimizer_updates, s.step));
  return s;
}

}  // namespace trainctl::train
