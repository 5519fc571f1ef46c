// The argument checks of the Backend contract (backend.hpp), written once for every backend: the
// shapes, dtypes and sizes an op requires, whatever memory its tensors live in. Backend's public
// ops run them (backend_ops.cpp) before calling the backend's do_<op>; a backend adds only what it
// alone can or must check (the CPU backend reads token ids, targets and slots; the CUDA backend
// checks the dtypes it computes on and its kernels' limits) with the same ArgCheck::fail.
// Every failure throws std::invalid_argument "<name> backend <op>: <what>".
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "backend/backend.hpp"

namespace trainctl::backend {

class ArgCheck {
 public:
  // backend: the backend's name ("cpu": messages start "cpu backend <op>: "); device: where its
  // tensors live. A tensor elsewhere "is not in host memory" (cpu) or "is in host memory; the
  // <name> backend takes tensors from its own allocate()" (a device backend).
  constexpr ArgCheck(std::string_view backend, Device device)
      : backend_(backend), device_(device) {}
  explicit ArgCheck(const BackendDevice& backend) : ArgCheck(backend.name(), backend.device()) {}

  [[noreturn]] void fail(std::string_view op, const std::string& message) const;
  // t has data and lives on this backend's device.
  void present(std::string_view op, std::string_view name, const Tensor& t) const;
  void dtype(std::string_view op, std::string_view name, const Tensor& t, DType expected) const;
  void numel(std::string_view op, std::string_view name, const Tensor& t, int64_t expected) const;
  // Rows of a [rows, width] matrix given its row width; fails when numel is not a multiple.
  int64_t rows(std::string_view op, std::string_view name, const Tensor& t, int64_t width) const;

  // GemmArgs: operands present, sizes positive, a and b one dtype, c that dtype or G, every batch
  // inside its tensor, bias [n] of c's or a's dtype; fp8 operands and the gelu epilogue as the
  // contract restricts them.
  void gemm(const GemmArgs& g) const;
  // out [1] f32; src present, f32, bf16 or f16.
  void amax(const Tensor& out, const Tensor& src) const;
  // AdamW ranges over tensors of `count` elements: ascending, disjoint, inside.
  void adamw_ranges(std::string_view op, int64_t count,
                    std::span<const Backend::AdamWRange> ranges) const;
  // Positive sizes, H a multiple of KV.
  void attention(std::string_view op, const AttentionShape& s) const;
  void attention_block(std::string_view op, const AttentionBlockShape& s) const;

  struct RouterDims {
    int64_t N, E, K;
  };
  // logits [N, E]; probs, gates, load in stats_dtype(logits); expert_idx, slot, counts i32.
  RouterDims router(std::string_view op, const RouterArgs& r) const;

  struct PermuteDims {
    int64_t N, K, C, R;
  };
  // tokens [N, C], expert rows [R, C] of the tokens' dtype, slot [N, K] i32 (its values are the
  // caller's to check where it can read them).
  PermuteDims permute(std::string_view op, std::string_view token_name, const Tensor& tokens,
                      std::string_view expert_name, const Tensor& experts,
                      const Tensor& slot) const;

 private:
  std::string_view backend_;
  Device device_;
};

}  // namespace trainctl::backend
