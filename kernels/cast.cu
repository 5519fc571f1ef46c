// fp32 <-> bf16 / fp16 casts. See cast.cuh for the contract; convert.cuh for the rounding.
//
// One kernel template serves all four directions: a grid-stride loop over 8-element chunks
// (16-byte loads and stores on the 16-bit side, two 16-byte accesses on the fp32 side) when both
// pointers are 16-byte aligned, then a grid-stride scalar loop for the tail, or for everything
// when the pointers are not aligned (e.g. a tensor slice starting at an odd element).
#include <algorithm>
#include <cstdint>

#include "kernels/cast.cuh"
#include "kernels/check.cuh"
#include "kernels/convert.cuh"

namespace trainctl::kernels {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kBlocksPerSm = 8;  // 2048 resident threads per SM on sm_90: full occupancy
constexpr int64_t kChunk = 8;    // elements per vector step: 16 bytes of 16-bit values

struct F32ToBf16 {
  using In = float;
  using Out = uint16_t;
  __device__ static Out apply(In value) { return f32_to_bf16_bits(value); }
};
struct Bf16ToF32 {
  using In = uint16_t;
  using Out = float;
  __device__ static Out apply(In bits) { return bf16_bits_to_f32(bits); }
};
struct F32ToF16 {
  using In = float;
  using Out = uint16_t;
  __device__ static Out apply(In value) { return f32_to_f16_bits(value); }
};
struct F16ToF32 {
  using In = uint16_t;
  using Out = float;
  __device__ static Out apply(In bits) { return f16_bits_to_f32(bits); }
};

// Copies one chunk of kChunk elements as 16-byte words (1 for 16-bit types, 2 for fp32).
template <class T>
__device__ __forceinline__ void copy_chunk(const T* __restrict__ src, T* __restrict__ dst) {
  constexpr int kWords = static_cast<int>(sizeof(T) * kChunk / sizeof(uint4));
  const uint4* from = reinterpret_cast<const uint4*>(src);
  uint4* to = reinterpret_cast<uint4*>(dst);
#pragma unroll
  for (int w = 0; w < kWords; ++w)
    to[w] = from[w];
}

template <class Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    cast_kernel(const typename Op::In* __restrict__ in, typename Op::Out* __restrict__ out,
                int64_t n, bool vectorised) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t scalar_begin = 0;
  if (vectorised) {
    const int64_t num_chunks = n / kChunk;
    for (int64_t chunk = thread; chunk < num_chunks; chunk += stride) {
      alignas(16) In source[kChunk];
      alignas(16) Out result[kChunk];
      copy_chunk(in + chunk * kChunk, source);
#pragma unroll
      for (int k = 0; k < kChunk; ++k)
        result[k] = Op::apply(source[k]);
      copy_chunk(result, out + chunk * kChunk);
    }
    scalar_begin = num_chunks * kChunk;
  }
  for (int64_t i = scalar_begin + thread; i < n; i += stride)
    out[i] = Op::apply(in[i]);
}

bool aligned_16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

bool overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(a);
  const uintptr_t b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + static_cast<uintptr_t>(b_bytes) && b0 < a0 + static_cast<uintptr_t>(a_bytes);
}

template <class Op>
cudaError_t launch_cast(const typename Op::In* in, typename Op::Out* out, int64_t n,
                        cudaStream_t stream) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr) return cudaErrorInvalidValue;
  if (overlap(in, n * static_cast<int64_t>(sizeof(In)), out, n * static_cast<int64_t>(sizeof(Out))))
    return cudaErrorInvalidValue;

  int device = 0;
  int num_sms = 0;
  TRAINCTL_CUDA_RETURN(cudaGetDevice(&device));
  TRAINCTL_CUDA_RETURN(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));

  const bool vectorised = aligned_16(in) && aligned_16(out);
  // Threads with something to do: one per chunk (and at least one per tail element), or one
  // per element on the scalar path.
  const int64_t busy_threads = vectorised ? std::max(n / kChunk, kChunk) : n;
  const int64_t wanted_blocks = (busy_threads + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const int64_t max_blocks = static_cast<int64_t>(std::max(num_sms, 1)) * kBlocksPerSm;
  const auto num_blocks = static_cast<unsigned>(std::min(wanted_blocks, max_blocks));

  cast_kernel<Op><<<num_blocks, kThreadsPerBlock, 0, stream>>>(in, out, n, vectorised);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_cast_f32_to_bf16(const float* in, uint16_t* out, int64_t n,
                                    cudaStream_t stream) {
  return launch_cast<F32ToBf16>(in, out, n, stream);
}
cudaError_t launch_cast_bf16_to_f32(const uint16_t* in, float* out, int64_t n,
                                    cudaStream_t stream) {
  return launch_cast<Bf16ToF32>(in, out, n, stream);
}
cudaError_t launch_cast_f32_to_f16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream) {
  return launch_cast<F32ToF16>(in, out, n, stream);
}
cudaError_t launch_cast_f16_to_f32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream) {
  return launch_cast<F16ToF32>(in, out, n, stream);
}

}  // namespace trainctl::kernels
