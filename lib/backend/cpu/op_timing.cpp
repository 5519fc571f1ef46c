// Op timing counters: names, the printed table and the controls reached through a Backend&.
#include "backend/cpu/op_timing.hpp"

#include <fmt/format.h>

#include <stdexcept>

#include "backend/cpu/cpu_backend.hpp"

namespace trainctl::backend::cpu {

int64_t OpStats::total_ns() const {
  int64_t total = 0;
  for (int64_t v : ns)
    total += v;
  return total;
}

std::string format_op_stats(const OpStats& stats, double per, std::string_view per_name) {
  const double total = static_cast<double>(stats.total_ns());
  const std::string unit = per_name.empty() ? "ms" : fmt::format("ms/{}", per_name);
  std::string out = fmt::format("{:<12} {:>9} {:>12} {:>7}\n", "op family", "calls", unit, "share");
  for (int f = 0; f < kNumOpFamilies; ++f) {
    if (stats.calls[f] == 0) continue;
    const double ns = static_cast<double>(stats.ns[f]);
    out += fmt::format("{:<12} {:>9.0f} {:>12.2f} {:>6.1f}%\n",
                       op_family_name(static_cast<OpFamily>(f)),
                       static_cast<double>(stats.calls[f]) / per, ns / 1e6 / per,
                       total > 0 ? 100.0 * ns / total : 0.0);
  }
  out += fmt::format("{:<12} {:>9} {:>12.2f}\n", "all ops", "", total / 1e6 / per);
  const double gemm_ns = static_cast<double>(stats.ns[static_cast<int>(OpFamily::gemm)]);
  if (gemm_ns > 0) out += fmt::format("gemm rate: {:.1f} GFLOP/s\n", stats.gemm_flops / gemm_ns);
  return out;
}

namespace {

CpuBackend& cpu_backend(Backend& be) {
  auto* cpu = dynamic_cast<CpuBackend*>(&be);
  if (!cpu)
    throw std::invalid_argument(fmt::format(
        "op timing is a CPU-backend feature, but the backend is '{}': use make_cpu_backend()",
        be.name()));
  return *cpu;
}

}  // namespace

void set_op_timing(Backend& be, bool enabled) {
  cpu_backend(be).op_timer().enabled = enabled;
}

OpStats op_stats(const Backend& be) {
  return cpu_backend(const_cast<Backend&>(be)).op_timer().stats;
}

void reset_op_stats(Backend& be) {
  cpu_backend(be).op_timer().stats = OpStats{};
}

}  // namespace trainctl::backend::cpu
