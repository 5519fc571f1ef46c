# TRAINCTL_GPU_ONLY=ON: build tests/gpu and the GPU benchmarks and only what they need (lib/tensor,
# lib/backend with its CPU reference, kernels/; for the benchmarks lib/data, comm, ckpt, model and
# train) on a GPU machine that has nvcc, CMake and ninja but none of our Debian libraries. Those
# come from a bundle made on a Debian machine by `scripts/gpu-check --bundle` (TRAINCTL_GPU_BUNDLE,
# unpacked by scripts/gpu-check): fmt and Catch2 headers (fmt is used header-only here), Catch2's
# CMake helpers, OpenBLAS (cblas.h, libopenblas.so.0 and the libgfortran/libquadmath it needs),
# nlohmann-json's headers, Gloo (headers, libgloo.so.0 and the hiredis, ibverbs and libnl
# libraries it loads), and OpenSSL's libcrypto with its headers. Included from the top-level CMakeLists.txt, which returns right after;
# docs/cuda.md says how a GPU session runs it.
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
# The binaries find the bundle's libraries by themselves (no LD_LIBRARY_PATH), so they run by hand
# and under compute-sanitizer too. --disable-new-dtags writes DT_RPATH, which also serves the
# libraries those libraries need (libopenblas -> libgfortran, libquadmath; libgloo -> hiredis,
# ibverbs, libnl); the default DT_RUNPATH would serve the binary's direct libraries only.
set(CMAKE_BUILD_RPATH "${bundle_lib}")
add_link_options(LINKER:--disable-new-dtags)

# The benchmarks (bench/gpu_*.cpp) train through lib/train, so lib/data, lib/ckpt, lib/comm and
# lib/model come too. nlohmann-json is header-only. lib/comm looks for Gloo's CMake config first:
# this one, written here, makes the bundle's libgloo the target `gloo` inside lib/comm's own
# folder (an imported target made here could not be promoted to global there).
find_package(Threads REQUIRED)
# The TCP store's handshake in lib/comm: OpenSSL's libcrypto from the bundle (lib/comm looks for
# the system's only when this target does not exist).
add_library(OpenSSL::Crypto SHARED IMPORTED)
set_target_properties(OpenSSL::Crypto PROPERTIES
  IMPORTED_LOCATION "${bundle_lib}/libcrypto.so.3"
  INTERFACE_INCLUDE_DIRECTORIES "${TRAINCTL_GPU_BUNDLE}/include")
add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
set_target_properties(nlohmann_json::nlohmann_json PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${TRAINCTL_GPU_BUNDLE}/include")
set(Gloo_DIR "${CMAKE_BINARY_DIR}/gloo-config" CACHE PATH "Gloo config of the bundle" FORCE)
file(WRITE "${Gloo_DIR}/GlooConfig.cmake"
  "add_library(gloo SHARED IMPORTED)\n"
  "set_target_properties(gloo PROPERTIES IMPORTED_LOCATION \"${bundle_lib}/libgloo.so.0\"\n"
  "  INTERFACE_INCLUDE_DIRECTORIES \"${TRAINCTL_GPU_BUNDLE}/include\")\n")

add_subdirectory(lib/tensor)
add_subdirectory(lib/backend)
add_subdirectory(kernels)
foreach(module files data comm ckpt model train)
  add_subdirectory(lib/${module})
endforeach()
add_subdirectory(bench)
enable_testing()
add_subdirectory(tests/gpu)
message(STATUS "trainctl: GPU-only build (tests/gpu, bench/gpu_*) with the bundle ${TRAINCTL_GPU_BUNDLE}")
