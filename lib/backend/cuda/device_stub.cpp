// The CPU-only build of device.hpp: no CUDA toolkit was found at configure time, so there is
// nothing to detect. Each answer says so plainly rather than pretending there are no GPUs.
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/device.hpp"

namespace trainctl::backend {

namespace {
constexpr const char* kNotCompiled =
    "CUDA not compiled in (no nvcc at configure time; install the CUDA toolkit and reconfigure)";
}

DeviceReport detect_gpus() {
  DeviceReport report;
  report.cuda_compiled = false;
  report.status = kNotCompiled;
  report.summary = "CUDA not compiled in";
  return report;
}

std::string cuda_runtime_version() {
  return "";
}

std::vector<std::pair<std::string, std::string>> cuda_library_versions() {
  return {};
}

std::vector<std::string> compiled_cuda_architectures() {
  return {};
}

bool gpu_cast_roundtrip_check(std::string* message) {
  if (message != nullptr) *message = kNotCompiled;
  return false;
}

std::unique_ptr<Backend> make_cuda_backend(int device, bool /*deterministic*/) {
  throw std::runtime_error("cuda backend for GPU " + std::to_string(device) +
                           " unavailable: this build has no CUDA (" + kNotCompiled + ")");
}

}  // namespace trainctl::backend
