// `trainctl version`: version, build type, compiled backends and linked library versions.
#include <cblas.h>
#include <fmt/core.h>
#include <hwloc.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include <string>

#include "backend/cuda/device.hpp"
#include "commands.hpp"
#include "run/build_info.hpp"

#ifndef TRAINCTL_YAML_CPP_VERSION
#define TRAINCTL_YAML_CPP_VERSION "unknown"
#endif
#ifndef TRAINCTL_BUILD_TYPE
#define TRAINCTL_BUILD_TYPE "unknown"
#endif

namespace trainctl::app {

int run_version(const VersionOptions&) {
  const run::BuildInfo& b = run::build_info();
  fmt::print("trainctl {}\n", b.version);
  fmt::print("source:    commit {} ({} tree)\n", b.commit, b.tree);
  fmt::print("build:     {} ({} {}.{}.{}, C++{})\n", TRAINCTL_BUILD_TYPE, "gcc", __GNUC__,
             __GNUC_MINOR__, __GNUC_PATCHLEVEL__, __cplusplus / 100 % 10000);
  std::string backends = "cpu";
  const auto archs = backend::compiled_cuda_architectures();
  if (!archs.empty()) {
    backends += "; cuda kernels (";
    for (size_t i = 0; i < archs.size(); ++i)
      backends += (i ? ", " : "") + archs[i];
    backends += ", CUDA runtime " + backend::cuda_runtime_version() +
                ") compiled; the CUDA backend is opt-in (cluster.device: cuda) until tests/gpu has "
                "passed on a GPU";
  }
  fmt::print("backends:  {}\n", backends);
  fmt::print(
      "libraries: OpenBLAS ({}) | yaml-cpp {} | fmt {}.{}.{} | nlohmann-json {}.{}.{} | hwloc API "
      "{}.{}.{}\n",
      openblas_get_config(), TRAINCTL_YAML_CPP_VERSION, FMT_VERSION / 10000,
      FMT_VERSION / 100 % 100, FMT_VERSION % 100, NLOHMANN_JSON_VERSION_MAJOR,
      NLOHMANN_JSON_VERSION_MINOR, NLOHMANN_JSON_VERSION_PATCH, HWLOC_API_VERSION >> 16,
      (HWLOC_API_VERSION >> 8) & 0xff, HWLOC_API_VERSION & 0xff);
  fmt::print("devices:   {}\n", backend::detect_gpus().status);
  return kExitOk;
}

}  // namespace trainctl::app
