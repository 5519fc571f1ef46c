// CudaBackend: construction, capabilities, memory, fences, the scratch buffer, the error checks
// and its own argument checks. The ops live in one file per op family, as in cpu/: elementwise.cpp
// (casts, elementwise ops, reductions), gemm.cpp (cuBLASLt GEMMs, epilogues, fp8, bias_backward),
// norm.cpp, activation.cpp, rope.cpp, attention.cpp, embedding.cpp, loss.cpp, moe.cpp, adamw.cpp.

#include "backend/cuda/cuda_backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_args.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "kernels/check.cuh"

namespace trainctl::backend {

std::unique_ptr<Backend> make_cuda_backend(int device, bool deterministic) {
  cuda::CudaOptions options;
  options.device = device;
  options.deterministic = deterministic;
  return std::make_unique<cuda::CudaBackend>(options);
}

namespace cuda {

// ---- errors and argument checks --------------------------------------------------------------

void check_cuda(cudaError_t status, std::string_view op, std::string_view what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear the sticky last error so it is reported once
  throw kernels::CudaError(status, fmt::format("cuda backend {}: {} failed: {} ({}, code {})", op,
                                               what, cudaGetErrorString(status),
                                               cudaGetErrorName(status), static_cast<int>(status)));
}

void check_cublas(cublasStatus_t status, std::string_view op, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw std::runtime_error(fmt::format("cuda backend {}: {} failed: {} ({}, code {})", op, what,
                                       cublasLtGetStatusString(status),
                                       cublasLtGetStatusName(status), static_cast<int>(status)));
}

const ArgCheck kArgs{"cuda", Device::cuda};

void fail(std::string_view op, const std::string& message) {
  kArgs.fail(op, message);
}

kernels::Storage storage_type(std::string_view op, std::string_view name, DType dtype) {
  switch (dtype) {
    case DType::f32:
      return kernels::Storage::f32;
    case DType::bf16:
      return kernels::Storage::bf16;
    case DType::f16:
      return kernels::Storage::f16;
    default:
      fail(op, fmt::format(
                   "{} has dtype {}; the cuda backend computes on f32, bf16 and f16 (use "
                   "the cpu backend for f64; fp8 is a GemmArgs operand format, not a storage type)",
                   name, tensor::dtype_name(dtype)));
  }
}

void activate(const CudaBackend::Impl& impl, std::string_view op) {
  check_cuda(cudaSetDevice(impl.device), op, fmt::format("cudaSetDevice({})", impl.device));
}

// ---- the scratch buffer ------------------------------------------------------------------------

void* CudaBackend::Impl::scratch_for(size_t bytes) {
  if (bytes <= scratch_bytes && scratch != nullptr) return scratch;
  // Stream-ordered: the old buffer is freed after the kernels queued before this call and the new
  // one is ready for those queued after it, and neither call waits for the device. cudaFree and
  // cudaMalloc would synchronise the whole device, so a growth while an NCCL kernel on another
  // stream waits for a peer could hang both ranks (NCCL's documented pattern).
  if (scratch != nullptr) check_cuda(cudaFreeAsync(scratch, stream), "scratch", "cudaFreeAsync");
  scratch = nullptr;
  scratch_bytes = 0;
  const size_t grown = std::max<size_t>({bytes, size_t{1} << 20, bytes + bytes / 2});
  check_cuda(cudaMallocAsync(&scratch, grown, stream), "scratch",
             fmt::format("cudaMallocAsync of {} bytes of scratch", grown));
  scratch_bytes = grown;
  return scratch;
}

// ---- construction ------------------------------------------------------------------------------

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// Frees whatever part of the state exists; never throws (used by the destructor and by a
// constructor that failed half way).
void release(CudaBackend::Impl& impl) {
  destroy_gemm_plans(impl.gemm_plans);
  impl.gemm_plans = nullptr;
  if (impl.scratch) {
    (void)cudaFreeAsync(impl.scratch, impl.stream);
    (void)cudaStreamSynchronize(impl.stream);
  }
  if (impl.workspace) (void)cudaFree(impl.workspace);
  if (impl.lt) (void)cublasLtDestroy(impl.lt);
  if (impl.stream) (void)cudaStreamDestroy(impl.stream);
  impl.scratch = impl.workspace = nullptr;
  impl.lt = nullptr;
  impl.stream = nullptr;
  (void)cudaGetLastError();
}

// What the backend declares: every op family, f32, bf16 and f16 storage, fp8 where it pays.
Capabilities capabilities_of(int device) {
  Capabilities caps;
  caps.f64 = false;  // no f64 kernels: f64 runs on the cpu backend
  caps.f32 = caps.bf16 = caps.f16 = true;
  // fp8 GEMM operands: on sm_90+ (fp8 tensor cores). Older GPUs would compute the same values on
  // the emulated path (gemm.cpp) with no speed gain, so they do not offer it.
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    major = 0;
  }
  caps.fp8 = major >= 9;
  return caps;
}

}  // namespace

void CudaBackend::reserve_scratch(size_t bytes) {
  activate(*impl_, "reserve_scratch");
  (void)impl_->scratch_for(bytes);
}

CudaBackend::CudaBackend(const CudaOptions& options) : impl_(std::make_unique<Impl>()) {
  Impl& impl = *impl_;
  impl.device = options.device;
  int count = 0;
  const cudaError_t count_status = cudaGetDeviceCount(&count);
  if (count_status != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(fmt::format("cuda backend: no usable GPU (cudaGetDeviceCount: {})",
                                         kernels::describe_cuda_error(count_status)));
  }
  if (options.device < 0 || options.device >= count)
    throw std::runtime_error(
        fmt::format("cuda backend: GPU {} was asked for but {} GPU(s) are visible (check "
                    "CUDA_VISIBLE_DEVICES and the number of ranks per node)",
                    options.device, count));
  try {
    activate(impl, "init");
    cudaDeviceProp properties{};
    check_cuda(cudaGetDeviceProperties(&properties, impl.device), "init",
               "cudaGetDeviceProperties");
    impl.sm_count = properties.multiProcessorCount;
    check_cuda(cudaStreamCreateWithFlags(&impl.stream, cudaStreamNonBlocking), "init",
               "cudaStreamCreateWithFlags");
    check_cublas(cublasLtCreate(&impl.lt), "init", "cublasLtCreate");
    check_cuda(cudaMalloc(&impl.workspace, kWorkspaceBytes), "init",
               "cudaMalloc of the 32 MiB cuBLASLt workspace");
    impl.workspace_bytes = kWorkspaceBytes;
    impl.gemm_plans = create_gemm_plans();
  } catch (...) {
    release(impl);
    throw;
  }
  declare_capabilities(capabilities_of(impl.device));
}

CudaBackend::~CudaBackend() {
  if (!impl_) return;
  (void)cudaSetDevice(impl_->device);
  if (impl_->stream) (void)cudaStreamSynchronize(impl_->stream);
  release(*impl_);
}

// ---- memory ------------------------------------------------------------------------------------

Allocation CudaBackend::allocate(size_t bytes) {
  activate(*impl_, "allocate");
  void* data = nullptr;
  const size_t size = std::max<size_t>(bytes, 1);
  check_cuda(cudaMalloc(&data, size), "allocate",
             fmt::format("cudaMalloc of {} bytes on GPU {}", size, impl_->device));
  try {
    check_cuda(cudaMemsetAsync(data, 0, size, impl_->stream), "allocate", "cudaMemsetAsync");
    check_cuda(cudaStreamSynchronize(impl_->stream), "allocate", "cudaStreamSynchronize");
  } catch (...) {
    (void)cudaFree(data);
    throw;
  }
  return Allocation(this, data, bytes);
}

void CudaBackend::deallocate(void* data) {
  // Called from Allocation's destructor: report, never throw.
  (void)cudaSetDevice(impl_->device);
  const cudaError_t status = cudaFree(data);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "cuda backend deallocate: cudaFree failed: %s\n",
                 kernels::describe_cuda_error(status).c_str());
  }
}

void CudaBackend::do_copy_to_host(void* dst, const Tensor& src) {
  activate(*impl_, "copy_to_host");
  if (src.bytes() == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, impl_->stream),
             "copy_to_host", "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(impl_->stream), "copy_to_host", "cudaStreamSynchronize");
}

void CudaBackend::do_copy_from_host(const Tensor& dst, const void* src) {
  activate(*impl_, "copy_from_host");
  if (dst.bytes() == 0) return;
  check_cuda(cudaMemcpyAsync(dst.data, src, dst.bytes(), cudaMemcpyHostToDevice, impl_->stream),
             "copy_from_host", "cudaMemcpyAsync");
  // The host buffer may be freed as soon as we return.
  check_cuda(cudaStreamSynchronize(impl_->stream), "copy_from_host", "cudaStreamSynchronize");
}

// ---- hand-off to communication ----------------------------------------------------------------

namespace {

// Owns one event recorded on the compute stream. wait() and the destructor may run on another
// thread than fence(): both select the backend's GPU first, so a worker thread that never touched
// CUDA does not create a context on GPU 0 (the runtime's default) just to wait.
class CudaFence final : public Backend::Fence {
 public:
  CudaFence(int device, cudaEvent_t event) : device_(device), event_(event) {}
  ~CudaFence() override {
    (void)cudaSetDevice(device_);
    if (cudaEventDestroy(event_) != cudaSuccess) (void)cudaGetLastError();
  }
  CudaFence(const CudaFence&) = delete;
  CudaFence& operator=(const CudaFence&) = delete;

  void wait() override {
    check_cuda(cudaSetDevice(device_), "fence", fmt::format("cudaSetDevice({})", device_));
    check_cuda(cudaEventSynchronize(event_), "fence",
               "cudaEventSynchronize (waiting for the ops issued before the fence)");
  }

 private:
  int device_;
  cudaEvent_t event_;
};

}  // namespace

std::unique_ptr<Backend::Fence> CudaBackend::fence() {
  activate(*impl_, "fence");
  cudaEvent_t event = nullptr;
  check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "fence",
             "cudaEventCreateWithFlags");
  // Owned before it is recorded, so a failed record still destroys it.
  std::unique_ptr<CudaFence> fence;
  try {
    fence = std::make_unique<CudaFence>(impl_->device, event);
  } catch (...) {
    (void)cudaEventDestroy(event);
    throw;
  }
  check_cuda(cudaEventRecord(event, impl_->stream), "fence",
             "cudaEventRecord on the compute stream");
  return fence;
}

void* CudaBackend::stream() const {
  return impl_->stream;
}

}  // namespace cuda
}  // namespace trainctl::backend
