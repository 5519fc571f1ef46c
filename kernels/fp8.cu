// fp8 quantization kernels. See fp8.cuh for the contract.
//
// amax: pass 1 runs a grid fixed by n (each thread a grid-stride max of |x|, the block folds its
// warps' maxima), pass 2 (amax_finish_kernel) one block over the partials, which writes the amax,
// the scale (with the shared host/device fp8_scale_for) or both. A given amax (GemmArgs amax_a /
// amax_b) takes pass 2 alone, over its one value, so the two scales come from one piece of code.
// Non-finite elements become +inf before the max (fmaxf would drop a NaN), so one of them makes
// p NaN.
// Conversion: __nv_cvt_float_to_fp8 with __NV_SATFINITE is cvt.rn.satfinite on sm_89+: round to
// nearest even, saturate finite values, NaN to NaN: the CPU's tensor::to_e4m3 / to_e5m2.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "kernels/check.cuh"
#include "kernels/fp8.cuh"
#include "kernels/storage.cuh"
#include "tensor/fp8_scale.hpp"

namespace trainctl::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;
constexpr int64_t kElementsPerBlock = 16 * kThreads;

int64_t amax_blocks(int64_t n) {
  return std::clamp<int64_t>((n + kElementsPerBlock - 1) / kElementsPerBlock, 1, kMaxBlocks);
}

__device__ __forceinline__ float magnitude(float x) {
  const float a = fabsf(x);
  return a <= 3.402823466e38f ? a : INFINITY;  // NaN and inf: +inf
}

// The block's maximum (valid in thread 0). -inf is the identity, not 0: a given amax passes
// through unchanged even when it is negative (fp8_scale_for then sees what the CPU sees).
__device__ float block_max(float value, float* shared) {
  value = warp_max(value);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < kThreads / 32 ? shared[lane] : -INFINITY;
  if (warp == 0) value = warp_max(value);
  return value;
}

template <class S>
__global__ void __launch_bounds__(kThreads)
    amax_partials_kernel(const typename S::T* __restrict__ src, int64_t n,
                         float* __restrict__ partials) {
  __shared__ float shared[kThreads / 32];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  float local = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride)
    local = fmaxf(local, magnitude(S::load(src[i])));
  const float block = block_max(local, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = block;
}

// The max of values[0, count) (partials of pass 1, or one given amax), written to amax when it is
// not null; then scale[0] = p, scale[1] = 1 / p from it when scale is not null. NaN counts as
// +inf, so a NaN given amax makes p NaN exactly as fp8_scale_for(NaN) does on the host.
__global__ void __launch_bounds__(kThreads)
    amax_finish_kernel(const float* __restrict__ values, int64_t count, float max_finite,
                       float* __restrict__ amax, float* __restrict__ scale) {
  __shared__ float shared[kThreads / 32];
  float local = -INFINITY;
  for (int64_t i = threadIdx.x; i < count; i += kThreads) {
    const float v = values[i];
    local = fmaxf(local, isnan(v) ? INFINITY : v);
  }
  const float result = block_max(local, shared);
  if (threadIdx.x == 0) {
    if (amax != nullptr) amax[0] = result;
    if (scale != nullptr) {
      const float p = tensor::fp8_scale_for(max_finite, result);
      scale[0] = p;
      scale[1] = __fdiv_rn(1.0f, p);
    }
  }
}

__device__ __forceinline__ uint8_t to_fp8(float x, Fp8Format format) {
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(x, __NV_SATFINITE, format == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2));
}

__device__ __forceinline__ float from_fp8(uint8_t q, Fp8Format format) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q),
                                               format == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
  return __half2float(__half(h));  // exact: every fp8 value is an f16 value
}

template <class S>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(uint8_t* __restrict__ out, const typename S::T* __restrict__ src, int64_t n,
                    Fp8Format format, const float* __restrict__ scale) {
  const float p = scale[0];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride)
    out[i] = to_fp8(__fmul_rn(S::load(src[i]), p), format);
}

// out [rows, cols] from src [cols, rows] through 32 x 32 shared tiles: reads and writes are
// both coalesced. Blocks of 32 x 8 threads; tile rows loop over gridDim.y.
constexpr int kTile = 32;
constexpr int kTileRowsPerPass = 8;

template <class S>
__global__ void __launch_bounds__(kTile* kTileRowsPerPass)
    quantize_transpose_kernel(uint8_t* __restrict__ out, const typename S::T* __restrict__ src,
                              int64_t rows, int64_t cols, Fp8Format format,
                              const float* __restrict__ scale) {
  __shared__ float tile[kTile][kTile + 1];  // [output col][output row], padded against conflicts
  const float p = scale[0];
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  for (int64_t row_tile = blockIdx.y; row_tile < row_tiles; row_tile += gridDim.y) {
    const int64_t row0 = row_tile * kTile;
    // src row = output col, src col = output row: threads along x read consecutive src columns.
    for (int j = ty; j < kTile; j += kTileRowsPerPass) {
      const int64_t c = col0 + j, r = row0 + tx;
      if (c < cols && r < rows) tile[j][tx] = S::load(src[c * rows + r]);
    }
    __syncthreads();
    for (int j = ty; j < kTile; j += kTileRowsPerPass) {
      const int64_t r = row0 + j, c = col0 + tx;
      if (r < rows && c < cols) out[r * cols + c] = to_fp8(__fmul_rn(tile[tx][j], p), format);
    }
    __syncthreads();
  }
}

template <class S>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(typename S::T* __restrict__ out, const typename S::T* __restrict__ src,
                      int64_t n, Fp8Format format, const float* __restrict__ scale) {
  const float p = scale[0];
  const float inv_p = scale[1];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const float q = from_fp8(to_fp8(__fmul_rn(S::load(src[i]), p), format), format);
    out[i] = S::store(__fmul_rn(q, inv_p));
  }
}

float max_finite_of(Fp8Format format) {
  return format == Fp8Format::e4m3 ? tensor::kE4M3Max : tensor::kE5M2Max;
}

}  // namespace

size_t fp8_amax_scratch_bytes(int64_t n) {
  const auto bytes = static_cast<size_t>(amax_blocks(n)) * sizeof(float);
  return (bytes + 255) / 256 * 256;
}

namespace {

// Both passes over src: the amax into `amax`, the scale of `format` into `scale` (either may be
// null, not both).
cudaError_t amax_passes(const void* src, Storage type, int64_t n, Fp8Format format, float* amax,
                        float* scale, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (n <= 0 || src == nullptr || (amax == nullptr && scale == nullptr) || scratch == nullptr ||
      scratch_bytes < fp8_amax_scratch_bytes(n))
    return cudaErrorInvalidValue;
  const int64_t blocks = amax_blocks(n);
  auto* partials = static_cast<float*>(scratch);
  return dispatch_storage(type, [&](auto traits) -> cudaError_t {
    using S = decltype(traits);
    amax_partials_kernel<S><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const typename S::T*>(src), n, partials);
    TRAINCTL_CUDA_RETURN(cudaGetLastError());
    amax_finish_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, max_finite_of(format), amax,
                                                   scale);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t launch_fp8_scale(const void* src, Storage type, int64_t n, Fp8Format format,
                             float* scale, void* scratch, size_t scratch_bytes,
                             cudaStream_t stream) {
  return amax_passes(src, type, n, format, nullptr, scale, scratch, scratch_bytes, stream);
}

cudaError_t launch_fp8_amax(const void* src, Storage type, int64_t n, float* amax, void* scratch,
                            size_t scratch_bytes, cudaStream_t stream) {
  // The format only matters for a scale, which is not asked for.
  return amax_passes(src, type, n, Fp8Format::e4m3, amax, nullptr, scratch, scratch_bytes, stream);
}

cudaError_t launch_fp8_scale_from_amax(const float* amax, Fp8Format format, float* scale,
                                       cudaStream_t stream) {
  if (amax == nullptr || scale == nullptr) return cudaErrorInvalidValue;
  amax_finish_kernel<<<1, kThreads, 0, stream>>>(amax, 1, max_finite_of(format), nullptr, scale);
  return cudaGetLastError();
}

cudaError_t launch_fp8_quantize(uint8_t* out, const void* src, Storage type, int64_t rows,
                                int64_t cols, bool transpose, Fp8Format format, const float* scale,
                                cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || out == nullptr || src == nullptr || scale == nullptr)
    return cudaErrorInvalidValue;
  return dispatch_storage(type, [&](auto traits) -> cudaError_t {
    using S = decltype(traits);
    const auto* typed = static_cast<const typename S::T*>(src);
    if (!transpose) {
      const int64_t n = rows * cols;
      quantize_kernel<S>
          <<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, typed, n, format, scale);
      return cudaGetLastError();
    }
    const int64_t col_tiles = (cols + kTile - 1) / kTile;
    const int64_t row_tiles = (rows + kTile - 1) / kTile;
    if (col_tiles > INT32_MAX) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(col_tiles),
                    static_cast<unsigned>(std::min<int64_t>(row_tiles, 65535)));
    quantize_transpose_kernel<S>
        <<<grid, dim3(kTile, kTileRowsPerPass), 0, stream>>>(out, typed, rows, cols, format, scale);
    return cudaGetLastError();
  });
}

cudaError_t launch_fp8_dequantize(void* out, const void* src, Storage type, int64_t n,
                                  Fp8Format format, const float* scale, cudaStream_t stream) {
  if (n <= 0 || out == nullptr || src == nullptr || scale == nullptr) return cudaErrorInvalidValue;
  return dispatch_storage(type, [&](auto traits) -> cudaError_t {
    using S = decltype(traits);
    dequantize_kernel<S><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<typename S::T*>(out), static_cast<const typename S::T*>(src), n, format, scale);
    return cudaGetLastError();
  });
}

}  // namespace trainctl::kernels
