// CudaBackend::gemm and bias_backward: cuBLASLt plans, the bias and GELU epilogues, fp8 operands.
//
// Row-major through column-major. cuBLASLt is column-major and our matrices are row-major, so
// each product is computed transposed: C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m). A
// row-major [r, c] buffer read column-major is its transpose, so cuBLASLt's "A" is our B buffer
// (transposed when trans_b) and its "B" our A buffer (transposed when trans_a), and C needs no
// change. The bias epilogue adds a vector along D's rows, which are our columns: exactly "bias
// [n] on every row"; the GELU aux matrix is D-shaped, so pre_gelu [m, n] has ld n.
//
// Every product computes in fp32 (CUBLAS_COMPUTE_32F: no TF32 for fp32 inputs; fp32 accumulation
// for bf16/f16). One plan (descriptors plus the algorithm the heuristic picked) is kept per
// shape, dtypes, transposes, epilogue and pointer alignments, so a shape always runs the same
// kernel: the cuBLAS guarantee of bit-identical repeats on one GPU then holds across steps.
//
// fp8 operands (backend.hpp). Each marked operand gets its scale p on the device
// (kernels/fp8.cu: amax, then fp8_scale_for; no host synchronisation), or from the amax the caller
// gives (GemmArgs amax_a / amax_b: one tiny kernel, the operand is not scanned). Hopper's fp8
// kernels need the "TN" form (cuBLASLt's A transposed, B not) with k-contiguous operands, so the
// quantized copies are written as our A [m, k] and our B [n, k] (transposed while quantizing when
// stored the other way), and cuBLASLt scales the product back with A/B_SCALE_POINTER = 1/p (device
// floats). Fast accumulation is off (periodic promotion to fp32: the accurate mode). Where that
// path does not apply (one operand unmarked, e5m2 x e5m2, m, n or k not a multiple of 16, or
// cuBLASLt refuses the combination) the same values are computed on the input dtype's GEMM:
// each marked operand is replaced by round_format(x p) / p, exact in f32 and bf16 (p is a power
// of two), so the two paths differ only in summation order. gemm_paths() counts which ran.
#include <fmt/format.h>

#include <algorithm>
#include <compare>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/cuda_args.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "kernels/activation.cuh"
#include "kernels/check.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/fp8.cuh"
#include "kernels/reduce.cuh"

namespace trainctl::backend::cuda {

namespace {

enum class LtEpilogue : uint8_t { none, bias, gelu_aux, gelu_aux_bias };

struct GemmKey {
  DType a = DType::f32;  // our A buffer (cuBLASLt's B)
  DType b = DType::f32;  // our B buffer (cuBLASLt's A)
  DType c = DType::f32;
  LtEpilogue epilogue = LtEpilogue::none;
  bool scaled = false;  // fp8: A/B scale pointers
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  // Pointer alignments in bytes: the heuristic reads them, so a plan is only reused for pointers
  // aligned at least as well. align_bias is 0 without a bias epilogue.
  uint32_t align_a = 0, align_b = 0, align_c = 0, align_aux = 0, align_bias = 0;
  auto operator<=>(const GemmKey&) const = default;
};

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr;  // cuBLASLt's A: our B buffer
  cublasLtMatrixLayout_t layout_b = nullptr;  // cuBLASLt's B: our A buffer
  cublasLtMatrixLayout_t layout_c = nullptr;  // C and D
  // The heuristic's candidates, best first. A candidate whose launch fails is dropped and the
  // next one runs (run_lt), so a plan always runs the same algorithm once one has worked.
  std::vector<cublasLtMatmulAlgo_t> algos;
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

// One cuBLASLt call, fully described (the pointers change from call to call, the key does not).
struct LtCall {
  GemmKey key;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  const void* bias = nullptr;      // epilogues with bias
  void* aux = nullptr;             // GELU epilogues: pre_gelu
  const float* scale_a = nullptr;  // scaled: 1/p of our A, device
  const float* scale_b = nullptr;  // scaled: 1/p of our B, device
  float alpha = 1, beta = 0;
};

cudaDataType_t cuda_data_type(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    case DType::e4m3:
      return CUDA_R_8F_E4M3;
    case DType::e5m2:
      return CUDA_R_8F_E5M2;
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

std::string_view epilogue_name(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::bias:
      return " with bias epilogue";
    case LtEpilogue::gelu_aux:
      return " with GELU_AUX epilogue";
    case LtEpilogue::gelu_aux_bias:
      return " with GELU_AUX_BIAS epilogue";
    default:
      return "";
  }
}

std::string describe(const GemmKey& key) {
  return fmt::format(
      "m={} n={} k={} batch={} trans_a={} trans_b={} a {} b {} c {}{}{} (pointer alignment a {} b "
      "{} c {} bytes)",
      key.m, key.n, key.k, key.batch, key.trans_a, key.trans_b, tensor::dtype_name(key.a),
      tensor::dtype_name(key.b), tensor::dtype_name(key.c), epilogue_name(key.epilogue),
      key.scaled ? " with fp8 scales" : "", key.align_a, key.align_b, key.align_c);
}

void set_epilogue(cublasLtMatmulDesc_t desc, const GemmKey& key) {
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  switch (key.epilogue) {
    case LtEpilogue::none:
      return;
    case LtEpilogue::bias:
      epilogue = CUBLASLT_EPILOGUE_BIAS;
      break;
    case LtEpilogue::gelu_aux:
      epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
      break;
    case LtEpilogue::gelu_aux_bias:
      epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
      break;
  }
  set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, "setting the epilogue");
  if (key.epilogue == LtEpilogue::bias || key.epilogue == LtEpilogue::gelu_aux_bias) {
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cuda_data_type(key.c)),
             "setting the bias dtype");
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, int64_t{0},
             "setting the bias batch stride");
  }
  if (key.epilogue == LtEpilogue::gelu_aux || key.epilogue == LtEpilogue::gelu_aux_bias) {
    // D is n x m column-major with ld n; the aux matrix has D's shape (ld: a multiple of 8).
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, key.n, "setting the GELU aux ld");
  }
}

// The per-call pointers. Set before the heuristic too: it reads their alignment.
void set_pointers(cublasLtMatmulDesc_t desc, const LtCall& call) {
  const GemmKey& key = call.key;
  if (key.epilogue == LtEpilogue::bias || key.epilogue == LtEpilogue::gelu_aux_bias)
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, call.bias, "setting the bias pointer");
  if (key.epilogue == LtEpilogue::gelu_aux || key.epilogue == LtEpilogue::gelu_aux_bias)
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, call.aux,
             "setting the GELU aux pointer");
  if (key.scaled) {
    // cuBLASLt's A is our B and the other way round.
    set_desc(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(call.scale_b),
             "setting the A scale pointer");
    set_desc(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(call.scale_a),
             "setting the B scale pointer");
  }
}

// The plan for call.key. Returns null when `may_refuse` and cuBLASLt has no algorithm for it
// (the caller then computes the same values another way); otherwise that throws.
std::unique_ptr<GemmPlan> make_plan(cublasLtHandle_t lt, const LtCall& call, size_t workspace_bytes,
                                    bool may_refuse) {
  const GemmKey& key = call.key;
  auto plan = std::make_unique<GemmPlan>();
  check_cublas(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "gemm",
               "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a, "setting TRANSA");
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b, "setting TRANSB");
  if (key.scaled)
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{0},
             "turning fast accumulation off");
  set_epilogue(plan->desc, key);
  set_pointers(plan->desc, call);
  // Stored (pre-transpose) shapes, column-major: our row-major [r, c] buffer is [c, r] here.
  const int64_t b_rows = key.trans_b ? key.k : key.n;
  const int64_t b_cols = key.trans_b ? key.n : key.k;
  const int64_t a_rows = key.trans_a ? key.m : key.k;
  const int64_t a_cols = key.trans_a ? key.k : key.m;
  plan->layout_a =
      make_layout(key.b, b_rows, b_cols, b_rows, key.batch, key.stride_b, "layout of b");
  plan->layout_b =
      make_layout(key.a, a_rows, a_cols, a_rows, key.batch, key.stride_a, "layout of a");
  plan->layout_c = make_layout(key.c, key.n, key.m, key.n, key.batch, key.stride_c, "layout of c");

  cublasLtMatmulPreference_t preference = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&preference), "gemm",
               "cublasLtMatmulPreferenceCreate");
  // Several candidates: a launch that fails on the first (it happens with new drivers and odd
  // alignments) retries the next instead of ending the run.
  constexpr int kCandidates = 4;
  cublasLtMatmulHeuristicResult_t results[kCandidates]{};
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
                                            plan->layout_c, plan->layout_c, preference, kCandidates,
                                            results, &returned);
  (void)cublasLtMatmulPreferenceDestroy(preference);
  if (may_refuse && (status != CUBLAS_STATUS_SUCCESS || returned < 1)) {
    std::fprintf(stderr, "cuda backend gemm: cuBLASLt refused %s (%s); computing it another way\n",
                 describe(key).c_str(),
                 status != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusName(status) : "no algorithm");
    return nullptr;
  }
  check_cublas(status, "gemm", "choosing an algorithm for " + describe(key));
  if (returned < 1)
    throw std::runtime_error("cuda backend gemm: cuBLASLt has no algorithm for " + describe(key) +
                             "; align the tensors to 16 bytes or use other dtypes");
  for (int i = 0; i < returned; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) plan->algos.push_back(results[i].algo);
  if (plan->algos.empty())
    throw std::runtime_error("cuda backend gemm: cuBLASLt's candidates for " + describe(key) +
                             " all reported a failed state");
  return plan;
}

// The key of a plain (or GELU) GEMM straight from the arguments.
GemmKey key_of(const GemmArgs& g) {
  const size_t ab_size = tensor::dtype_size(g.a.dtype);
  const size_t c_size = tensor::dtype_size(g.c.dtype);
  GemmKey key;
  key.a = g.a.dtype;
  key.b = g.b.dtype;
  key.c = g.c.dtype;
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
  return key;
}

// The epilogue adds the bias in fp32 before C is rounded, like the CPU backend. It takes a bias
// of D's dtype; another bias dtype (16-bit bias, fp32 C) is added by a kernel afterwards, in fp32
// on the fp32 C: again the CPU backend's arithmetic.
bool bias_fits_epilogue(const GemmArgs& g) {
  return !g.bias.empty() && g.bias.dtype == g.c.dtype &&
         reinterpret_cast<uintptr_t>(g.bias.data) % 16 == 0;
}

kernels::Fp8Format fp8_format(DType format) {
  return format == DType::e4m3 ? kernels::Fp8Format::e4m3 : kernels::Fp8Format::e5m2;
}

size_t round_up_256(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

struct CudaBackend::Impl::GemmPlans {
  // A null plan: cuBLASLt refused that key (fp8 or GELU); the caller computes it another way.
  std::map<GemmKey, std::unique_ptr<GemmPlan>> plans;
  GemmPaths paths;
};

CudaBackend::Impl::GemmPlans* create_gemm_plans() {
  return new CudaBackend::Impl::GemmPlans();
}

void destroy_gemm_plans(CudaBackend::Impl::GemmPlans* plans) {
  delete plans;
}

namespace {

// Runs the call; false when cuBLASLt refused its key and `may_refuse` (nothing was written).
bool run_lt(CudaBackend::Impl& impl, const LtCall& call, bool may_refuse) {
  auto& plans = impl.gemm_plans->plans;
  auto found = plans.find(call.key);
  if (found == plans.end())
    found =
        plans.emplace(call.key, make_plan(impl.lt, call, impl.workspace_bytes, may_refuse)).first;
  GemmPlan* plan = found->second.get();
  if (plan == nullptr) return false;
  set_pointers(plan->desc, call);
  while (true) {
    const cublasStatus_t status =
        cublasLtMatmul(impl.lt, plan->desc, &call.alpha, call.b, plan->layout_a, call.a,
                       plan->layout_b, &call.beta, call.c, plan->layout_c, call.c, plan->layout_c,
                       &plan->algos.front(), impl.workspace, impl.workspace_bytes, impl.stream);
    // NOT_SUPPORTED and EXECUTION_FAILED mean nothing was launched (C is untouched, so beta
    // accumulation stays right): the next candidate may work. Anything else is our error.
    const bool retry =
        (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_EXECUTION_FAILED) &&
        plan->algos.size() > 1;
    if (!retry) {
      check_cublas(status, "gemm", "cublasLtMatmul for " + describe(call.key));
      return true;
    }
    std::fprintf(stderr,
                 "cuda backend gemm: cuBLASLt's algorithm for %s failed to launch (%s); trying its "
                 "next candidate\n",
                 describe(call.key).c_str(), cublasLtGetStatusName(status));
    plan->algos.erase(plan->algos.begin());
  }
}

void add_bias_after(CudaBackend::Impl& impl, const GemmArgs& g) {
  check_cuda(
      kernels::launch_add_bias_rows(g.c.data, storage_type("gemm", "c", g.c.dtype), g.bias.data,
                                    storage_type("gemm", "bias", g.bias.dtype), g.batch, g.m, g.n,
                                    g.batch > 1 ? g.stride_c : g.m * g.n, impl.stream),
      "gemm", "the bias kernel");
}

// No fp8, no epilogue other than the bias.
void plain_gemm(CudaBackend::Impl& impl, const GemmArgs& g) {
  LtCall call;
  call.key = key_of(g);
  bool bias_epilogue = bias_fits_epilogue(g);
  if (bias_epilogue) {
    call.key.epilogue = LtEpilogue::bias;
    call.key.align_bias = alignment_of(g.bias.data, 1, 0, tensor::dtype_size(g.bias.dtype));
    call.bias = g.bias.data;
  }
  call.a = g.a.data;
  call.b = g.b.data;
  call.c = g.c.data;
  call.alpha = static_cast<float>(g.alpha);
  call.beta = static_cast<float>(g.beta);
  // A refused bias epilogue is not an error: the same GEMM without it, then the bias kernel.
  if (bias_epilogue && !run_lt(impl, call, true)) {
    bias_epilogue = false;
    call.key.epilogue = LtEpilogue::none;
    call.key.align_bias = 0;
    call.bias = nullptr;
  }
  if (!bias_epilogue) (void)run_lt(impl, call, false);
  if (!g.bias.empty() && !bias_epilogue) add_bias_after(impl, g);
}

}  // namespace

// ---- checks and dispatch --------------------------------------------------------------------

namespace {

// What cuBLASLt adds to the contract's checks (Backend's wrapper): a dtype it computes on, 32-bit
// sizes.
void check_gemm(const GemmArgs& g) {
  constexpr std::string_view op = "gemm";
  (void)storage_type(op, "a", g.a.dtype);
  if (g.m > INT32_MAX || g.n > INT32_MAX || g.k > INT32_MAX || g.batch > INT32_MAX)
    fail(op, fmt::format("m={}, n={}, k={}, batch={}: each must fit in 32 bits", g.m, g.n, g.k,
                         g.batch));
  if ((g.fp8_a || g.fp8_b) && g.a.dtype == DType::f16)
    fail(op,
         "fp8 operands on the cuda backend need f32 or bf16 inputs (f16 cannot hold every "
         "dequantized value exactly); cast the operands to bf16");
}

}  // namespace

void CudaBackend::do_gemm(const GemmArgs& g) {
  check_gemm(g);
  activate(*impl_, "gemm");
  if (g.fp8_a || g.fp8_b) {
    gemm_fp8(g);
  } else if (g.epilogue == Epilogue::gelu) {
    gemm_gelu(g);
  } else {
    plain_gemm(*impl_, g);
  }
}

CudaBackend::GemmPaths CudaBackend::gemm_paths() const {
  return impl_->gemm_plans->paths;
}

// ---- GELU epilogue ----------------------------------------------------------------------------

void CudaBackend::gemm_gelu(const GemmArgs& g) {
  Impl& impl = *impl_;
  const size_t c_size = tensor::dtype_size(g.c.dtype);
  // cuBLASLt's rules for the aux matrix: ld (= n) a multiple of 8; a 16-byte aligned pointer
  // (what every other operand of its fast kernels needs). The bias must fit the epilogue.
  const bool fusable = g.n % 8 == 0 && reinterpret_cast<uintptr_t>(g.pre_gelu.data) % 16 == 0 &&
                       (g.bias.empty() || bias_fits_epilogue(g));
  if (fusable) {
    LtCall call;
    call.key = key_of(g);
    call.key.epilogue = g.bias.empty() ? LtEpilogue::gelu_aux : LtEpilogue::gelu_aux_bias;
    call.key.align_aux = alignment_of(g.pre_gelu.data, 1, 0, c_size);
    call.a = g.a.data;
    call.b = g.b.data;
    call.c = g.c.data;
    call.bias = g.bias.empty() ? nullptr : g.bias.data;
    if (call.bias)
      call.key.align_bias = alignment_of(g.bias.data, 1, 0, tensor::dtype_size(g.bias.dtype));
    call.aux = g.pre_gelu.data;
    call.alpha = static_cast<float>(g.alpha);
    call.beta = static_cast<float>(g.beta);
    if (run_lt(impl, call, true)) {
      ++impl.gemm_plans->paths.gelu_fused;
      return;
    }
  }
  // The unfused form, which is also the CPU backend's definition: the GEMM (bias included) into
  // pre_gelu, then gelu_forward.
  GemmArgs plain = g;
  plain.c = g.pre_gelu;
  plain.epilogue = Epilogue::none;
  plain.pre_gelu = {};
  plain_gemm(impl, plain);
  gelu_forward(g.c, g.pre_gelu);
  ++impl.gemm_plans->paths.gelu_unfused;
}

// ---- fp8 operands -----------------------------------------------------------------------------

void CudaBackend::gemm_fp8(const GemmArgs& g) {
  Impl& impl = *impl_;
  const kernels::Storage in_type = storage_type("gemm", "a", g.a.dtype);
  const bool tensor_cores = g.fp8_a && g.fp8_b &&
                            !(*g.fp8_a == DType::e5m2 && *g.fp8_b == DType::e5m2) &&
                            g.m % 16 == 0 && g.n % 16 == 0 && g.k % 16 == 0 &&
                            (g.c.dtype == DType::bf16 || g.c.dtype == DType::f32);
  const int64_t a_count = g.m * g.k, b_count = g.k * g.n;
  const size_t element = tensor::dtype_size(g.a.dtype);
  // One scratch block: [scales a: p, 1/p | scales b: p, 1/p] [amax partials a] [amax partials b]
  // [copy of a] [copy of b]. A copy is fp8 bytes (tensor cores) or the input dtype (fallback);
  // both layouts are sized for the fallback, the larger. An operand with a given amax needs no
  // partials.
  const size_t amax_a = g.amax_a.empty() ? kernels::fp8_amax_scratch_bytes(a_count) : 0;
  const size_t amax_b = g.amax_b.empty() ? kernels::fp8_amax_scratch_bytes(b_count) : 0;
  const size_t copy_a = round_up_256(static_cast<size_t>(a_count) * element);
  const size_t copy_b = round_up_256(static_cast<size_t>(b_count) * element);
  auto* base = static_cast<char*>(impl.scratch_for(256 + amax_a + amax_b + copy_a + copy_b));
  auto* scales = reinterpret_cast<float*>(base);
  float* scale_a = scales;      // p, 1/p of a
  float* scale_b = scales + 2;  // p, 1/p of b
  char* partials_a = base + 256;
  char* partials_b = partials_a + amax_a;
  char* data_a = partials_b + amax_b;
  char* data_b = data_a + copy_a;

  // The scales, from the operand's own amax or from the given one (then the operand's values are
  // not read for it: a shard scales like the whole tensor). Both paths below use them.
  const auto compute_scale = [&](std::string_view name, const Tensor& operand, int64_t count,
                                 DType format, const Tensor& given, float* scale, char* partials,
                                 size_t partials_bytes) {
    if (given.empty()) {
      check_cuda(kernels::launch_fp8_scale(operand.data, in_type, count, fp8_format(format), scale,
                                           partials, partials_bytes, impl.stream),
                 "gemm", fmt::format("the fp8 amax kernels of {}", name));
    } else {
      check_cuda(kernels::launch_fp8_scale_from_amax(given.as<float>(), fp8_format(format), scale,
                                                     impl.stream),
                 "gemm", fmt::format("the fp8 scale kernel of {} from amax_{}", name, name));
      ++impl.gemm_plans->paths.fp8_given_amax;
    }
  };
  if (g.fp8_a) compute_scale("a", g.a, a_count, *g.fp8_a, g.amax_a, scale_a, partials_a, amax_a);
  if (g.fp8_b) compute_scale("b", g.b, b_count, *g.fp8_b, g.amax_b, scale_b, partials_b, amax_b);

  if (tensor_cores) {
    // TN: a as [m, k] (stored [k, m] when trans_a), b as [n, k] (stored [k, n] unless trans_b).
    check_cuda(
        kernels::launch_fp8_quantize(reinterpret_cast<uint8_t*>(data_a), g.a.data, in_type, g.m,
                                     g.k, g.trans_a, fp8_format(*g.fp8_a), scale_a, impl.stream),
        "gemm", "the fp8 quantize kernel of a");
    check_cuda(
        kernels::launch_fp8_quantize(reinterpret_cast<uint8_t*>(data_b), g.b.data, in_type, g.n,
                                     g.k, !g.trans_b, fp8_format(*g.fp8_b), scale_b, impl.stream),
        "gemm", "the fp8 quantize kernel of b");
    LtCall call;
    call.key.a = *g.fp8_a;
    call.key.b = *g.fp8_b;
    call.key.c = g.c.dtype;
    call.key.scaled = true;
    call.key.trans_a = false;
    call.key.trans_b = true;
    call.key.m = g.m;
    call.key.n = g.n;
    call.key.k = g.k;
    call.key.align_a = call.key.align_b = 256;
    call.key.align_c = alignment_of(g.c.data, 1, 0, tensor::dtype_size(g.c.dtype));
    // cuBLASLt's fp8 bias is bf16 for a bf16 D; anything else is added afterwards.
    const bool bias_epilogue = g.c.dtype == DType::bf16 && bias_fits_epilogue(g);
    if (bias_epilogue) {
      call.key.epilogue = LtEpilogue::bias;
      call.key.align_bias = alignment_of(g.bias.data, 1, 0, tensor::dtype_size(g.bias.dtype));
      call.bias = g.bias.data;
    }
    call.a = data_a;
    call.b = data_b;
    call.c = g.c.data;
    call.scale_a = scale_a + 1;
    call.scale_b = scale_b + 1;
    call.alpha = static_cast<float>(g.alpha);
    call.beta = static_cast<float>(g.beta);
    if (run_lt(impl, call, true)) {
      if (!g.bias.empty() && !bias_epilogue) add_bias_after(impl, g);
      ++impl.gemm_plans->paths.fp8_tensor_core;
      return;
    }
  }

  // The same values on the input dtype's GEMM: marked operands become round(x p) / p.
  GemmArgs plain = g;
  plain.fp8_a.reset();
  plain.fp8_b.reset();
  if (g.fp8_a) {
    check_cuda(kernels::launch_fp8_dequantize(data_a, g.a.data, in_type, a_count,
                                              fp8_format(*g.fp8_a), scale_a, impl.stream),
               "gemm", "the fp8 dequantize kernel of a");
    plain.a = Tensor{data_a, g.a.dtype, Shape{a_count}, Device::cuda};
  }
  if (g.fp8_b) {
    check_cuda(kernels::launch_fp8_dequantize(data_b, g.b.data, in_type, b_count,
                                              fp8_format(*g.fp8_b), scale_b, impl.stream),
               "gemm", "the fp8 dequantize kernel of b");
    plain.b = Tensor{data_b, g.b.dtype, Shape{b_count}, Device::cuda};
  }
  plain_gemm(impl, plain);
  ++impl.gemm_plans->paths.fp8_emulated;
}

// ---- bias_backward ------------------------------------------------------------------------------

void CudaBackend::do_bias_backward(const Tensor& dbias, const Tensor& dout) {
  constexpr std::string_view op = "bias_backward";
  const kernels::Storage type = storage_type(op, "dout", dout.dtype);
  const int64_t C = dbias.numel();
  const int64_t N = dout.numel() / C;
  activate(*impl_, op);
  const size_t bytes = kernels::column_sums_scratch_bytes(N, C);
  void* scratch = impl_->scratch_for(bytes);
  check_cuda(kernels::launch_column_sums_accumulate(dbias.as<float>(), dout.data, type, N, C,
                                                    scratch, bytes, impl_->stream),
             op, "the column-sum kernels");
}

}  // namespace trainctl::backend::cuda
