#include "run/peak.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>

#include "planner/planner.hpp"
#include "topology/topology.hpp"

namespace trainctl::run {

Peak gpu_peak(const backend::GpuInfo& gpu, tensor::DType storage) {
  const std::optional<topology::GpuSpec> spec = topology::match_device_name(gpu.name);
  if (!spec)
    return {0,
            fmt::format("{} is not in the GPU table (topology/gpu_table.cpp): no MFU", gpu.name)};
  const double tflops = planner::peak_tflops(*spec, storage);
  return {tflops * 1e12, fmt::format("{} TFLOP/s {} per {} (datasheet, dense)", tflops,
                                     tensor::dtype_name(storage), spec->name)};
}

Peak measure_gemm_peak(backend::Backend& backend, tensor::DType storage, double seconds) {
  constexpr int64_t n = 512;
  const size_t bytes = static_cast<size_t>(n * n) * tensor::dtype_size(storage);
  backend::Allocation a = backend.allocate(bytes), b = backend.allocate(bytes),
                      c = backend.allocate(bytes);
  backend::GemmArgs g;
  g.a = a.view(storage, {n, n});
  g.b = b.view(storage, {n, n});
  g.c = c.view(storage, {n, n});
  g.m = g.n = g.k = n;
  using Clock = std::chrono::steady_clock;
  backend.gemm(g);  // warm-up: threads started, pages touched
  backend.fence()->wait();
  double best = 0;
  const auto start = Clock::now();
  do {
    const auto before = Clock::now();
    backend.gemm(g);
    backend.fence()->wait();
    const double s = std::chrono::duration<double>(Clock::now() - before).count();
    if (s > 0) best = std::max(best, 2.0 * n * n * n / s);
  } while (std::chrono::duration<double>(Clock::now() - start).count() < seconds);
  return {best, fmt::format("{:.4g} GFLOP/s {} GEMM peak of this CPU (measured at start-up)",
                            best / 1e9, tensor::dtype_name(storage))};
}

double step_mfu(double forward_flops_per_token, double tokens, double step_s, const Peak& peak,
                int devices) {
  if (peak.flops_per_s <= 0 || step_s <= 0 || devices < 1) return 0;
  return 3.0 * forward_flops_per_token * tokens / step_s / (peak.flops_per_s * devices);
}

}  // namespace trainctl::run
