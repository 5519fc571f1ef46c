// GEMM on OpenBLAS. f64 -> dgemm, f32 -> sgemm; bf16/f16 inputs are widened to f32 scratch (kept
// by the backend, so warm calls do not allocate), multiplied with sgemm, and rounded once into C
// when C is narrow. The bias epilogue is added in the compute type before that single rounding.
// fp8 operands (backend.hpp) are quantized in that f32 scratch: the products of fp8 values are
// exact in f32, so this computes what fp8 tensor cores compute, up to the order of the sums.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include <cblas.h>
#include <fmt/format.h>

#include "backend/cpu/cpu_backend.hpp"
#include "tensor/fp8_scale.hpp"

namespace trainctl::backend::cpu {

template <class T>
void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
               int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  const auto i = [](int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<T, double>)
    cblas_dgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c,
                i(ldc));
  else
    cblas_sgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c,
                i(ldc));
}

template void blas_gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                               const float*, int64_t, float, float*, int64_t);
template void blas_gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                int64_t, const double*, int64_t, double, double*, int64_t);

namespace {

// c[m, n] (compute type T) += bias[n] on every row.
template <class T>
void add_bias(T* c, int64_t m, int64_t n, const Tensor& bias) {
  dispatch_float(bias.dtype, "gemm", "bias", [&]<class B>(Tag<B>) {
    const B* b = bias.as<B>();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        c[i * n + j] += static_cast<T>(tensor::load(b[j]));
  });
}

template <class S>
void widen(float* dst, const S* src, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    dst[i] = tensor::load(src[i]);
}

}  // namespace

// y rounded to the nearest value of an fp8 format (ties to even), for |y| <= its largest finite
// value (which the scale guarantees) or NaN. The same values as tensor::round_to, about 20x
// faster: normal values keep man_bits of the float's mantissa; below the smallest normal the
// quantum is fixed.
float round_fp8(float y, DType format) {
  const bool e4m3 = format == DType::e4m3;
  const int man_bits = e4m3 ? 3 : 2;
  const float min_normal = e4m3 ? 0x1p-6f : 0x1p-14f;
  const float quantum = e4m3 ? 0x1p-9f : 0x1p-16f;  // of the subnormals
  if (std::isnan(y)) return y;
  if (std::fabs(y) < min_normal) return std::nearbyint(y / quantum) * quantum;  // exact scaling
  const int drop = 23 - man_bits;
  uint32_t bits = std::bit_cast<uint32_t>(y);
  bits += (1u << (drop - 1)) - 1 + ((bits >> drop) & 1u);
  return std::bit_cast<float>(bits & ~((1u << drop) - 1));
}

namespace {

// An fp8 operand, in place: x -> round_format(x * p) with the per-tensor scale p (fp8_scale) of
// the operand's values, or of `given` (GemmArgs amax_a/amax_b) when it is not empty. Returns p,
// so the product can be scaled back by 1 / p.
float quantize_fp8(float* x, int64_t count, DType format, const Tensor& given) {
  if (given.empty()) {
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < count; ++i) {
      if (!std::isfinite(x[i])) finite = false;
      amax = std::max(amax, std::fabs(x[i]));
    }
    const float p = fp8_scale(format, finite ? amax : std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < count; ++i)
      x[i] = round_fp8(x[i] * p, format);
    return p;
  }
  // A given amax below the operand's own saturates the larger elements, as the GPU's satfinite
  // conversion does (std::clamp keeps NaN).
  const float p = fp8_scale(format, *given.as<float>());
  const float max = format == DType::e4m3 ? tensor::kE4M3Max : tensor::kE5M2Max;
  for (int64_t i = 0; i < count; ++i)
    x[i] = round_fp8(std::clamp(x[i] * p, -max, max), format);
  return p;
}

}  // namespace

void CpuBackend::do_gemm(const GemmArgs& g) {
  if (g.epilogue == Epilogue::gelu) {
    // The GEMM into pre_gelu, then the GELU: the same two roundings as the unfused ops.
    GemmArgs plain = g;
    plain.c = g.pre_gelu;
    plain.epilogue = Epilogue::none;
    plain.pre_gelu = {};
    gemm(plain);
    gelu_forward(g.c, g.pre_gelu);
    return;
  }
  const ScopedOp timed(timer_, OpFamily::gemm);
  if (timer_.enabled)
    timer_.stats.gemm_flops += 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) *
                               static_cast<double>(g.k) * static_cast<double>(g.batch);
  const int64_t lda = g.trans_a ? g.m : g.k;
  const int64_t ldb = g.trans_b ? g.k : g.n;
  const bool fp8 = g.fp8_a.has_value() || g.fp8_b.has_value();
  dispatch_float(g.a.dtype, "gemm", "a", [&]<class S>(Tag<S>) {
    if constexpr (std::is_same_v<S, double>) {
      // c has the dtype of a here: grad_dtype(f64) = f64.
      for (int64_t p = 0; p < g.batch; ++p) {
        double* c = g.c.as<double>() + p * g.stride_c;
        blas_gemm<double>(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha,
                          g.a.as<double>() + p * g.stride_a, lda, g.b.as<double>() + p * g.stride_b,
                          ldb, g.beta, c, g.n);
        if (!g.bias.empty()) add_bias(c, g.m, g.n, g.bias);
      }
    } else if (std::is_same_v<S, float> && !fp8) {
      // c has the dtype of a here: grad_dtype(f32) = f32, grad_dtype(f64) = f64.
      for (int64_t p = 0; p < g.batch; ++p) {
        float* c = g.c.as<float>() + p * g.stride_c;
        blas_gemm<float>(g.trans_a, g.trans_b, g.m, g.n, g.k, static_cast<float>(g.alpha),
                         g.a.as<float>() + p * g.stride_a, lda, g.b.as<float>() + p * g.stride_b,
                         ldb, static_cast<float>(g.beta), c, g.n);
        if (!g.bias.empty()) add_bias(c, g.m, g.n, g.bias);
      }
    } else {
      // Narrow inputs (and fp8 operands of any width) are widened to f32 scratch first.
      float* a32 = scratch_.get<float>(kSlotGemmA, static_cast<size_t>(g.m * g.k));
      float* b32 = scratch_.get<float>(kSlotGemmB, static_cast<size_t>(g.k * g.n));
      const bool narrow_c = g.c.dtype != DType::f32;
      float* c32 =
          narrow_c ? scratch_.get<float>(kSlotGemmC, static_cast<size_t>(g.m * g.n)) : nullptr;
      for (int64_t p = 0; p < g.batch; ++p) {
        widen(a32, g.a.as<S>() + p * g.stride_a, g.m * g.k);
        widen(b32, g.b.as<S>() + p * g.stride_b, g.k * g.n);
        // fp8: the product of the quantized values, scaled back by powers of two (exact).
        float alpha = static_cast<float>(g.alpha);
        if (g.fp8_a) alpha /= quantize_fp8(a32, g.m * g.k, *g.fp8_a, g.amax_a);
        if (g.fp8_b) alpha /= quantize_fp8(b32, g.k * g.n, *g.fp8_b, g.amax_b);
        if (!narrow_c) {
          float* c = g.c.as<float>() + p * g.stride_c;
          blas_gemm<float>(g.trans_a, g.trans_b, g.m, g.n, g.k, alpha, a32, lda, b32, ldb,
                           static_cast<float>(g.beta), c, g.n);
          if (!g.bias.empty()) add_bias(c, g.m, g.n, g.bias);
          continue;
        }
        S* c = g.c.as<S>() + p * g.stride_c;
        if (g.beta != 0) widen(c32, c, g.m * g.n);
        blas_gemm<float>(g.trans_a, g.trans_b, g.m, g.n, g.k, alpha, a32, lda, b32, ldb,
                         static_cast<float>(g.beta), c32, g.n);
        if (!g.bias.empty()) add_bias(c32, g.m, g.n, g.bias);
        for (int64_t i = 0; i < g.m * g.n; ++i)
          c[i] = tensor::store<S>(c32[i]);
      }
    }
  });
}

void CpuBackend::do_bias_backward(const Tensor& dbias, const Tensor& dout) {
  const ScopedOp timed(timer_, OpFamily::elementwise);
  constexpr std::string_view op = "bias_backward";
  const int64_t C = dbias.numel();
  const int64_t N = dout.numel() / C;
  dispatch_float(dout.dtype, op, "dout", [&]<class S>(Tag<S>) {
    using G = compute_t<S>;
    G* db = dbias.as<G>();
    const S* d = dout.as<S>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c)
        db[c] += tensor::load(d[n * C + c]);
  });
}

}  // namespace trainctl::backend::cpu
