// The CUDA backend's own argument checks (private to lib/backend/cuda): what it alone must check
// after the contract's checks (Backend's wrappers, backend_ops.cpp) passed: the dtypes it computes
// on and its kernels' limits. Each throws std::invalid_argument "cuda backend <op>: <what>".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "backend/arg_check.hpp"
#include "backend/backend.hpp"
#include "kernels/elementwise.cuh"

namespace trainctl::backend::cuda {

// This backend's messages ("cuda backend <op>: ...").
extern const ArgCheck kArgs;
[[noreturn]] void fail(std::string_view op, const std::string& message);

// The kernel type of a dtype the CUDA backend computes on (f32, bf16, f16); any other dtype
// fails naming the op and the argument.
kernels::Storage storage_type(std::string_view op, std::string_view name, DType dtype);
// storage_type of t's dtype. Where it passes, the op's statistics and gradients (A, G) are f32.
inline kernels::Storage storage_of(std::string_view op, std::string_view name, const Tensor& t) {
  return storage_type(op, name, t.dtype);
}

}  // namespace trainctl::backend::cuda
