# Wires the CUDA seam into the backend library. Used from lib/backend/CMakeLists.txt:
#   include(cuda/backend_cuda.cmake)
#   trainctl_backend_add_cuda(trainctl_backend)
# With CUDA (TRAINCTL_HAVE_CUDA, set by the top level where nvcc exists) the backend gets GPU
# detection and the cast check and links trainctl_kernels (which brings CUDA::cudart and the
# PUBLIC definition TRAINCTL_HAVE_CUDA=1). Without it, device_stub.cpp answers "CUDA not
# compiled in" behind the same header, so callers never need #if.
function(trainctl_backend_add_cuda target)
  set(here ${CMAKE_CURRENT_FUNCTION_LIST_DIR})
  if(TRAINCTL_HAVE_CUDA)
    target_sources(${target} PRIVATE ${here}/device.cpp ${here}/cast_check.cpp)
    target_link_libraries(${target} PUBLIC trainctl_kernels)
  else()
    target_sources(${target} PRIVATE ${here}/device_stub.cpp)
  endif()
endfunction()
