// Internal to lib/data: the 64-bit mixing functions behind the synthetic source and the sampler's
// shuffles. Counter-based (a pure function of its inputs), so results never depend on call order,
// thread count or platform.
#pragma once

#include <cstdint>

namespace trainctl::data::detail {

// splitmix64's finaliser: a bijection on 64-bit words with good avalanche.
inline constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hash of a key tuple, e.g. hash_keys(seed, stream, index). Each key is folded in through mix64,
// so (a, b) and (b, a) hash differently.
inline constexpr uint64_t hash_keys(uint64_t a, uint64_t b) {
  return mix64(mix64(a) ^ b);
}
inline constexpr uint64_t hash_keys(uint64_t a, uint64_t b, uint64_t c) {
  return mix64(hash_keys(a, b) ^ c);
}

// A sequential splitmix64 generator (the state advances by the golden-ratio increment).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

}  // namespace trainctl::data::detail
