// TRAINCTL_HOST_DEVICE: a function compiled for the host and, under nvcc, for the device too. For
// the header-only arithmetic the CPU backend and the CUDA kernels share so that both compute the
// same bits (fp8_scale.hpp, stochastic_round.hpp).
#pragma once

#if defined(__CUDACC__)
#define TRAINCTL_HOST_DEVICE __host__ __device__
#else
#define TRAINCTL_HOST_DEVICE
#endif
