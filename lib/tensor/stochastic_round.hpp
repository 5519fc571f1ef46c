// Stochastic rounding of optimizer state to bf16 (optimizer.state_dtype: bf16), shared by the CPU
// backend and the CUDA kernels so both store the same bits.
//
// A value x is rounded down or up to its bf16 neighbours with probabilities that make the result
// unbiased (E[round(x)] = x): add 16 random bits to x's fp32 bit pattern and truncate the low 16
// (Gupta et al. 2015; the form torchao and Zamirai et al. 2020 use for bf16 optimizer state).
//
// The random bits are a pure function of (seed, parameter name, global element index, step): the
// same element draws the same bits whatever the layout (dp, ZeRO part, tp or ep shard, pipeline
// stage) or backend, so a sharded run rounds exactly as one rank does. One Philox4x32-10 block
// (tensor/rng.hpp's generator) serves four consecutive global elements: element g takes word
// g % 4 of block g / 4, its first moment the low 16 bits and its second the high 16.
#pragma once

#include <cstdint>
#include <cstring>

#include "tensor/host_device.hpp"

namespace trainctl::tensor {

// Philox4x32 with 10 rounds (Salmon et al. 2011): counter c (4 x 32 bits) and key k (2 x 32
// bits) -> 4 x 32 random bits, in place in c. tensor::philox4x32 is this function.
TRAINCTL_HOST_DEVICE inline void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{kMul0} * c[0];
    const uint64_t p1 = uint64_t{kMul1} * c[2];
    const uint32_t c1 = c[1], c3 = c[3];
    c[0] = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    c[1] = static_cast<uint32_t>(p1);
    c[2] = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c[3] = static_cast<uint32_t>(p0);
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
}

// The key of one parameter's rounding stream: the run's seed and the parameter's name key
// (tensor::stream_key), mixed (SplitMix64's finaliser) so that nearby seeds give unrelated keys.
TRAINCTL_HOST_DEVICE inline uint64_t rounding_key(uint64_t seed, uint64_t stream) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ stream ^ 0x5354524F554E44ull;  // "STROUND"
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The 32 random bits of global element `index` of the parameter keyed `key` at optimizer step
// `step`: the low 16 round its first moment, the high 16 its second. rounding_block: the four
// elements' bits of block index / 4 at once.
TRAINCTL_HOST_DEVICE inline void rounding_block(uint64_t key, uint64_t block, uint64_t step,
                                                uint32_t out[4]) {
  out[0] = static_cast<uint32_t>(block);
  out[1] = static_cast<uint32_t>(block >> 32);
  out[2] = static_cast<uint32_t>(step);
  out[3] = static_cast<uint32_t>(step >> 32);
  philox4x32_10(out, static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
}
TRAINCTL_HOST_DEVICE inline uint32_t rounding_bits(uint64_t key, uint64_t index, uint64_t step) {
  uint32_t c[4];
  rounding_block(key, index >> 2, step, c);
  return c[index & 3];
}

// x rounded to bf16 (raw bits) with the 16 random bits `r`. NaN stays a quiet NaN and +-inf stays
// itself; a finite value may round up to +-inf only above bf16's largest finite value.
TRAINCTL_HOST_DEVICE inline uint16_t bf16_stochastic(float x, uint32_t r) {
  uint32_t u = 0;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(x);
#else
  std::memcpy(&u, &x, sizeof u);
#endif
  if ((u & 0x7F800000u) == 0x7F800000u)  // inf or NaN: no rounding
    return static_cast<uint16_t>((u >> 16) | ((u & 0x007FFFFFu) != 0 ? 0x40u : 0u));
  return static_cast<uint16_t>((u + (r & 0xFFFFu)) >> 16);
}

// The global flat index of local element i of a range described as rows: local element
// begin + r * local_width + c (0 <= c < local_width) is global element
// global_begin + r * global_width + c. A range whose local_width equals its global_width is one
// contiguous global run.
TRAINCTL_HOST_DEVICE inline int64_t range_global_index(int64_t i, int64_t begin,
                                                       int64_t global_begin, int64_t local_width,
                                                       int64_t global_width) {
  const int64_t offset = i - begin;
  if (local_width == global_width) return global_begin + offset;
  const int64_t row = offset / local_width;
  return global_begin + row * global_width + (offset - row * local_width);
}

}  // namespace trainctl::tensor
