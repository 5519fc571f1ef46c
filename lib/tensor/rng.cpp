#include "tensor/rng.hpp"

#include <cmath>
#include <numbers>

#include "tensor/stochastic_round.hpp"

namespace trainctl::tensor {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  philox4x32_10(c.data(), k[0], k[1]);
  return c;
}

uint64_t stream_key(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::array<uint32_t, 4> CounterRng::block(uint64_t index) const {
  return philox4x32({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                     static_cast<uint32_t>(stream_), static_cast<uint32_t>(stream_ >> 32)},
                    {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)});
}

uint32_t CounterRng::bits(uint64_t index) const {
  return block(index)[0];
}

float CounterRng::uniform(uint64_t index) const {
  return static_cast<float>(block(index)[0] >> 8) * (1.0f / 16777216.0f);
}

double CounterRng::normal(uint64_t index) const {
  const auto b = block(index);
  // u1 in (0, 1] so the log is finite; u2 in [0, 1).
  const double u1 = (static_cast<double>(b[0]) + 1.0) / 4294967296.0;
  const double u2 = static_cast<double>(b[1]) / 4294967296.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace trainctl::tensor
