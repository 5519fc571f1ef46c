#include "tensor/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace trainctl::tensor {

Shape::Shape(std::initializer_list<int64_t> list) {
  if (list.size() > kMaxDims) throw std::invalid_argument("Shape: more than 4 dimensions");
  for (int64_t d : list)
    dims[static_cast<size_t>(rank++)] = d;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i)
    n *= dims[static_cast<size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& other) const {
  if (rank != other.rank) return false;
  for (int i = 0; i < rank; ++i)
    if (dims[static_cast<size_t>(i)] != other.dims[static_cast<size_t>(i)]) return false;
  return true;
}

std::string Shape::to_string() const {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[static_cast<size_t>(i)]);
  }
  return s + "]";
}

Tensor Tensor::rows(int64_t first, int64_t count) const {
  if (shape.rank == 0 || first < 0 || count < 0 || first + count > shape[0])
    throw std::out_of_range("Tensor::rows: range outside " + shape.to_string());
  Tensor t = *this;
  const int64_t row_elems = shape[0] ? numel() / shape[0] : 0;
  t.data = static_cast<char*>(data) + static_cast<size_t>(first * row_elems) * dtype_size(dtype);
  t.shape.dims[0] = count;
  return t;
}

Tensor Tensor::reshaped(Shape new_shape) const {
  if (new_shape.numel() != numel())
    throw std::invalid_argument("Tensor::reshaped: " + shape.to_string() + " -> " +
                                new_shape.to_string() + " changes the element count");
  Tensor t = *this;
  t.shape = new_shape;
  return t;
}

void Buffer::Free::operator()(void* p) const {
  std::free(p);
}

Buffer::Buffer(size_t bytes) : bytes_(bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
  if (rounded && !p) throw std::bad_alloc();
  if (p) std::memset(p, 0, rounded);
  data_.reset(p);
}

Tensor Buffer::view(DType dtype, Shape shape, size_t byte_offset) const {
  Tensor t;
  t.data = static_cast<char*>(data_.get()) + byte_offset;
  t.dtype = dtype;
  t.shape = shape;
  if (byte_offset + t.bytes() > bytes_)
    throw std::out_of_range("Buffer::view: " + shape.to_string() + " at offset " +
                            std::to_string(byte_offset) + " exceeds " + std::to_string(bytes_) +
                            " bytes");
  return t;
}

OwnedTensor::OwnedTensor(DType dtype, Shape shape)
    : buffer_(static_cast<size_t>(shape.numel()) * dtype_size(dtype)),
      view_(buffer_.view(dtype, shape)) {}

double get_element(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::f64:
      return t.as<double>()[i];
    case DType::f32:
      return t.as<float>()[i];
    case DType::bf16:
      return to_float(t.as<bf16>()[i]);
    case DType::f16:
      return to_float(t.as<f16>()[i]);
    case DType::e4m3:
      return to_float(t.as<e4m3>()[i]);
    case DType::e5m2:
      return to_float(t.as<e5m2>()[i]);
    case DType::i32:
      return t.as<int32_t>()[i];
    case DType::u16:
      return t.as<uint16_t>()[i];
  }
  return 0;
}

void set_element(const Tensor& t, int64_t i, double v) {
  switch (t.dtype) {
    case DType::f64:
      t.as<double>()[i] = v;
      break;
    case DType::f32:
      t.as<float>()[i] = static_cast<float>(v);
      break;
    case DType::bf16:
      t.as<bf16>()[i] = to_bf16(static_cast<float>(v));
      break;
    case DType::f16:
      t.as<f16>()[i] = to_f16(static_cast<float>(v));
      break;
    case DType::e4m3:
      t.as<e4m3>()[i] = to_e4m3(static_cast<float>(v));
      break;
    case DType::e5m2:
      t.as<e5m2>()[i] = to_e5m2(static_cast<float>(v));
      break;
    case DType::i32:
      t.as<int32_t>()[i] = static_cast<int32_t>(v);
      break;
    case DType::u16:
      t.as<uint16_t>()[i] = static_cast<uint16_t>(v);
      break;
  }
}

}  // namespace trainctl::tensor
