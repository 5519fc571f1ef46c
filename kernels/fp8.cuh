// Per-tensor fp8 quantization for the CUDA backend's fp8 GEMMs (backend::GemmArgs, "fp8
// operands"): the amax of an operand, its scale p = fp8_scale_for(max_finite, amax) computed on
// the device (no host synchronisation), and the quantized copy q = round_format(x * p).
//
// Contract:
//   - amax: max |x| over n elements of f32, bf16 or f16 storage. A NaN or infinite element makes
//     amax +inf, hence p NaN (lib/tensor/fp8_scale.hpp), hence NaN quantized values and a NaN
//     1/p: every output of the GEMM is NaN, as on the CPU. Two passes (per-block partials, then
//     one block): no atomics; max is order-independent anyway, so the result is exact and
//     repeatable. launch_fp8_amax stores it (Backend::amax: the CPU's bits, +inf survives a max
//     over ranks); launch_fp8_scale turns it into the scale directly.
//   - scale: scale[0] = p, scale[1] = 1 / p (exact: p is a power of two in [2^-126, 2^126]).
//     The bits equal the CPU backend's fp8_scale for the same amax (same exponent arithmetic).
//     launch_fp8_scale_from_amax takes the amax from device memory instead (GemmArgs amax_a /
//     amax_b, e.g. max-reduced over a tensor-parallel group): the same finishing kernel, so the
//     same bits as launch_fp8_scale for an operand whose amax it is. The value is used as given
//     (fp8_scale(format, amax[0]) on the CPU), except that NaN counts as +inf: both give p NaN.
//   - quantize: out is [rows, cols] row-major. Without transpose, src is [rows, cols]; with
//     transpose, src is [cols, rows] (so a k-major copy can be made of an operand stored m-major).
//     Each element is x * p in fp32 (exact unless it leaves the f32 range), rounded to nearest even
//     into e4m3 / e5m2 with saturation to the largest finite value (NaN stays NaN):
//     tensor::round_to's rounding, bit for bit.
//   - dequantize (the fallback when cuBLASLt's fp8 kernels do not apply): the same q, stored as
//     q * (1 / p) in the source's storage type. Exact for f32; exact for bf16 unless q / p falls
//     below bf16's smallest subnormal (only for operands with amax below about 2^-117).
//   - Asynchronous on `stream`; returns cudaErrorInvalidValue for bad arguments, else the launch
//     status.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/storage.cuh"

namespace trainctl::kernels {

enum class Fp8Format : uint8_t { e4m3, e5m2 };

// Device scratch bytes the amax passes need for n elements (partials), 256-byte multiple.
size_t fp8_amax_scratch_bytes(int64_t n);

// scale[0] = p, scale[1] = 1 / p for the operand src[0, n). `scratch` holds
// fp8_amax_scratch_bytes(n) bytes of device memory.
cudaError_t launch_fp8_scale(const void* src, Storage type, int64_t n, Fp8Format format,
                             float* scale, void* scratch, size_t scratch_bytes,
                             cudaStream_t stream);

// amax[0] = max |x| over src[0, n) (+inf when an element is NaN or infinite). `scratch` as above.
cudaError_t launch_fp8_amax(const void* src, Storage type, int64_t n, float* amax, void* scratch,
                            size_t scratch_bytes, cudaStream_t stream);

// scale[0] = p, scale[1] = 1 / p for the amax amax[0] (device memory). One tiny kernel, no scratch.
cudaError_t launch_fp8_scale_from_amax(const float* amax, Fp8Format format, float* scale,
                                       cudaStream_t stream);

// out (rows * cols bytes of fp8) = round_format(src * scale[0]), transposed when asked.
cudaError_t launch_fp8_quantize(uint8_t* out, const void* src, Storage type, int64_t rows,
                                int64_t cols, bool transpose, Fp8Format format, const float* scale,
                                cudaStream_t stream);

// out (rows * cols of `type`, same layout as src) = round_format(src * scale[0]) * scale[1].
cudaError_t launch_fp8_dequantize(void* out, const void* src, Storage type, int64_t n,
                                  Fp8Format format, const float* scale, cudaStream_t stream);

}  // namespace trainctl::kernels
