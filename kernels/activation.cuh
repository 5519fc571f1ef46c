// GELU (tanh approximation) and SwiGLU on the GPU, forward and backward; the CPU reference is
// lib/backend/cpu/activation.cpp and the formulas are the same: f32 storage computes GELU as
// x sigmoid(2u) (the CPU's fast form), 16-bit storage as 0.5 x (1 + tanh u) (the CPU's table
// form), each in f32 and rounded once. Elementwise: outputs are overwritten; an output may alias
// its inputs (each element is read before it is written, by the same thread).
//
// Pointers are device pointers of the `storage` type. Returns the launch status.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/storage.cuh"

namespace trainctl::kernels {

cudaError_t launch_gelu_forward(Storage storage, void* out, const void* x, int64_t count,
                                cudaStream_t stream);
cudaError_t launch_gelu_backward(Storage storage, void* dx, const void* dout, const void* x,
                                 int64_t count, cudaStream_t stream);
// gate_up [N, 2F]: gate in columns [0, F), up in [F, 2F); out [N, F] = silu(gate) * up.
cudaError_t launch_swiglu_forward(Storage storage, void* out, const void* gate_up, int64_t N,
                                  int64_t F, cudaStream_t stream);
cudaError_t launch_swiglu_backward(Storage storage, void* dgate_up, const void* dout,
                                   const void* gate_up, int64_t N, int64_t F, cudaStream_t stream);

}  // namespace trainctl::kernels
