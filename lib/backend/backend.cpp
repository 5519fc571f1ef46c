// The backend-independent parts of backend.hpp: derived dtypes, op families, capabilities, the
// device part's checked copies and passed fence, Allocation. The ops' wrappers are in
// backend_ops.cpp.
#include "backend/backend.hpp"

#include <memory>
#include <stdexcept>
#include <utility>

#include "backend/arg_check.hpp"
#include "tensor/fp8_scale.hpp"

namespace trainctl::backend {

DType grad_dtype(DType storage) {
  return storage == DType::f64 ? DType::f64 : DType::f32;
}

DType stats_dtype(DType storage) {
  return storage == DType::f64 ? DType::f64 : DType::f32;
}

float fp8_scale(DType format, float amax) {
  switch (format) {
    case DType::e4m3:
      return tensor::fp8_scale_for(tensor::kE4M3Max, amax);
    case DType::e5m2:
      return tensor::fp8_scale_for(tensor::kE5M2Max, amax);
    default:
      throw std::invalid_argument("fp8_scale: the format must be e4m3 or e5m2");
  }
}

namespace {

// The fence of a backend whose ops are complete when they return.
class PassedFence final : public BackendDevice::Fence {
 public:
  void wait() override {}
};

}  // namespace

std::unique_ptr<BackendDevice::Fence> BackendDevice::fence() {
  return std::make_unique<PassedFence>();
}

void BackendDevice::copy_to_host(void* dst, const Tensor& src) {
  ArgCheck(*this).present("copy_to_host", "src", src);
  do_copy_to_host(dst, src);
}

void BackendDevice::copy_from_host(const Tensor& dst, const void* src) {
  ArgCheck(*this).present("copy_from_host", "dst", dst);
  do_copy_from_host(dst, src);
}

std::string_view op_family_name(OpFamily family) {
  switch (family) {
    case OpFamily::gemm:
      return "gemm";
    case OpFamily::attention:
      return "attention";
    case OpFamily::norm:
      return "norm";
    case OpFamily::activation:
      return "activation";
    case OpFamily::rope:
      return "rope";
    case OpFamily::embedding:
      return "embedding";
    case OpFamily::loss:
      return "loss";
    case OpFamily::moe:
      return "moe";
    case OpFamily::optimizer:
      return "optimizer";
    case OpFamily::elementwise:
      return "elementwise";
    case OpFamily::reduction:
      return "reduction";
    case OpFamily::fp8:
      return "fp8";
    case OpFamily::count:
      break;
  }
  return "?";
}

bool Capabilities::supports(OpFamily family) const {
  if (family == OpFamily::fp8) return fp8;
  const int bit = static_cast<int>(family);
  return bit >= 0 && bit < kNumOpFamilies && ((op_families >> bit) & 1u) != 0;
}

void Capabilities::set_supported(OpFamily family, bool supported) {
  if (family == OpFamily::fp8) {
    fp8 = supported;
    return;
  }
  const uint32_t bit = uint32_t{1} << static_cast<int>(family);
  op_families = supported ? (op_families | bit) : (op_families & ~bit);
}

bool Capabilities::supports(DType storage) const {
  switch (storage) {
    case DType::f64:
      return f64;
    case DType::f32:
      return f32;
    case DType::bf16:
      return bf16;
    case DType::f16:
      return f16;
    case DType::e4m3:
    case DType::e5m2:  // operands of fp8 GEMMs (the fp8 flag), never parameters or activations
    case DType::i32:
    case DType::u16:
      return false;  // not a storage type for parameters and activations
  }
  return false;
}

Allocation::Allocation(Allocation&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

Allocation& Allocation::operator=(Allocation&& other) noexcept {
  if (this != &other) {
    if (owner_ && data_) owner_->deallocate(data_);
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

Allocation::~Allocation() {
  if (owner_ && data_) owner_->deallocate(data_);
}

Tensor Allocation::view(DType dtype, Shape shape, size_t byte_offset) const {
  Tensor t;
  t.data = static_cast<char*>(data_) + byte_offset;
  t.dtype = dtype;
  t.shape = shape;
  t.device = owner_ ? owner_->device() : Device::cpu;
  if (byte_offset + t.bytes() > bytes_)
    throw std::out_of_range("Allocation::view: " + shape.to_string() + " of " +
                            std::string(tensor::dtype_name(dtype)) + " at byte offset " +
                            std::to_string(byte_offset) + " exceeds the " + std::to_string(bytes_) +
                            "-byte allocation");
  return t;
}

}  // namespace trainctl::backend
