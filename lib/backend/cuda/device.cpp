// GPU discovery through the CUDA runtime (libcudart only: the runtime loads the driver itself,
// so this binary starts, and answers "no GPU", on machines without one).
//
// Without a GPU cudaGetDeviceCount fails: error 35 (driver too old / absent), 100 (no device),
// 3 or 999 in some containers. Any error, or a count of zero, means "no GPU"; the runtime's
// sticky last error is cleared so later CUDA calls do not report it again.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/core.h>

#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/device.hpp"
#include "kernels/build_info.cuh"
#include "kernels/check.cuh"

namespace trainctl::backend {

namespace {

// 13000 -> "13.0", 12040 -> "12.4"; 0 (no driver) -> "none".
std::string format_cuda_version(int version) {
  if (version <= 0) return "none";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

std::string describe_gpu(const GpuInfo& gpu) {
  char memory[32];
  std::snprintf(memory, sizeof(memory), "%.1f GiB",
                static_cast<double>(gpu.memory_bytes) / (1024.0 * 1024.0 * 1024.0));
  return std::to_string(gpu.index) + " " + gpu.name + " (sm_" + std::to_string(gpu.cc_major) +
         std::to_string(gpu.cc_minor) + ", " + memory + ", " + std::to_string(gpu.sm_count) +
         " SMs)";
}

// The installed driver's CUDA version; 0 when there is no NVIDIA driver.
int driver_version() {
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) {
    (void)cudaGetLastError();
    driver = 0;
  }
  return driver;
}

std::string versions_line() {
  return "CUDA runtime " + cuda_runtime_version() + ", driver " +
         format_cuda_version(driver_version());
}

constexpr const char* kNoGpu = "no GPU found";

}  // namespace

std::vector<std::pair<std::string, std::string>> cuda_library_versions() {
  // cublasLtGetVersion: major * 10000 + minor * 100 + patch (cuBLAS 12.x, 13.x).
  const size_t lt = cublasLtGetVersion();
  return {{"cuda_runtime", cuda_runtime_version()},
          {"cuda_driver", format_cuda_version(driver_version())},
          {"cublaslt", fmt::format("{}.{}.{}", lt / 10000, lt / 100 % 100, lt % 100)}};
}

std::string cuda_runtime_version() {
  int version = 0;
  if (cudaRuntimeGetVersion(&version) != cudaSuccess) {
    (void)cudaGetLastError();
    return "unknown";
  }
  return format_cuda_version(version);
}

std::vector<std::string> compiled_cuda_architectures() {
  std::vector<std::string> names;
  for (const int arch : kernels::compiled_architectures()) {
    names.push_back("sm_" + std::to_string(arch));
  }
  return names;
}

DeviceReport detect_gpus() {
  DeviceReport report;
  report.cuda_compiled = true;

  int count = 0;
  const cudaError_t count_status = cudaGetDeviceCount(&count);
  if (count_status != cudaSuccess) {
    (void)cudaGetLastError();
    report.status = "no GPU (cudaGetDeviceCount: " + kernels::describe_cuda_error(count_status) +
                    "; " + versions_line() + ")";
    // Without a driver (or with no device behind it) this is simply a machine without a GPU.
    const bool none = driver_version() == 0 || count_status == cudaErrorNoDevice;
    report.summary = none ? kNoGpu : "no usable GPU: " + report.status;
    return report;
  }
  if (count <= 0) {
    report.status = "no GPU (cudaGetDeviceCount found 0 devices; " + versions_line() + ")";
    report.summary = kNoGpu;
    return report;
  }

  std::string problems;
  for (int index = 0; index < count; ++index) {
    cudaDeviceProp properties{};
    const cudaError_t status = cudaGetDeviceProperties(&properties, index);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      problems += "; GPU " + std::to_string(index) +
                  " skipped (cudaGetDeviceProperties: " + kernels::describe_cuda_error(status) +
                  ")";
      continue;
    }
    GpuInfo gpu;
    gpu.index = index;
    gpu.name = properties.name;
    gpu.memory_bytes = properties.totalGlobalMem;
    gpu.cc_major = properties.major;
    gpu.cc_minor = properties.minor;
    gpu.sm_count = properties.multiProcessorCount;
    report.gpus.push_back(gpu);
  }

  if (report.gpus.empty()) {
    report.status = "no GPU (" + std::to_string(count) + " reported, none readable" + problems +
                    "; " + versions_line() + ")";
    report.summary = "no usable GPU: " + report.status;
    return report;
  }
  report.status =
      std::to_string(report.gpus.size()) + (report.gpus.size() == 1 ? " GPU: " : " GPUs: ");
  for (size_t i = 0; i < report.gpus.size(); ++i) {
    if (i > 0) report.status += ", ";
    report.status += describe_gpu(report.gpus[i]);
  }
  report.status += problems + "; " + versions_line();
  report.summary = report.status;
  return report;
}

}  // namespace trainctl::backend
