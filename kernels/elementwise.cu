// Elementwise kernels. See elementwise.cuh for the contract.
//
// Two kernel templates cover every op: unary (out = f(in)) for fill, cast and scale, binary
// (out = f(a, b)) for add and accumulate. Each is a grid-stride loop over 8-element vectors when
// all pointers are 16-byte aligned, then over single elements for the tail (or for everything on
// unaligned, sliced tensors). Arithmetic uses the __f*_rn intrinsics so nvcc cannot contract it
// into FMA: the CPU backend rounds after every operation and so must we, to match its bits.
#include <algorithm>
#include <cstdint>

#include "kernels/check.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/vector_io.cuh"

namespace trainctl::kernels {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kBlocksPerSm = 8;

struct Identity {
  __device__ float operator()(float x) const { return x; }
};
struct Constant {
  float value;
  __device__ float operator()(float) const { return value; }
};
struct MultiplyBy {
  float factor;
  __device__ float operator()(float x) const { return __fmul_rn(x, factor); }
};
struct Add {
  __device__ float operator()(float x, float y) const { return __fadd_rn(x, y); }
};

template <class Out, class In, class Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    unary_kernel(Out* out, const In* in, int64_t n, bool vectorised, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t scalar_begin = 0;
  if (vectorised) {
    const int64_t num_vectors = n / kVectorElements;
    for (int64_t v = thread; v < num_vectors; v += stride) {
      float x[kVectorElements];
      load_vector(in + v * kVectorElements, x);
#pragma unroll
      for (int k = 0; k < kVectorElements; ++k)
        x[k] = op(x[k]);
      store_vector(out + v * kVectorElements, x);
    }
    scalar_begin = num_vectors * kVectorElements;
  }
  for (int64_t i = scalar_begin + thread; i < n; i += stride)
    out[i] = store_float<Out>(op(load_float(in[i])));
}

template <class Out, class A, class B, class Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    binary_kernel(Out* out, const A* a, const B* b, int64_t n, bool vectorised, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t scalar_begin = 0;
  if (vectorised) {
    const int64_t num_vectors = n / kVectorElements;
    for (int64_t v = thread; v < num_vectors; v += stride) {
      float x[kVectorElements];
      float y[kVectorElements];
      load_vector(a + v * kVectorElements, x);
      load_vector(b + v * kVectorElements, y);
#pragma unroll
      for (int k = 0; k < kVectorElements; ++k)
        x[k] = op(x[k], y[k]);
      store_vector(out + v * kVectorElements, x);
    }
    scalar_begin = num_vectors * kVectorElements;
  }
  for (int64_t i = scalar_begin + thread; i < n; i += stride)
    out[i] = store_float<Out>(op(load_float(a[i]), load_float(b[i])));
}

template <class C, class Bias>
__global__ void __launch_bounds__(kThreadsPerBlock)
    add_bias_rows_kernel(C* c, const Bias* bias, int64_t batch, int64_t rows, int64_t cols,
                         int64_t stride_c) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t total = batch * rows * cols;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const int64_t j = idx % cols;
    const int64_t row = idx / cols;  // p * rows + i
    const int64_t offset = (row / rows) * stride_c + (row % rows) * cols + j;
    c[offset] = store_float<C>(__fadd_rn(load_float(c[offset]), load_float(bias[j])));
  }
}

bool aligned_16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

// Blocks for `work_items` independent items, at most kBlocksPerSm per SM (grid-stride beyond).
cudaError_t grid_for(int64_t work_items, unsigned* num_blocks) {
  int device = 0;
  int num_sms = 0;
  TRAINCTL_CUDA_RETURN(cudaGetDevice(&device));
  TRAINCTL_CUDA_RETURN(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t wanted =
      std::max<int64_t>((work_items + kThreadsPerBlock - 1) / kThreadsPerBlock, 1);
  const int64_t most = static_cast<int64_t>(std::max(num_sms, 1)) * kBlocksPerSm;
  *num_blocks = static_cast<unsigned>(std::min(wanted, most));
  return cudaSuccess;
}

// Runs f(T{}) with T the C++ storage type of `type`.
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

template <class Out, class In, class Op>
cudaError_t run_unary(Out* out, const In* in, int64_t n, Op op, cudaStream_t stream) {
  const bool vectorised = aligned_16(out) && aligned_16(in);
  unsigned blocks = 0;
  TRAINCTL_CUDA_RETURN(
      grid_for(vectorised ? std::max<int64_t>(n / kVectorElements, 1) : n, &blocks));
  unary_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(out, in, n, vectorised, op);
  return cudaGetLastError();
}

template <class Out, class A, class B, class Op>
cudaError_t run_binary(Out* out, const A* a, const B* b, int64_t n, Op op, cudaStream_t stream) {
  const bool vectorised = aligned_16(out) && aligned_16(a) && aligned_16(b);
  unsigned blocks = 0;
  TRAINCTL_CUDA_RETURN(
      grid_for(vectorised ? std::max<int64_t>(n / kVectorElements, 1) : n, &blocks));
  binary_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(out, a, b, n, vectorised, op);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_fill(void* dst, Storage type, float value, int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && dst == nullptr)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(dst);
    // The input is never read (Constant ignores it); out doubles as a valid, aligned pointer.
    return run_unary(out, static_cast<const T*>(out), n, Constant{value}, stream);
  });
}

cudaError_t launch_cast(void* dst, Storage dst_type, const void* src, Storage src_type, int64_t n,
                        cudaStream_t stream) {
  if (n < 0 || (n > 0 && (dst == nullptr || src == nullptr))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (dst_type == src_type) {
    return cudaMemcpyAsync(dst, src, static_cast<size_t>(n * storage_size(dst_type)),
                           cudaMemcpyDeviceToDevice, stream);
  }
  return dispatch(dst_type, [&](auto out_tag) {
    using Out = decltype(out_tag);
    return dispatch(src_type, [&](auto in_tag) {
      using In = decltype(in_tag);
      return run_unary(static_cast<Out*>(dst), static_cast<const In*>(src), n, Identity{}, stream);
    });
  });
}

cudaError_t launch_add(void* out, Storage out_type, const void* a, Storage a_type, const void* b,
                       Storage b_type, int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (out == nullptr || a == nullptr || b == nullptr)))
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return dispatch(out_type, [&](auto out_tag) {
    using Out = decltype(out_tag);
    return dispatch(a_type, [&](auto a_tag) {
      using A = decltype(a_tag);
      return dispatch(b_type, [&](auto b_tag) {
        using B = decltype(b_tag);
        return run_binary(static_cast<Out*>(out), static_cast<const A*>(a),
                          static_cast<const B*>(b), n, Add{}, stream);
      });
    });
  });
}

cudaError_t launch_accumulate(void* dst, Storage dst_type, const void* src, Storage src_type,
                              int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (dst == nullptr || src == nullptr))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return dispatch(dst_type, [&](auto dst_tag) {
    using D = decltype(dst_tag);
    return dispatch(src_type, [&](auto src_tag) {
      using S = decltype(src_tag);
      D* d = static_cast<D*>(dst);
      return run_binary(d, static_cast<const D*>(d), static_cast<const S*>(src), n, Add{}, stream);
    });
  });
}

cudaError_t launch_scale(void* dst, Storage type, float factor, int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && dst == nullptr)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    T* d = static_cast<T*>(dst);
    return run_unary(d, static_cast<const T*>(d), n, MultiplyBy{factor}, stream);
  });
}

cudaError_t launch_add_bias_rows(void* c, Storage c_type, const void* bias, Storage bias_type,
                                 int64_t batch, int64_t rows, int64_t cols, int64_t stride_c,
                                 cudaStream_t stream) {
  if (batch < 0 || rows < 0 || cols < 0) return cudaErrorInvalidValue;
  const int64_t total = batch * rows * cols;
  if (total == 0) return cudaSuccess;
  if (c == nullptr || bias == nullptr) return cudaErrorInvalidValue;
  return dispatch(c_type, [&](auto c_tag) {
    using C = decltype(c_tag);
    return dispatch(bias_type, [&](auto bias_tag) {
      using Bias = decltype(bias_tag);
      unsigned blocks = 0;
      TRAINCTL_CUDA_RETURN(grid_for(total, &blocks));
      add_bias_rows_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(
          static_cast<C*>(c), static_cast<const Bias*>(bias), batch, rows, cols, stride_c);
      return cudaGetLastError();
    });
  });
}

}  // namespace trainctl::kernels
