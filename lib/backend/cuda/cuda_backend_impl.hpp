// What the files of the CUDA backend share (private to lib/backend/cuda): the stream, the cuBLASLt
// handle and workspace, a scratch buffer for kernels that need temporary device memory, and the
// error check every CUDA call goes through.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "backend/cuda/cuda_backend.hpp"

namespace trainctl::backend::cuda {

struct CudaBackend::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;  // cuBLASLt workspace
  size_t workspace_bytes = 0;
  void* scratch = nullptr;  // see scratch_for()
  size_t scratch_bytes = 0;
  int sm_count = 0;
  struct GemmPlans;                 // cuBLASLt plans per GEMM shape, path counts (gemm.cpp)
  GemmPlans* gemm_plans = nullptr;  // owned: create_gemm_plans / destroy_gemm_plans

  // Device scratch of at least `bytes` for kernels on `stream` (grows stream-ordered with
  // cudaFreeAsync/cudaMallocAsync, never synchronising the device; the model's first step sizes
  // it, later steps reuse it). Valid until the next call.
  void* scratch_for(size_t bytes);
};

CudaBackend::Impl::GemmPlans* create_gemm_plans();
void destroy_gemm_plans(CudaBackend::Impl::GemmPlans* plans);  // null: nothing

// Makes the backend's GPU current for the calling thread (the current device is per thread: an op
// called from another thread than the one that built the backend, a checkpoint writer say, must
// switch to our GPU first). Every op calls it before its first CUDA call.
void activate(const CudaBackend::Impl& impl, std::string_view op);

// Device pointers of tensors the checks passed: f32 statistics and gradients (null for an absent
// optional one) and i32 ids.
inline float* f32(const Tensor& t) {
  return t.empty() ? nullptr : static_cast<float*>(t.data);
}
inline const int32_t* i32(const Tensor& t) {
  return static_cast<const int32_t*>(t.data);
}

// Throws std::runtime_error "<op>: <what> failed: <cudaGetErrorString> (<code>)" unless ok.
void check_cuda(cudaError_t status, std::string_view op, std::string_view what);
void check_cublas(cublasStatus_t status, std::string_view op, std::string_view what);

}  // namespace trainctl::backend::cuda
