// CudaBackend: construction, capabilities, memory, the error checks, argument checks, and the
// GEMMs (cuBLASLt) with bias_backward. Elementwise ops, reductions, casts and AdamW are in
// cuda_ops.cpp; the layer ops in cuda_layers.cpp.
//
// GEMM. cuBLASLt is column-major and our matrices are row-major, so each product is computed
// transposed: C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m). A row-major [r, c] buffer read
// column-major is its transpose, so cuBLASLt's "A" is our B buffer (transposed when trans_b)
// and its "B" our A buffer (transposed when trans_a), and C needs no change. The bias epilogue
// adds a vector along D's rows, which are our columns: exactly "bias [n] on every row".
// Every product computes in fp32 (CUBLAS_COMPUTE_32F: no TF32 for fp32 inputs; fp32
// accumulation for bf16/f16). One plan (descriptors plus the algorithm the heuristic picked) is
// kept per shape, dtypes, transposes and pointer alignments, so a shape always runs the same
// kernel: the cuBLAS guarantee of bit-identical repeats on one GPU then holds across steps.
#include "backend/cuda/cuda_backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <compare>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_args.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "kernels/check.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/reduce.cuh"

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

const ArgCheck kArgs{"cuda backend", Device::cuda,
                     "is in host memory; the cuda backend takes tensors from its own allocate()"};

void fail(std::string_view op, const std::string& message) {
  kArgs.fail(op, message);
}

void expect_gpu(std::string_view op, std::string_view name, const Tensor& t) {
  kArgs.present(op, name, t);
}

void expect_numel(std::string_view op, std::string_view name, const Tensor& t, int64_t expected) {
  kArgs.numel(op, name, t, expected);
}

void expect_dtype(std::string_view op, std::string_view name, const Tensor& t, DType expected) {
  kArgs.dtype(op, name, t, expected);
}

int64_t rows_of(std::string_view op, std::string_view name, const Tensor& t, int64_t width) {
  return kArgs.rows(op, name, t, width);
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
      fail(op, fmt::format("{} has dtype {}; the cuda backend computes on f32, bf16 and f16 (use "
                           "the cpu backend for f64; no op takes fp8 yet)",
                           name, tensor::dtype_name(dtype)));
  }
}

// ---- GEMM plans ---------------------------------------------------------------------------------

namespace {

struct GemmKey {
  DType ab = DType::f32;
  DType c = DType::f32;
  bool bias_epilogue = false;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  uint32_t align_a = 0, align_b = 0, align_c = 0;
  auto operator<=>(const GemmKey&) const = default;
};

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr;  // cuBLASLt's A: our B buffer
  cublasLtMatrixLayout_t layout_b = nullptr;  // cuBLASLt's B: our A buffer
  cublasLtMatrixLayout_t layout_c = nullptr;  // C and D
  cublasLtMatmulAlgo_t algo{};
  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan() {
    if (layout_c) (void)cublasLtMatrixLayoutDestroy(layout_c);
    if (layout_b) (void)cublasLtMatrixLayoutDestroy(layout_b);
    if (layout_a) (void)cublasLtMatrixLayoutDestroy(layout_a);
    if (desc) (void)cublasLtMatmulDescDestroy(desc);
  }
};

cudaDataType_t cuda_data_type(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// The largest power of two (up to 256) dividing the address of every batch's matrix.
uint32_t alignment_of(const void* base, int64_t batch, int64_t stride_elements, size_t element) {
  auto bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(base));
  if (batch > 1) bits |= static_cast<uint64_t>(stride_elements) * element;
  uint32_t alignment = 256;
  while (alignment > 1 && bits % alignment != 0)
    alignment /= 2;
  return alignment;
}

template <class T>
void set_layout(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attribute,
                const T& value, std::string_view what) {
  check_cublas(cublasLtMatrixLayoutSetAttribute(layout, attribute, &value, sizeof(value)), "gemm",
               what);
}

template <class T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value,
              std::string_view what) {
  check_cublas(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)), "gemm",
               what);
}

cublasLtMatrixLayout_t make_layout(DType dtype, int64_t rows, int64_t cols, int64_t ld,
                                   int64_t batch, int64_t stride, std::string_view what) {
  cublasLtMatrixLayout_t layout = nullptr;
  check_cublas(
      cublasLtMatrixLayoutCreate(&layout, cuda_data_type(dtype), static_cast<uint64_t>(rows),
                                 static_cast<uint64_t>(cols), ld),
      "gemm", what);
  if (batch > 1) {
    try {
      set_layout(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<int32_t>(batch), what);
      set_layout(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride, what);
    } catch (...) {
      (void)cublasLtMatrixLayoutDestroy(layout);
      throw;
    }
  }
  return layout;
}

std::string describe(const GemmKey& key) {
  return fmt::format(
      "m={} n={} k={} batch={} trans_a={} trans_b={} a/b {} c {}{} (pointer alignment a {} b {} c "
      "{} bytes)",
      key.m, key.n, key.k, key.batch, key.trans_a, key.trans_b, tensor::dtype_name(key.ab),
      tensor::dtype_name(key.c), key.bias_epilogue ? " with bias epilogue" : "", key.align_a,
      key.align_b, key.align_c);
}

std::unique_ptr<GemmPlan> make_plan(cublasLtHandle_t lt, const GemmKey& key,
                                    size_t workspace_bytes) {
  auto plan = std::make_unique<GemmPlan>();
  check_cublas(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "gemm",
               "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a, "setting TRANSA");
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b, "setting TRANSB");
  if (key.bias_epilogue) {
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS,
             "setting the bias epilogue");
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
             static_cast<int32_t>(cuda_data_type(key.c)), "setting the bias dtype");
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, int64_t{0},
             "setting the bias batch stride");
  }
  // Stored (pre-transpose) shapes, column-major: our row-major [r, c] buffer is [c, r] here.
  const int64_t b_rows = key.trans_b ? key.k : key.n;
  const int64_t b_cols = key.trans_b ? key.n : key.k;
  const int64_t a_rows = key.trans_a ? key.m : key.k;
  const int64_t a_cols = key.trans_a ? key.k : key.m;
  plan->layout_a =
      make_layout(key.ab, b_rows, b_cols, b_rows, key.batch, key.stride_b, "layout of b");
  plan->layout_b =
      make_layout(key.ab, a_rows, a_cols, a_rows, key.batch, key.stride_a, "layout of a");
  plan->layout_c = make_layout(key.c, key.n, key.m, key.n, key.batch, key.stride_c, "layout of c");

  cublasLtMatmulPreference_t preference = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&preference), "gemm",
               "cublasLtMatmulPreferenceCreate");
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  const auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attribute, auto value) {
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value));
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace_bytes));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(lt, plan->desc, plan->layout_a, plan->layout_b,
                                            plan->layout_c, plan->layout_c, preference, 1, &result,
                                            &returned);
  (void)cublasLtMatmulPreferenceDestroy(preference);
  check_cublas(status, "gemm", "choosing an algorithm for " + describe(key));
  if (returned < 1)
    throw std::runtime_error("cuda backend gemm: cuBLASLt has no algorithm for " + describe(key) +
                             "; align the tensors to 16 bytes or use other dtypes");
  plan->algo = result.algo;
  return plan;
}

}  // namespace

struct CudaBackend::Impl::GemmPlans {
  std::map<GemmKey, std::unique_ptr<GemmPlan>> plans;
};

// ---- the scratch buffer ------------------------------------------------------------------------

void* CudaBackend::Impl::scratch_for(size_t bytes) {
  if (bytes <= scratch_bytes && scratch != nullptr) return scratch;
  // Kernels still queued may be using the old buffer.
  check_cuda(cudaStreamSynchronize(stream), "scratch", "cudaStreamSynchronize");
  if (scratch != nullptr) check_cuda(cudaFree(scratch), "scratch", "cudaFree");
  scratch = nullptr;
  scratch_bytes = 0;
  const size_t grown = std::max<size_t>({bytes, size_t{1} << 20, bytes + bytes / 2});
  check_cuda(cudaMalloc(&scratch, grown), "scratch",
             fmt::format("cudaMalloc of {} bytes of scratch", grown));
  scratch_bytes = grown;
  return scratch;
}

// ---- construction ------------------------------------------------------------------------------

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// Frees whatever part of the state exists; never throws (used by the destructor and by a
// constructor that failed half way).
void release(CudaBackend::Impl& impl) {
  delete impl.gemm_plans;
  impl.gemm_plans = nullptr;
  if (impl.scratch) (void)cudaFree(impl.scratch);
  if (impl.workspace) (void)cudaFree(impl.workspace);
  if (impl.lt) (void)cublasLtDestroy(impl.lt);
  if (impl.stream) (void)cudaStreamDestroy(impl.stream);
  impl.scratch = impl.workspace = nullptr;
  impl.lt = nullptr;
  impl.stream = nullptr;
  (void)cudaGetLastError();
}

// The calling thread's current device is per thread: an op called from another thread than the
// one that built the backend (a checkpoint writer, say) must switch to our GPU first.
void activate(const CudaBackend::Impl& impl, std::string_view op) {
  check_cuda(cudaSetDevice(impl.device), op, fmt::format("cudaSetDevice({})", impl.device));
}

}  // namespace

CudaBackend::CudaBackend(const CudaOptions& options) : impl_(std::make_unique<Impl>()) {
  Impl& impl = *impl_;
  impl.device = options.device;
  impl.deterministic = options.deterministic;
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
    impl.gemm_plans = new Impl::GemmPlans();
  } catch (...) {
    release(impl);
    throw;
  }
}

CudaBackend::~CudaBackend() {
  if (!impl_) return;
  (void)cudaSetDevice(impl_->device);
  if (impl_->stream) (void)cudaStreamSynchronize(impl_->stream);
  release(*impl_);
}

Capabilities CudaBackend::capabilities() const {
  Capabilities caps;
  caps.f64 = false;  // no f64 kernels: f64 runs on the cpu backend
  caps.f32 = caps.bf16 = caps.f16 = true;
  // Hopper has fp8 tensor cores; no op takes fp8 storage yet (fp8 GEMMs come with the fp8 path),
  // so a recipe cannot select it: this only says what the hardware offers.
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, impl_->device) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    major = 0;
  }
  caps.fp8 = major >= 9;
  return caps;
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

void CudaBackend::copy_to_host(void* dst, const Tensor& src) {
  expect_gpu("copy_to_host", "src", src);
  activate(*impl_, "copy_to_host");
  if (src.bytes() == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, impl_->stream),
             "copy_to_host", "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(impl_->stream), "copy_to_host", "cudaStreamSynchronize");
}

void CudaBackend::copy_from_host(const Tensor& dst, const void* src) {
  expect_gpu("copy_from_host", "dst", dst);
  activate(*impl_, "copy_from_host");
  if (dst.bytes() == 0) return;
  check_cuda(cudaMemcpyAsync(dst.data, src, dst.bytes(), cudaMemcpyHostToDevice, impl_->stream),
             "copy_from_host", "cudaMemcpyAsync");
  // The host buffer may be freed as soon as we return.
  check_cuda(cudaStreamSynchronize(impl_->stream), "copy_from_host", "cudaStreamSynchronize");
}

// ---- GEMM --------------------------------------------------------------------------------------

namespace {

// The contract's checks, then what cuBLASLt adds: a dtype it computes on, 32-bit sizes.
void check_gemm(const GemmArgs& g) {
  constexpr std::string_view op = "gemm";
  kArgs.gemm(g);
  (void)storage_type(op, "a", g.a.dtype);
  if (g.m > INT32_MAX || g.n > INT32_MAX || g.k > INT32_MAX || g.batch > INT32_MAX)
    fail(op, fmt::format("m={}, n={}, k={}, batch={}: each must fit in 32 bits", g.m, g.n, g.k,
                         g.batch));
}

}  // namespace

void CudaBackend::gemm(const GemmArgs& g) {
  check_gemm(g);
  activate(*impl_, "gemm");
  const size_t ab_size = tensor::dtype_size(g.a.dtype);
  const size_t c_size = tensor::dtype_size(g.c.dtype);
  GemmKey key;
  key.ab = g.a.dtype;
  key.c = g.c.dtype;
  // The epilogue adds the bias in fp32 before C is rounded, like the CPU backend. It takes a bias
  // of D's dtype; another bias dtype (16-bit bias, fp32 C) is added by a kernel afterwards, in
  // fp32 on the fp32 C: again the CPU backend's arithmetic.
  key.bias_epilogue = !g.bias.empty() && g.bias.dtype == g.c.dtype &&
                      reinterpret_cast<uintptr_t>(g.bias.data) % 16 == 0;
  key.trans_a = g.trans_a;
  key.trans_b = g.trans_b;
  key.m = g.m;
  key.n = g.n;
  key.k = g.k;
  key.batch = g.batch;
  if (g.batch > 1) {
    key.stride_a = g.stride_a;
    key.stride_b = g.stride_b;
    key.stride_c = g.stride_c;
  }
  key.align_a = alignment_of(g.a.data, g.batch, g.stride_a, ab_size);
  key.align_b = alignment_of(g.b.data, g.batch, g.stride_b, ab_size);
  key.align_c = alignment_of(g.c.data, g.batch, g.stride_c, c_size);

  auto& plans = impl_->gemm_plans->plans;
  auto found = plans.find(key);
  if (found == plans.end())
    found = plans.emplace(key, make_plan(impl_->lt, key, impl_->workspace_bytes)).first;
  GemmPlan& plan = *found->second;
  if (key.bias_epilogue) {
    const void* bias = g.bias.data;
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "setting the bias pointer");
  }
  const float alpha = static_cast<float>(g.alpha);
  const float beta = static_cast<float>(g.beta);
  check_cublas(
      cublasLtMatmul(impl_->lt, plan.desc, &alpha, g.b.data, plan.layout_a, g.a.data, plan.layout_b,
                     &beta, g.c.data, plan.layout_c, g.c.data, plan.layout_c, &plan.algo,
                     impl_->workspace, impl_->workspace_bytes, impl_->stream),
      "gemm", "cublasLtMatmul for " + describe(key));
  if (!g.bias.empty() && !key.bias_epilogue) {
    check_cuda(
        kernels::launch_add_bias_rows(g.c.data, storage_type("gemm", "c", g.c.dtype), g.bias.data,
                                      storage_type("gemm", "bias", g.bias.dtype), g.batch, g.m, g.n,
                                      g.batch > 1 ? g.stride_c : g.m * g.n, impl_->stream),
        "gemm", "the bias kernel");
  }
}

void CudaBackend::bias_backward(const Tensor& dbias, const Tensor& dout) {
  constexpr std::string_view op = "bias_backward";
  expect_gpu(op, "dout", dout);
  const kernels::Storage type = storage_type(op, "dout", dout.dtype);
  expect_dtype(op, "dbias", dbias, grad_dtype(dout.dtype));
  const int64_t C = dbias.numel();
  if (C <= 0 || dout.numel() % C != 0)
    fail(op, fmt::format("dout has shape {}, which is not a whole number of rows of {}",
                         dout.shape.to_string(), C));
  const int64_t N = dout.numel() / C;
  activate(*impl_, op);
  const size_t bytes = kernels::column_sums_scratch_bytes(N, C);
  void* scratch = impl_->scratch_for(bytes);
  check_cuda(kernels::launch_column_sums_accumulate(dbias.as<float>(), dout.data, type, N, C,
                                                    scratch, bytes, impl_->stream),
             op, "the column-sum kernels");
}

}  // namespace cuda
}  // namespace trainctl::backend
