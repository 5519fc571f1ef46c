// The per-tensor scale of an fp8 operand, shared by the CPU backend and the CUDA kernels so both
// compute bit-identical scales (see backend::GemmArgs, "fp8 operands").
#pragma once

#include <cmath>

#include "tensor/host_device.hpp"

namespace trainctl::tensor {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;

// The largest power of two p with amax * p <= max_finite, clamped to [2^-126, 2^126]; 1 when
// amax is 0; NaN when amax is not finite (a NaN or infinite element poisons the product).
// Exponent arithmetic only, so host and device agree on every input.
TRAINCTL_HOST_DEVICE inline float fp8_scale_for(float max_finite, float amax) {
  if (!(amax < INFINITY)) return NAN;  // NaN or +inf (amax is a magnitude)
  if (amax == 0.0f) return 1.0f;
  int ea = 0, em = 0;
  const float fa = frexpf(amax, &ea);        // amax = fa * 2^ea, fa in [0.5, 1)
  const float fm = frexpf(max_finite, &em);  // likewise
  int e = em - ea - (fa > fm ? 1 : 0);
  e = e < -126 ? -126 : (e > 126 ? 126 : e);
  return ldexpf(1.0f, e);
}

}  // namespace trainctl::tensor
