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
    target_sources(${target} PRIVATE
      ${here}/device.cpp
      ${here}/cast_check.cpp
      ${here}/cuda_backend.cpp
      ${here}/cuda_gemm.cpp
      ${here}/cuda_ops.cpp)
    # The layer ops (norms, attention, embedding, loss, MoE) live in their own file.
    if(EXISTS ${here}/cuda_layers.cpp)
      target_sources(${target} PRIVATE ${here}/cuda_layers.cpp)
    endif()
    target_link_libraries(${target} PUBLIC trainctl_kernels CUDA::cublasLt)
  else()
    target_sources(${target} PRIVATE ${here}/device_stub.cpp)
  endif()
endfunction()
