// RoPE kernels. See rope.cuh for the contract.
#include <cstdint>

#include "kernels/check.cuh"
#include "kernels/rope.cuh"
#include "kernels/storage.cuh"

namespace trainctl::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    rope_table_kernel(float2* table, const int32_t* positions, int64_t T, int64_t D, double theta,
                      bool inverse) {
  const int64_t half = D / 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < T * half;
       k += stride) {
    const int64_t t = k / half, i = k % half;
    const double angle = static_cast<double>(positions ? positions[t] : t) *
                         pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    const double s = sin(angle);
    table[k] = make_float2(static_cast<float>(cos(angle)), static_cast<float>(inverse ? -s : s));
  }
}

// One thread per rotated pair. Both members are read before either is written, so out may
// alias x.
template <class St>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(typename St::T* out, const typename St::T* x, const float2* table, int64_t N,
                int64_t width, int64_t T, int64_t rotated_heads, int64_t D) {
  const int64_t half = D / 2;
  const int64_t pairs_per_row = rotated_heads * half;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < N * pairs_per_row;
       k += stride) {
    const int64_t n = k / pairs_per_row, p = k % pairs_per_row;
    const int64_t h = p / half, i = p % half;
    const float2 cs = table[(n % T) * half + i];
    const int64_t col = n * width + h * D + i;
    const float a = St::load(x[col]);
    const float b = St::load(x[col + half]);
    out[col] = St::store(a * cs.x - b * cs.y);
    out[col + half] = St::store(b * cs.x + a * cs.y);
  }
}

}  // namespace

cudaError_t launch_rope(Storage storage, void* out, const void* x, int64_t N, int64_t width,
                        int64_t T, int64_t rotated_heads, int64_t D, double theta, bool inverse,
                        const int32_t* positions, float2* table, cudaStream_t stream) {
  if (N < 0 || T <= 0 || D <= 0 || D % 2 != 0 || rotated_heads < 0 || rotated_heads * D > width)
    return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  const size_t element = storage == Storage::f32 ? 4 : 2;
  const int64_t rotated = rotated_heads * D;
  if (out != x && width > rotated) {
    TRAINCTL_CUDA_RETURN(
        cudaMemcpy2DAsync(static_cast<char*>(out) + rotated * element, width * element,
                          static_cast<const char*>(x) + rotated * element, width * element,
                          (width - rotated) * element, N, cudaMemcpyDeviceToDevice, stream));
  }
  if (rotated == 0) return cudaSuccess;
  rope_table_kernel<<<grid_for(T * (D / 2), kThreads), kThreads, 0, stream>>>(table, positions, T,
                                                                              D, theta, inverse);
  TRAINCTL_CUDA_RETURN(cudaGetLastError());
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    rope_kernel<St><<<grid_for(N * rotated_heads * (D / 2), kThreads), kThreads, 0, stream>>>(
        static_cast<Tp*>(out), static_cast<const Tp*>(x), table, N, width, T, rotated_heads, D);
    return cudaGetLastError();
  });
}

}  // namespace trainctl::kernels
