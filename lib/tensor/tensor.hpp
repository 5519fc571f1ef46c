// Tensor: a non-owning view (pointer, dtype, shape, device) over memory owned by a Buffer or an
// arena. Row-major, contiguous: the engine never needs strided views beyond what the ops take as
// explicit arguments. Buffer: an owning, 64-byte aligned host allocation.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "tensor/dtype.hpp"

namespace trainctl::tensor {

enum class Device : uint8_t { cpu, cuda };

inline constexpr int kMaxDims = 4;

struct Shape {
  std::array<int64_t, kMaxDims> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> list);
  int64_t numel() const;
  int64_t operator[](int i) const { return dims[static_cast<size_t>(i)]; }
  bool operator==(const Shape& other) const;
  std::string to_string() const;  // "[4, 128]"
};

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;
  Device device = Device::cpu;

  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool empty() const { return data == nullptr; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // A view of `count` rows starting at row `first` (dimension 0), other dims unchanged.
  Tensor rows(int64_t first, int64_t count) const;
  // The same memory seen with another shape of the same element count.
  Tensor reshaped(Shape new_shape) const;
};

// Owning, aligned host memory. Move-only.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes);  // zero-filled
  size_t bytes() const { return bytes_; }
  void* data() const { return data_.get(); }
  Tensor view(DType dtype, Shape shape, size_t byte_offset = 0) const;

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  size_t bytes_ = 0;
};

// A tensor that owns its memory (for tests, small state and scratch).
class OwnedTensor {
 public:
  OwnedTensor() = default;
  OwnedTensor(DType dtype, Shape shape);
  const Tensor& view() const { return view_; }
  operator const Tensor&() const { return view_; }
  template <class T>
  T* as() const {
    return view_.as<T>();
  }
  int64_t numel() const { return view_.numel(); }

 private:
  Buffer buffer_;
  Tensor view_;
};

// Read/write one element as double whatever the dtype (tests, checkpoints, gradient checks).
double get_element(const Tensor& t, int64_t index);
void set_element(const Tensor& t, int64_t index, double value);

}  // namespace trainctl::tensor
