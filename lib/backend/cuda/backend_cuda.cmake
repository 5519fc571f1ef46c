# Wires the CUDA seam into the backend library. Used from lib/backend/CMakeLists.txt:
#   include(cuda/backend_cuda.cmake)
#   trainctl_backend_add_cuda(trainctl_backend)
# With CUDA (TRAINCTL_HAVE_CUDA, set by the top level where nvcc exists) the backend gets GPU
# detection, the cast check and the CUDA backend (CudaBackend: cuBLASLt GEMMs plus the kernels of
# kernels/), and links trainctl_kernels (which brings CUDA::cudart and the PUBLIC definition
# TRAINCTL_HAVE_CUDA=1) and cuBLASLt. Without it, device_stub.cpp answers "CUDA not compiled in"
# behind the same headers (make_cuda_backend throws), so callers never need #if.
function(trainctl_backend_add_cuda target)
  set(here ${CMAKE_CURRENT_FUNCTION_LIST_DIR})
  if(TRAINCTL_HAVE_CUDA)
    # One file per op family, as in cpu/ (cuda_backend.cpp: construction, memory, fences).
    target_sources(${target} PRIVATE
      ${here}/device.cpp
      ${here}/cast_check.cpp
      ${here}/cuda_backend.cpp
      ${here}/elementwise.cpp
      ${here}/gemm.cpp
      ${here}/norm.cpp
      ${here}/activation.cpp
      ${here}/rope.cpp
      ${here}/attention.cpp
      ${here}/embedding.cpp
      ${here}/loss.cpp
      ${here}/moe.cpp
      ${here}/adamw.cpp
      ${here}/momentum.cpp)
    target_link_libraries(${target} PUBLIC trainctl_kernels CUDA::cublasLt)
  else()
    target_sources(${target} PRIVATE ${here}/device_stub.cpp)
  endif()
endfunction()
