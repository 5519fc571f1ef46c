// What the kernels library was compiled for, as nvcc saw it (not what CMake was asked for), so
// `trainctl version` and device detection can say "built for sm_90" and warn when a GPU is older.
#pragma once

#include <string>
#include <vector>

namespace trainctl::kernels {

// Compute capabilities the kernels carry code for, as integers: 90 for sm_90 (and sm_90a).
std::vector<int> compiled_architectures();

// The CUDA toolkit version nvcc reported when building, e.g. "13.0".
std::string compiled_toolkit_version();

}  // namespace trainctl::kernels
