// Deterministic reductions. See reduce.cuh for the contract.
//
// Whole-tensor sums: pass 1 runs a grid fixed by n; thread t of block b adds elements
// b * 256 + t, then every (grid * 256)-th after it, in double, and the block folds its 256 sums
// in a fixed shared-memory tree; pass 2 is one block folding the per-block partials the same
// way. Column sums (bias_backward): pass 1 splits the rows into a fixed number of chunks and
// sums each column of each chunk (a warp reads 32 adjacent columns of one row: coalesced);
// pass 2 adds the chunk sums of each column in chunk order and accumulates into dbias.
#include <algorithm>
#include <cstdint>

#include "kernels/check.cuh"
#include "kernels/reduce.cuh"
#include "kernels/vector_io.cuh"

namespace trainctl::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;
constexpr int64_t kElementsPerBlock = 16 * kThreads;  // below this, fewer blocks

int64_t reduce_blocks(int64_t n) {
  return std::clamp<int64_t>((n + kElementsPerBlock - 1) / kElementsPerBlock, 1, kMaxBlocks);
}

// Folds the block's kThreads values in a fixed tree; thread 0 returns the total.
__device__ double block_sum(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  return shared[0];
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    reduce_partials_kernel(const T* __restrict__ src, int64_t n, bool squares,
                           double* __restrict__ partials) {
  __shared__ double shared[kThreads];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  double total = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const double x = load_float(src[i]);
    total += squares ? x * x : x;  // squares of f32 values are exact in double
  }
  const double block_total = block_sum(total, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = block_total;
}

__global__ void __launch_bounds__(kThreads)
    reduce_final_kernel(const double* __restrict__ partials, int64_t count,
                        double* __restrict__ result) {
  __shared__ double shared[kThreads];
  double total = 0;
  for (int64_t i = threadIdx.x; i < count; i += kThreads)
    total += partials[i];
  const double block_total = block_sum(total, shared);
  if (threadIdx.x == 0) *result = block_total;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    all_finite_kernel(const T* __restrict__ src, int64_t n, int* __restrict__ flag) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  bool finite = true;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride)
    finite = finite && isfinite(load_float(src[i]));
  // Every writer stores the same value, so the race is benign and the result deterministic.
  if (!finite) *flag = 1;
}

// Column sums: blocks of 32 columns x 8 row lanes.
constexpr int kColumnsPerBlock = 32;
constexpr int kRowLanes = 8;
constexpr int64_t kMaxRowChunks = 128;
constexpr int64_t kRowsPerChunk = 64;

int64_t row_chunks(int64_t rows) {
  return std::clamp<int64_t>((rows + kRowsPerChunk - 1) / kRowsPerChunk, 1, kMaxRowChunks);
}

template <class T>
__global__ void __launch_bounds__(kColumnsPerBlock* kRowLanes)
    column_partials_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                           int64_t rows_per_chunk, float* __restrict__ partials) {
  __shared__ float shared[kRowLanes][kColumnsPerBlock + 1];
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = rows < begin + rows_per_chunk ? rows : begin + rows_per_chunk;
  float total = 0;
  if (column < cols) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes)
      total = __fadd_rn(total, load_float(x[r * cols + column]));
  }
  shared[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y == 0 && column < cols) {
    float sum = shared[0][threadIdx.x];
#pragma unroll
    for (int lane = 1; lane < kRowLanes; ++lane)
      sum = __fadd_rn(sum, shared[lane][threadIdx.x]);
    partials[static_cast<int64_t>(blockIdx.y) * cols + column] = sum;
  }
}

__global__ void __launch_bounds__(kThreads)
    column_final_kernel(const float* __restrict__ partials, int64_t chunks, int64_t cols,
                        float* __restrict__ dbias) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (column >= cols) return;
  float sum = partials[column];
  for (int64_t chunk = 1; chunk < chunks; ++chunk)
    sum = __fadd_rn(sum, partials[chunk * cols + column]);
  dbias[column] = __fadd_rn(dbias[column], sum);
}

template <class F>
cudaError_t dispatch(Storage type, F&& f) {
  switch (type) {
    case Storage::f32:
      return f(float{});
    case Storage::bf16:
      return f(Bf16{});
    case Storage::f16:
      return f(F16{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

size_t reduce_scratch_bytes(int64_t n) {
  return static_cast<size_t>(reduce_blocks(n)) * sizeof(double);
}

cudaError_t launch_reduce(const void* src, Storage type, int64_t n, ReduceKind kind, void* scratch,
                          size_t scratch_bytes, double* result, cudaStream_t stream) {
  if (n < 0 || result == nullptr || (n > 0 && src == nullptr)) return cudaErrorInvalidValue;
  if (n == 0) return cudaMemsetAsync(result, 0, sizeof(double), stream);
  const int64_t blocks = reduce_blocks(n);
  if (scratch == nullptr || scratch_bytes < reduce_scratch_bytes(n)) return cudaErrorInvalidValue;
  auto* partials = static_cast<double*>(scratch);
  return dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    reduce_partials_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const T*>(src), n, kind == ReduceKind::sum_squares, partials);
    TRAINCTL_CUDA_RETURN(cudaGetLastError());
    reduce_final_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, result);
    return cudaGetLastError();
  });
}

cudaError_t launch_all_finite(const void* src, Storage type, int64_t n, int* flag,
                              cudaStream_t stream) {
  if (n < 0 || flag == nullptr || (n > 0 && src == nullptr)) return cudaErrorInvalidValue;
  TRAINCTL_CUDA_RETURN(cudaMemsetAsync(flag, 0, sizeof(int), stream));
  if (n == 0) return cudaSuccess;
  const int64_t blocks = reduce_blocks(n);
  return dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    all_finite_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const T*>(src), n, flag);
    return cudaGetLastError();
  });
}

size_t column_sums_scratch_bytes(int64_t rows, int64_t cols) {
  return static_cast<size_t>(row_chunks(rows) * std::max<int64_t>(cols, 0)) * sizeof(float);
}

cudaError_t launch_column_sums_accumulate(float* dbias, const void* x, Storage type, int64_t rows,
                                          int64_t cols, void* scratch, size_t scratch_bytes,
                                          cudaStream_t stream) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (dbias == nullptr || x == nullptr || scratch == nullptr ||
      scratch_bytes < column_sums_scratch_bytes(rows, cols))
    return cudaErrorInvalidValue;
  const int64_t chunks = row_chunks(rows);
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  auto* partials = static_cast<float*>(scratch);
  return dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    const dim3 grid(static_cast<unsigned>((cols + kColumnsPerBlock - 1) / kColumnsPerBlock),
                    static_cast<unsigned>(chunks));
    const dim3 block(kColumnsPerBlock, kRowLanes);
    column_partials_kernel<<<grid, block, 0, stream>>>(static_cast<const T*>(x), rows, cols,
                                                       rows_per_chunk, partials);
    TRAINCTL_CUDA_RETURN(cudaGetLastError());
    column_final_kernel<<<static_cast<unsigned>((cols + kThreads - 1) / kThreads), kThreads, 0,
                          stream>>>(partials, chunks, cols, dbias);
    return cudaGetLastError();
  });
}

}  // namespace trainctl::kernels
