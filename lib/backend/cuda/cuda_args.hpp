// Argument checks shared by cuda_backend.cpp and cuda_ops.cpp (private to lib/backend/cuda).
// Each throws std::invalid_argument "cuda backend <op>: <what is wrong>", like the CPU backend's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "backend/arg_check.hpp"
#include "backend/backend.hpp"
#include "kernels/elementwise.cuh"

namespace trainctl::backend::cuda {

// The Backend contract's argument checks with this backend's messages; the functions below are
// shorthands for it.
extern const ArgCheck kArgs;
[[noreturn]] void fail(std::string_view op, const std::string& message);

// t has data and lives on the GPU.
void expect_gpu(std::string_view op, std::string_view name, const Tensor& t);
void expect_numel(std::string_view op, std::string_view name, const Tensor& t, int64_t expected);
void expect_dtype(std::string_view op, std::string_view name, const Tensor& t, DType expected);
int64_t rows_of(std::string_view op, std::string_view name, const Tensor& t, int64_t width);

// The kernel type of a dtype the CUDA backend computes on (f32, bf16, f16); any other dtype
// fails naming the op and the argument.
kernels::Storage storage_type(std::string_view op, std::string_view name, DType dtype);

}  // namespace trainctl::backend::cuda
