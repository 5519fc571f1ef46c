// The peak a run's measured MFU is held against: model FLOP/s (3 x the forward FLOPs of the whole
// model per token, as the planner counts them) over the peak of the devices that ran them.
#pragma once

#include <string>

#include "backend/backend.hpp"
#include "backend/cuda/device.hpp"
#include "tensor/dtype.hpp"

namespace trainctl::run {

struct Peak {
  double flops_per_s = 0;  // of one device: a GPU, or the CPU of one node; 0: unknown (no MFU)
  std::string source;      // for the run's log: where the figure comes from
};

// The GPU's datasheet peak for `storage` (topology's GPU table, as `trainctl plan` uses); 0 with
// the reason for a GPU the table does not know.
Peak gpu_peak(const backend::GpuInfo& gpu, tensor::DType storage);

// The fastest rate this backend's GEMM reaches at `storage` on 512 x 512 x 512 products, best of
// the calls made in about `seconds` after one warm-up: the CPU's achievable peak at the run's
// precision, measured once at start-up. (The operands are zeros: the rate does not depend on the
// values.)
Peak measure_gemm_peak(backend::Backend& backend, tensor::DType storage, double seconds = 0.1);

// Model FLOPs utilisation of one step: 3 x forward_flops_per_token x tokens over step_s, against
// `devices` devices of `peak` each. 0 when the peak is unknown or the step took no time.
double step_mfu(double forward_flops_per_token, double tokens, double step_s, const Peak& peak,
                int devices);

}  // namespace trainctl::run
