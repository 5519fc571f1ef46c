// Opt-in per-op-family wall-clock counters of the CPU backend, to see where a training step's time
// goes (bench/cpu_train_bench.cpp prints them; TRAINCTL_OP_TIMING=1 prints them to stderr when the
// backend is destroyed). Off by default, and then each op pays one predictable branch.
// Timing never changes results: it only reads the clock around an op.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "backend/backend.hpp"

namespace trainctl::backend::cpu {

// The Backend's op families (backend.hpp), counted as the ops report them: gemm includes the
// OpenBLAS calls, bf16/f16 widening, fp8 quantization and the bias epilogue; attention its own
// GEMMs and softmax; elementwise also bias_backward; reduction also amax. fp8 is never counted on
// its own (fp8 GEMMs count as gemm).
using backend::kNumOpFamilies;
using backend::op_family_name;
using backend::OpFamily;

struct OpStats {
  std::array<int64_t, kNumOpFamilies> ns{};     // cumulative wall time per family
  std::array<int64_t, kNumOpFamilies> calls{};  // number of calls per family
  double gemm_flops = 0;                        // 2 m n k batch summed over Backend::gemm calls
  int64_t total_ns() const;
};

// A table: family | calls | ms | share, plus the GEMM rate; `per` divides times (e.g. steps).
std::string format_op_stats(const OpStats& stats, double per = 1.0, std::string_view per_name = "");

// Controls of the CPU backend's counters; `be` must come from make_cpu_backend() (otherwise
// std::invalid_argument naming the backend it got).
void set_op_timing(Backend& be, bool enabled);
OpStats op_stats(const Backend& be);
void reset_op_stats(Backend& be);

// The counters a CpuBackend owns, and the scope guard each op opens.
class OpTimer {
 public:
  bool enabled = false;
  OpStats stats;
};

class ScopedOp {
 public:
  ScopedOp(OpTimer& timer, OpFamily family) : timer_(timer.enabled ? &timer : nullptr) {
    if (timer_) {
      family_ = static_cast<int>(family);
      start_ = std::chrono::steady_clock::now();
    }
  }
  ~ScopedOp() {
    if (!timer_) return;
    const auto elapsed = std::chrono::steady_clock::now() - start_;
    timer_->stats.ns[family_] +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count();
    timer_->stats.calls[family_] += 1;
  }
  ScopedOp(const ScopedOp&) = delete;
  ScopedOp& operator=(const ScopedOp&) = delete;

 private:
  OpTimer* timer_;
  int family_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace trainctl::backend::cpu
