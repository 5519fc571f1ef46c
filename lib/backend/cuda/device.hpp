// GPU discovery and the CUDA build facts, for `trainctl version`, topology detection and the
// choice of backend. Declared the same with or without CUDA: a CPU-only build links
// device_stub.cpp (cuda_compiled == false, no GPUs, says why), a CUDA build links device.cpp.
// Callers therefore never need #if TRAINCTL_HAVE_CUDA.
//
// Never crashes on a machine without a driver or without a GPU: the CUDA runtime's error is
// cleared and reported as text in DeviceReport::status, and the caller falls back to the CPU.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace trainctl::backend {

struct GpuInfo {
  int index = 0;
  std::string name;         // "NVIDIA H200"
  size_t memory_bytes = 0;  // total device memory
  int cc_major = 0;         // compute capability, e.g. 9.0
  int cc_minor = 0;
  int sm_count = 0;  // streaming multiprocessors
};

struct DeviceReport {
  std::vector<GpuInfo> gpus;  // empty: no usable GPU (status says why)
  // One line for humans, e.g. "1 GPU: 0 NVIDIA H200 (sm_90, 139.8 GiB, 132 SMs); CUDA runtime
  // 13.0, driver 13.0", "no GPU (cudaGetDeviceCount: error 35 cudaErrorInsufficientDriver (...))"
  // or "CUDA not compiled in".
  std::string status;
  // What a run's first line says: `status` when there are GPUs; "no GPU found" when the machine
  // has none (no NVIDIA driver, or none reported); "no usable GPU: <why>" when a driver is there
  // but the GPUs cannot be used (then the detail matters); "CUDA not compiled in".
  std::string summary;
  bool cuda_compiled = false;
};

// Enumerates GPUs through the CUDA runtime. Cheap enough to call once per process.
DeviceReport detect_gpus();

// Version of the CUDA runtime library this binary uses, e.g. "13.0"; "" without CUDA.
std::string cuda_runtime_version();

// The versions of the GPU libraries whose results a run depends on, for provenance.json:
// {"cuda_runtime", "13.0"}, {"cuda_driver", "13.0"}, {"cublaslt", "13.0.0"}; empty without CUDA.
std::vector<std::pair<std::string, std::string>> cuda_library_versions();

// Architectures the kernels carry code for, e.g. {"sm_90"}; empty without CUDA.
std::vector<std::string> compiled_cuda_architectures();

// Test hook (tests/gpu, scripts on a GPU machine): runs the four cast kernels of kernels/cast.cuh
// on fresh random inputs (plus ties, subnormals, infinities, NaN, every fp16/bf16 bit pattern,
// aligned and unaligned pointers, poisoned outputs) and compares them bit for bit with the CPU
// conversions of tensor/dtype.hpp. Returns true when all match; *message (when not null) says
// what was checked, the seed, and the first mismatch or the reason it could not run (no GPU,
// CUDA not compiled in, a CUDA error).
bool gpu_cast_roundtrip_check(std::string* message);

}  // namespace trainctl::backend
