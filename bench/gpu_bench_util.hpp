// What the GPU benchmarks share: CUDA-event timing on the CUDA backend's stream, random device
// data, and the two ceilings every efficiency figure is quoted against, measured in the same run
// (METHOD.md: datasheet rates are leads): the device-to-device copy bandwidth and the bf16 GEMM
// rate of cuBLASLt through our own Backend::gemm on random data (never zeros: a product of zeros
// runs faster than real data).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "backend/cuda/device.hpp"
#include "tensor/dtype.hpp"

namespace trainctl::gpu_bench {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(fmt::format("{} failed: {} ({})", what, cudaGetErrorString(status),
                                         static_cast<int>(status)));
}

inline cudaStream_t stream_of(backend::cuda::CudaBackend& be) {
  return be.impl().stream;
}

// Dense bf16 tensor-core peak from the vendor's datasheet (no sparsity), 0 when unknown. Only a
// lead: MFU is also quoted against the GEMM rate measured in the same run.
inline double datasheet_bf16_flops(const std::string& device_name) {
  if (device_name.find("H200") != std::string::npos ||
      device_name.find("H100 80GB HBM3") != std::string::npos ||
      device_name.find("H100 SXM") != std::string::npos)
    return 989.4e12;
  if (device_name.find("H100") != std::string::npos) return 756.0e12;  // PCIe
  if (device_name.find("A100") != std::string::npos) return 312.0e12;
  return 0;
}

// True, after one line "<program>: no GPU <device> here (<why>) - skipped", when this machine has
// no GPU `device`: the benchmarks then exit 77, as tests/gpu does.
inline bool no_gpu(const char* program, int device) {
  const backend::DeviceReport report = backend::detect_gpus();
  if (device >= 0 && device < static_cast<int>(report.gpus.size())) return false;
  std::printf("%s: no GPU %d here (%s) - skipped\n", program, device, report.status.c_str());
  return true;
}

inline std::string device_name(int device) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return prop.name;
}

// Median milliseconds of one call of `work`, from `samples` event-timed groups of `inner` calls
// each, after `warmup` untimed calls. All of `work` must be enqueued on `stream` (every CUDA
// backend op is); ops that return host values synchronise inside, which the events still bracket.
inline double median_ms(cudaStream_t stream, const std::function<void(int call)>& work,
                        int warmup = 3, int samples = 7, int inner = 5) {
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  int call = 0;
  for (int i = 0; i < warmup; ++i)
    work(call++);
  std::vector<double> ms;
  for (int s = 0; s < samples; ++s) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int i = 0; i < inner; ++i)
      work(call++);
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float elapsed = 0;
    check(cudaEventElapsedTime(&elapsed, start, stop), "cudaEventElapsedTime");
    ms.push_back(static_cast<double>(elapsed) / inner);
  }
  check(cudaGetLastError(), "a launch inside the timed region");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Fills a device tensor of a float dtype with magnitudes in [0.05, 1] and random signs, or an i32
// tensor with ids in [0, id_limit). A host pool of 4M values is tiled over large tensors, so
// filling gigabytes costs copies, not random numbers.
inline void fill_random(backend::Backend& be, const tensor::Tensor& t, uint64_t seed,
                        int64_t id_limit = 0) {
  constexpr int64_t kPool = int64_t{1} << 22;
  const int64_t n = t.numel();
  const int64_t pool_n = std::min(n, kPool);
  const size_t elem = tensor::dtype_size(t.dtype);
  std::vector<unsigned char> pool(static_cast<size_t>(pool_n) * elem);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> magnitude(0.05f, 1.0f);
  for (int64_t i = 0; i < pool_n; ++i) {
    unsigned char* p = pool.data() + static_cast<size_t>(i) * elem;
    if (t.dtype == tensor::DType::i32) {
      if (id_limit < 1) throw std::invalid_argument("fill_random: an i32 tensor needs id_limit");
      const int32_t id = static_cast<int32_t>(rng() % static_cast<uint64_t>(id_limit));
      std::memcpy(p, &id, 4);
      continue;
    }
    const float v = (rng() & 1 ? -1.0f : 1.0f) * magnitude(rng);
    if (t.dtype == tensor::DType::f32) {
      std::memcpy(p, &v, 4);
    } else if (t.dtype == tensor::DType::bf16) {
      const uint16_t bits = tensor::to_bf16(v).bits;
      std::memcpy(p, &bits, 2);
    } else if (t.dtype == tensor::DType::f16) {
      const uint16_t bits = tensor::to_f16(v).bits;
      std::memcpy(p, &bits, 2);
    } else {
      throw std::invalid_argument(
          fmt::format("fill_random: dtype {} is not filled here", tensor::dtype_name(t.dtype)));
    }
  }
  (void)be;
  for (int64_t at = 0; at < n; at += pool_n) {
    const int64_t count = std::min(pool_n, n - at);
    check(cudaMemcpy(static_cast<unsigned char*>(t.data) + static_cast<size_t>(at) * elem,
                     pool.data(), static_cast<size_t>(count) * elem, cudaMemcpyHostToDevice),
          "cudaMemcpy (random fill)");
  }
}

struct Ceilings {
  double copy_bytes_per_s = 0;  // device-to-device copy, bytes read + bytes written
  double gemm_flops = 0;        // bf16 GEMM (fp32 accumulation) through Backend::gemm
  double fp8_gemm_flops = 0;    // e4m3 x e4m3 -> bf16, quantization included
  int64_t gemm_size = 0;
};

// cudaMemcpyAsync of a 2 GiB buffer (far beyond the 60 MB L2), counting read + written bytes.
inline double measure_copy_bandwidth(backend::cuda::CudaBackend& be) {
  const size_t bytes = size_t{2} << 30;
  backend::Allocation src = be.allocate(bytes), dst = be.allocate(bytes);
  fill_random(be, src.view(tensor::DType::f32, {static_cast<int64_t>(bytes / 4)}), 7);
  const cudaStream_t stream = stream_of(be);
  const double ms = median_ms(stream, [&](int) {
    check(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync");
  });
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
}

// C = A B^T with bf16 A, B, C of size x size (cuBLASLt, fp32 accumulation), random data. fp8:
// both operands e4m3 (GemmArgs fp8_a/fp8_b), so the rate includes the backend's per-call amax and
// quantization of A and B ("current scaling"), as a training step pays it.
inline double measure_gemm_flops(backend::cuda::CudaBackend& be, int64_t size, bool fp8 = false) {
  const int64_t n = size * size;
  backend::Allocation a = be.allocate(static_cast<size_t>(n) * 2),
                      b = be.allocate(static_cast<size_t>(n) * 2),
                      c = be.allocate(static_cast<size_t>(n) * 2);
  backend::GemmArgs g;
  g.a = a.view(tensor::DType::bf16, {size, size});
  g.b = b.view(tensor::DType::bf16, {size, size});
  g.c = c.view(tensor::DType::bf16, {size, size});
  fill_random(be, g.a, 11);
  fill_random(be, g.b, 12);
  g.trans_b = true;
  g.m = g.n = g.k = size;
  if (fp8) g.fp8_a = g.fp8_b = tensor::DType::e4m3;
  const double ms = median_ms(
      stream_of(be), [&](int) { be.gemm(g); }, 3, 7, 3);
  return 2.0 * static_cast<double>(size) * size * size / (ms * 1e-3);
}

inline Ceilings measure_ceilings(backend::cuda::CudaBackend& be, int64_t gemm_size = 8192) {
  Ceilings c;
  c.copy_bytes_per_s = measure_copy_bandwidth(be);
  c.gemm_flops = measure_gemm_flops(be, gemm_size);
  c.fp8_gemm_flops = measure_gemm_flops(be, gemm_size, true);
  c.gemm_size = gemm_size;
  return c;
}

}  // namespace trainctl::gpu_bench
