// Embedding kernels. See embedding.cuh for the contract.
#include <cub/device/device_radix_sort.cuh>

#include <cstdint>

#include "kernels/check.cuh"
#include "kernels/embedding.cuh"
#include "kernels/storage.cuh"

namespace trainctl::kernels {
namespace {

constexpr int kThreads = 256;

template <class St>
__global__ void __launch_bounds__(kThreads)
    embedding_forward_kernel(typename St::T* out, const int32_t* tokens, const typename St::T* wte,
                             const typename St::T* wpe, int64_t N, int64_t C, int64_t V, int64_t T,
                             int64_t vocab_begin, bool shard) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < N * C;
       k += stride) {
    const int64_t n = k / C, c = k % C;
    const int64_t row = static_cast<int64_t>(tokens[n]) - vocab_begin;
    float value;
    if (row >= 0 && row < V)
      value = St::load(wte[row * C + c]);
    else
      value = shard ? 0.0f : __int_as_float(0x7fc00000);
    if (wpe) value += St::load(wpe[(n % T) * C + c]);
    out[k] = St::store(value);
  }
}

// Sort keys: the local row, or V for tokens outside the table (sorted last, skipped).
__global__ void __launch_bounds__(kThreads)
    embedding_keys_kernel(int32_t* keys, int32_t* order, const int32_t* tokens, int64_t N,
                          int64_t V, int64_t vocab_begin) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; n < N; n += stride) {
    const int64_t row = static_cast<int64_t>(tokens[n]) - vocab_begin;
    keys[n] = static_cast<int32_t>(row >= 0 && row < V ? row : V);
    order[n] = static_cast<int32_t>(n);
  }
}

// Block x = a position in the sorted tokens; only the first position of each row's run works:
// its threads (columns) add that run's dout rows in token order to the old dwte value.
template <class St>
__global__ void __launch_bounds__(kThreads)
    embedding_wte_kernel(float* dwte, const typename St::T* dout, const int32_t* keys,
                         const int32_t* order, int64_t N, int64_t C, int64_t V) {
  const int64_t i = blockIdx.x;
  const int32_t key = keys[i];
  if (key >= V || (i > 0 && keys[i - 1] == key)) return;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (c >= C) return;
  float acc = dwte[key * C + c];
  for (int64_t j = i; j < N && keys[j] == key; ++j)
    acc += St::load(dout[static_cast<int64_t>(order[j]) * C + c]);
  dwte[key * C + c] = acc;
}

// dwpe[t, c] += dout[b*T + t, c] for b = 0, 1, ... in order.
template <class St>
__global__ void __launch_bounds__(kThreads)
    embedding_wpe_kernel(float* dwpe, const typename St::T* dout, int64_t N, int64_t C, int64_t T) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < T * C;
       k += stride) {
    float acc = dwpe[k];
    for (int64_t n0 = 0; n0 < N; n0 += T)
      acc += St::load(dout[n0 * C + k]);
    dwpe[k] = acc;
  }
}

int key_bits(int64_t V) {
  int bits = 1;
  while ((int64_t{1} << bits) <= V)
    ++bits;
  return bits;
}

size_t align_up(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

size_t sort_temp_bytes(int64_t N, int64_t V) {
  size_t bytes = 0;
  const cudaError_t status = cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(N), 0,
      key_bits(V));
  return status == cudaSuccess ? bytes : 0;
}

}  // namespace

cudaError_t launch_embedding_forward(Storage storage, void* out, const int32_t* tokens,
                                     const void* wte, const void* wpe, int64_t N, int64_t C,
                                     int64_t V, int64_t T, int64_t vocab_begin, bool shard,
                                     cudaStream_t stream) {
  if (N < 0 || C <= 0 || V < 0 || T <= 0) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    embedding_forward_kernel<St><<<grid_for(N * C, kThreads), kThreads, 0, stream>>>(
        static_cast<Tp*>(out), tokens, static_cast<const Tp*>(wte), static_cast<const Tp*>(wpe), N,
        C, V, T, vocab_begin, shard);
    return cudaGetLastError();
  });
}

size_t embedding_backward_scratch_bytes(int64_t N, int64_t V) {
  if (N <= 0) return 1;
  return 4 * align_up(static_cast<size_t>(N) * sizeof(int32_t)) + align_up(sort_temp_bytes(N, V));
}

cudaError_t launch_embedding_backward(Storage storage, float* dwte, float* dwpe, const void* dout,
                                      const int32_t* tokens, int64_t N, int64_t C, int64_t V,
                                      int64_t T, int64_t vocab_begin, void* scratch,
                                      size_t scratch_bytes, cudaStream_t stream) {
  if (N < 0 || C <= 0 || V < 0 || T <= 0 || N > INT32_MAX - 1 || V > INT32_MAX - 1)
    return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  if (scratch_bytes < embedding_backward_scratch_bytes(N, V)) return cudaErrorInvalidValue;
  const size_t ints = align_up(static_cast<size_t>(N) * sizeof(int32_t));
  auto* base = static_cast<char*>(scratch);
  auto* keys_in = reinterpret_cast<int32_t*>(base);
  auto* keys_out = reinterpret_cast<int32_t*>(base + ints);
  auto* order_in = reinterpret_cast<int32_t*>(base + 2 * ints);
  auto* order_out = reinterpret_cast<int32_t*>(base + 3 * ints);
  void* temp = base + 4 * ints;
  size_t temp_bytes = sort_temp_bytes(N, V);
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    const Tp* dy = static_cast<const Tp*>(dout);
    if (dwpe) {
      embedding_wpe_kernel<St>
          <<<grid_for(T * C, kThreads), kThreads, 0, stream>>>(dwpe, dy, N, C, T);
      TRAINCTL_CUDA_RETURN(cudaGetLastError());
    }
    embedding_keys_kernel<<<grid_for(N, kThreads), kThreads, 0, stream>>>(keys_in, order_in, tokens,
                                                                          N, V, vocab_begin);
    TRAINCTL_CUDA_RETURN(cudaGetLastError());
    TRAINCTL_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out,
                                                         order_in, order_out, static_cast<int>(N),
                                                         0, key_bits(V), stream));
    const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>((C + kThreads - 1) / kThreads));
    embedding_wte_kernel<St><<<grid, kThreads, 0, stream>>>(dwte, dy, keys_out, order_out, N, C, V);
    return cudaGetLastError();
  });
}

}  // namespace trainctl::kernels
