// Shared helpers of the backend unit tests: random tensors in any float dtype, conversion to and
// from plain double vectors (the naive references work on those), error measures, and the central
// finite-difference checker used by the gradient tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "tensor/rng.hpp"
#include "tensor/tensor.hpp"

namespace backend_test {

using trainctl::backend::Backend;
using trainctl::tensor::DType;
using trainctl::tensor::OwnedTensor;
using trainctl::tensor::Shape;
using trainctl::tensor::Tensor;
using Values = std::vector<double>;

inline constexpr DType kFloatTypes[] = {DType::f64, DType::f32, DType::bf16, DType::f16};

// Tolerance on max|got - ref| / max|ref| for one op in storage type `dtype`.
inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-5;
    case DType::bf16:
      return 2e-2;
    case DType::f16:
      return 5e-3;
    default:
      return 0;
  }
}

inline Backend& cpu() {
  static std::unique_ptr<Backend> backend = trainctl::backend::make_cpu_backend();
  return *backend;
}

// Standard normal values times `scale`, keyed by `stream`.
inline Values random_values(size_t count, uint64_t stream, double scale = 1.0) {
  trainctl::tensor::CounterRng rng(1234, stream);
  Values v(count);
  for (size_t i = 0; i < count; ++i)
    v[i] = rng.normal(i) * scale;
  return v;
}

inline Values read(const Tensor& t) {
  Values v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    v[static_cast<size_t>(i)] = get_element(t, i);
  return v;
}

inline void write(const Tensor& t, const Values& v) {
  for (int64_t i = 0; i < t.numel(); ++i)
    set_element(t, i, v[static_cast<size_t>(i)]);
}

inline OwnedTensor make(DType dtype, Shape shape, const Values& values) {
  OwnedTensor t(dtype, shape);
  write(t, values);
  return t;
}

inline OwnedTensor make_i32(Shape shape, const std::vector<int32_t>& values) {
  OwnedTensor t(DType::i32, shape);
  std::copy(values.begin(), values.end(), t.as<int32_t>());
  return t;
}

// The values a tensor of `dtype` would hold.
inline Values rounded(DType dtype, const Values& values) {
  return read(make(dtype, Shape{static_cast<int64_t>(values.size())}, values));
}

// max |got - ref| / max |ref|.
inline double rel_error(const Values& got, const Values& ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(got.at(i) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

inline double dot(const Values& a, const Values& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    s += a[i] * b[i];
  return s;
}

// Central differences (eps = 1e-6) of loss() with respect to every element of the f64 tensor
// `input`, compared with `analytic`: max |numeric - analytic| / max |analytic|.
inline double fd_error(const Tensor& input, const Values& analytic,
                       const std::function<double()>& loss, double eps = 1e-6) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < input.numel(); ++i) {
    double* x = input.as<double>() + i;
    const double x0 = *x;
    *x = x0 + eps;
    const double plus = loss();
    *x = x0 - eps;
    const double minus = loss();
    *x = x0;
    const double numeric = (plus - minus) / (2 * eps);
    diff = std::max(diff, std::abs(numeric - analytic.at(static_cast<size_t>(i))));
    scale = std::max(scale, std::abs(analytic[static_cast<size_t>(i)]));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace backend_test
