// CpuBackend: construction, capabilities, scratch and memory (elementwise ops and reductions are in
// elementwise.cpp, each op family in its own file).
#include "backend/cpu/cpu_backend.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string_view>

namespace trainctl::backend {

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<cpu::CpuBackend>();
}

namespace cpu {

// ---- this backend's own checks ----------------------------------------------------------------

const ArgCheck kArgs{"cpu", Device::cpu};

void fail(std::string_view op, const std::string& message) {
  kArgs.fail(op, message);
}

void fail_unsupported_dtype(std::string_view op, std::string_view name, DType dtype) {
  fail(op, fmt::format("{} has dtype {}, expected one of f64, f32, bf16, f16", name,
                       tensor::dtype_name(dtype)));
}

void* ScratchPool::raw(size_t slot, size_t bytes) {
  tensor::Buffer& buffer = buffers_.at(slot);
  if (buffer.bytes() < bytes) buffer = tensor::Buffer(bytes + bytes / 2);  // grow by 1.5x
  return buffer.data();
}

// ---- construction, backend description and memory ----------------------------------------------

CpuBackend::CpuBackend() {
  Capabilities caps;
  caps.f64 = caps.f32 = caps.bf16 = caps.f16 = true;
  caps.fp8 = true;  // fp8 GEMM operands, quantized exactly as on Hopper and multiplied in f32
  declare_capabilities(caps);  // every op family
  const char* timing = std::getenv("TRAINCTL_OP_TIMING");
  print_timing_ = timing && std::string_view(timing) != "" && std::string_view(timing) != "0";
  timer_.enabled = print_timing_;
}

CpuBackend::~CpuBackend() {
  if (print_timing_)
    fmt::print(stderr, "cpu backend op timing (TRAINCTL_OP_TIMING):\n{}",
               format_op_stats(timer_.stats));
}

Allocation CpuBackend::allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded ? rounded : 64);
  return Allocation(this, p, bytes);
}

void CpuBackend::deallocate(void* data) {
  std::free(data);
}

void CpuBackend::do_copy_to_host(void* dst, const Tensor& src) {
  std::memcpy(dst, src.data, src.bytes());
}

void CpuBackend::do_copy_from_host(const Tensor& dst, const void* src) {
  std::memcpy(dst.data, src, dst.bytes());
}

}  // namespace cpu
}  // namespace trainctl::backend
