# TRAINCTL_GPU_ONLY=ON: build tests/gpu and only what it needs (lib/tensor, lib/backend with its
# CPU reference, kernels/) on a GPU machine that has nvcc, CMake and ninja but none of our Debian
# libraries. Those come from a bundle made on a Debian machine by `scripts/gpu-check --bundle`
# (TRAINCTL_GPU_BUNDLE, unpacked by scripts/gpu-check): fmt and Catch2 headers (fmt is used
# header-only here), Catch2's CMake helpers, and OpenBLAS (cblas.h, libopenblas.so.0 and the
# libgfortran/libquadmath it needs). Included from the top-level CMakeLists.txt, which returns
# right after; docs/cuda.md says how a GPU session runs it.
set(TRAINCTL_GPU_BUNDLE "" CACHE PATH "Unpacked bundle of scripts/gpu-check --bundle")
if(NOT EXISTS "${TRAINCTL_GPU_BUNDLE}/include/cblas.h")
  message(FATAL_ERROR "TRAINCTL_GPU_ONLY needs TRAINCTL_GPU_BUNDLE=<dir> with include/cblas.h; "
                      "make the bundle with scripts/gpu-check --bundle on a Debian machine, and "
                      "build through scripts/gpu-check, which unpacks it")
endif()

# ---- CUDA (required here: this build exists to run on a GPU) ----
set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(TRAINCTL_HAVE_CUDA ON)

# ---- the bundle as the targets the normal build gets from Debian ----
set(bundle_lib "${TRAINCTL_GPU_BUNDLE}/lib")
add_library(PkgConfig::OPENBLAS SHARED IMPORTED)
set_target_properties(PkgConfig::OPENBLAS PROPERTIES
  IMPORTED_LOCATION "${bundle_lib}/libopenblas.so.0"
  INTERFACE_INCLUDE_DIRECTORIES "${TRAINCTL_GPU_BUNDLE}/include")
add_library(fmt::fmt INTERFACE IMPORTED)
set_target_properties(fmt::fmt PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${TRAINCTL_GPU_BUNDLE}/include"
  INTERFACE_COMPILE_DEFINITIONS "FMT_HEADER_ONLY=1")
add_library(Catch2::Catch2 INTERFACE IMPORTED)
set_target_properties(Catch2::Catch2 PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${TRAINCTL_GPU_BUNDLE}/include")
list(APPEND CMAKE_MODULE_PATH "${TRAINCTL_GPU_BUNDLE}/cmake")
include(Catch)
# libopenblas finds libgfortran through this rpath too (set on the test binary).
set(CMAKE_BUILD_RPATH "${bundle_lib}")

add_subdirectory(lib/tensor)
add_subdirectory(lib/backend)
add_subdirectory(kernels)
enable_testing()
add_subdirectory(tests/gpu)
message(STATUS "trainctl: GPU-only build (tests/gpu) with the bundle ${TRAINCTL_GPU_BUNDLE}")
