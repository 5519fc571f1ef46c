// nvcc defines __CUDA_ARCH_LIST__ in the host pass too: the virtual architectures being compiled,
// e.g. 800,900. Reading it here, in the library that holds the kernels, keeps the answer honest.
#include <string>
#include <vector>

#include "kernels/build_info.cuh"

namespace trainctl::kernels {

std::vector<int> compiled_architectures() {
#ifdef __CUDA_ARCH_LIST__
  static constexpr int kList[] = {__CUDA_ARCH_LIST__};
  std::vector<int> result;
  for (const int arch : kList)
    result.push_back(arch / 10);  // 900 -> 90
  return result;
#else
  return {};
#endif
}

std::string compiled_toolkit_version() {
  return std::to_string(__CUDACC_VER_MAJOR__) + "." + std::to_string(__CUDACC_VER_MINOR__);
}

}  // namespace trainctl::kernels
