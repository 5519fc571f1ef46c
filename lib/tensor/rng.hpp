// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011, the generator cuRAND and
// JAX use). A value is a pure function of (seed, stream key, counter): no state to carry, so a
// weight's initial value depends only on (seed, tensor name, element index) and a sharded run
// builds exactly the same full weights as one rank, on any backend.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace trainctl::tensor {

// Philox4x32 with 10 rounds: counter (4 x 32 bits) and key (2 x 32 bits) -> 4 x 32 random bits.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Stable 64-bit key of a name (FNV-1a): "layers.3.attn.qkv.weight" -> stream.
uint64_t stream_key(std::string_view name);

// One generator stream: (seed, stream). Values at an index never depend on other indices.
class CounterRng {
 public:
  CounterRng(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}
  // Uniform in [0, 1) with 24 random bits (exactly representable in float).
  float uniform(uint64_t index) const;
  // Standard normal (Box-Muller on two 32-bit draws of the same counter).
  double normal(uint64_t index) const;
  uint32_t bits(uint64_t index) const;

 private:
  std::array<uint32_t, 4> block(uint64_t index) const;
  uint64_t seed_;
  uint64_t stream_;
};

}  // namespace trainctl::tensor
