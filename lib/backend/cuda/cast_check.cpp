// gpu_cast_roundtrip_check (declared in device.hpp): the cast kernels against the CPU reference,
// bit for bit. Lives in the library, not only in tests/gpu, so scripts on a GPU machine and
// `trainctl` diagnostics can run the same proof.
//
// Inputs are fresh random values each run (the seed is reported for reproduction) mixed with
// the cases rounding gets wrong: exact ties for bf16 and fp16, fp16 subnormals, overflow edges,
// infinities, NaN with payloads, and every 16-bit pattern for the widening casts. Each cast runs
// with aligned pointers (vector path; n not a multiple of 8, so the tail runs too) and with
// unaligned ones (scalar path). Output buffers are poisoned first and guard elements around the
// written range must stay poisoned.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/device.hpp"
#include "kernels/cast.cuh"
#include "kernels/check.cuh"
#include "tensor/dtype.hpp"

namespace trainctl::backend {

namespace {

constexpr size_t kNumRandom = (size_t{1} << 20) + 13;  // not a multiple of 8: the tail runs too
constexpr size_t kGuard = 16;                          // poisoned elements around the output
constexpr int kPoisonByte = 0xA5;

// Device memory that frees itself, so a failing check does not leak.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { TRAINCTL_CUDA_CHECK(cudaMalloc(&data_, bytes)); }
  ~DeviceBuffer() { (void)cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
};

template <class T>
uint32_t bits_of(T value) {
  if constexpr (sizeof(T) == 4) {
    uint32_t bits = 0;
    std::memcpy(&bits, &value, 4);
    return bits;
  } else {
    return value;
  }
}

float float_from_bits(uint32_t bits) {
  float value = 0;
  std::memcpy(&value, &bits, 4);
  return value;
}

std::string hex(uint32_t bits) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", bits);
  return text;
}

// Random floats biased towards the cases rounding gets wrong.
std::vector<float> make_float_inputs(std::mt19937_64& rng) {
  const float specials[] = {0.0f,          -0.0f,        INFINITY,      -INFINITY,    NAN,
                            -NAN,          65504.0f,     65519.996f,    65520.0f,     -65520.0f,
                            FLT_MAX,       -FLT_MAX,     FLT_MIN,       FLT_TRUE_MIN, 5.9604645e-8f,
                            2.9802322e-8f, 8.940697e-8f, 6.1035156e-5f, 1.0f,         -1.0f};
  std::vector<float> values(kNumRandom);
  std::uniform_real_distribution<float> wide(-70000.0f, 70000.0f);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint64_t r = rng();
    auto low = static_cast<uint32_t>(r);
    const auto high = static_cast<uint32_t>(r >> 32);
    switch (high % 8) {
      case 0:
      case 1:
      case 2:  // any bit pattern: normals, subnormals, inf, NaN payloads
        break;
      case 3:
        low = bits_of(wide(rng));
        break;
      case 4:  // bf16 tie: exactly halfway between two bf16 values
        low = (low & 0xffff0000u) | 0x8000u;
        break;
      case 5:  // fp16 tie in the fp16 normal range (exponents 2^-14 .. 2^15)
        low = (low & 0x807fe000u) | ((113u + (high >> 8) % 30u) << 23) | 0x1000u;
        break;
      case 6:  // fp16 subnormal range, 2^-25 .. 2^-14
        low = (low & 0x807fffffu) | ((102u + (high >> 8) % 11u) << 23);
        break;
      default:
        low = bits_of(specials[(high >> 8) % (sizeof(specials) / sizeof(specials[0]))]);
        break;
    }
    values[i] = float_from_bits(low);
  }
  return values;
}

// Every 16-bit pattern, then random ones.
std::vector<uint16_t> make_half_inputs(std::mt19937_64& rng) {
  std::vector<uint16_t> values(kNumRandom);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = i < 65536 ? static_cast<uint16_t>(i) : static_cast<uint16_t>(rng());
  }
  return values;
}

// Runs one cast at the given element offsets and compares with reference(). Returns "" when the
// output matches bit for bit and the guard elements are untouched, else what went wrong.
template <class In, class Out, class Launch, class Reference>
std::string check_cast(const char* name, const std::vector<In>& input, size_t in_offset,
                       size_t out_offset, Launch launch, Reference reference) {
  const size_t n = input.size();
  const size_t out_count = out_offset + n + kGuard;
  DeviceBuffer device_in((in_offset + n) * sizeof(In));
  DeviceBuffer device_out(out_count * sizeof(Out));
  In* in = device_in.as<In>() + in_offset;
  Out* out = device_out.as<Out>() + out_offset;
  TRAINCTL_CUDA_CHECK(cudaMemcpy(in, input.data(), n * sizeof(In), cudaMemcpyHostToDevice));
  TRAINCTL_CUDA_CHECK(cudaMemset(device_out.as<Out>(), kPoisonByte, out_count * sizeof(Out)));
  TRAINCTL_CUDA_CHECK(launch(in, out, static_cast<int64_t>(n), cudaStream_t{nullptr}));
  TRAINCTL_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<Out> output(out_count);
  TRAINCTL_CUDA_CHECK(cudaMemcpy(output.data(), device_out.as<Out>(), out_count * sizeof(Out),
                                 cudaMemcpyDeviceToHost));

  Out poison;
  std::memset(&poison, kPoisonByte, sizeof(Out));
  const std::string where = std::string(name) + " (in offset " + std::to_string(in_offset) +
                            ", out offset " + std::to_string(out_offset) + ")";
  for (size_t i = 0; i < out_count; ++i) {
    const bool inside = i >= out_offset && i < out_offset + n;
    if (!inside && bits_of(output[i]) != bits_of(poison)) {
      return where + ": wrote outside its range, at output element " + std::to_string(i);
    }
  }
  size_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t expected = bits_of(reference(input[i]));
    const uint32_t got = bits_of(output[out_offset + i]);
    if (expected != got && mismatches++ == 0) {
      first = "element " + std::to_string(i) + ": input " + hex(bits_of(input[i])) + ", GPU " +
              hex(got) + ", CPU " + hex(expected);
    }
  }
  if (mismatches > 0) {
    return where + ": " + std::to_string(mismatches) + " of " + std::to_string(n) +
           " differ from the CPU; first " + first;
  }
  return "";
}

template <class In, class Out, class Launch, class Reference>
std::string check_all_offsets(const char* name, const std::vector<In>& input, Launch launch,
                              Reference reference) {
  const size_t offsets[][2] = {{0, 0}, {1, 1}, {0, 3}, {5, 0}};
  for (const auto& offset : offsets) {
    std::string problem = check_cast<In, Out>(name, input, offset[0], offset[1], launch, reference);
    if (!problem.empty()) return problem;
  }
  return "";
}

// Effective bandwidth (bytes read + written per second) of an fp32 -> bf16 cast of 64 Mi
// elements, timed with CUDA events after a warm-up. Reported, not asserted.
std::string measure_bandwidth() {
  constexpr int64_t kElements = int64_t{1} << 26;
  constexpr int kRepeats = 20;
  DeviceBuffer in(kElements * sizeof(float));
  DeviceBuffer out(kElements * sizeof(uint16_t));
  TRAINCTL_CUDA_CHECK(cudaMemset(in.as<float>(), 0x3f, kElements * sizeof(float)));
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  TRAINCTL_CUDA_CHECK(cudaEventCreate(&start));
  TRAINCTL_CUDA_CHECK(cudaEventCreate(&stop));
  float milliseconds = 0;
  try {
    for (int i = 0; i < 3; ++i) {
      TRAINCTL_CUDA_CHECK(
          kernels::launch_cast_f32_to_bf16(in.as<float>(), out.as<uint16_t>(), kElements, nullptr));
    }
    TRAINCTL_CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < kRepeats; ++i) {
      TRAINCTL_CUDA_CHECK(
          kernels::launch_cast_f32_to_bf16(in.as<float>(), out.as<uint16_t>(), kElements, nullptr));
    }
    TRAINCTL_CUDA_CHECK(cudaEventRecord(stop));
    TRAINCTL_CUDA_CHECK(cudaEventSynchronize(stop));
    TRAINCTL_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start, stop));
  } catch (...) {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    throw;
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  const double bytes =
      static_cast<double>(kElements) * (sizeof(float) + sizeof(uint16_t)) * kRepeats;
  char text[96];
  std::snprintf(text, sizeof(text), "f32->bf16 of 64Mi elements: %.0f GB/s",
                bytes / (milliseconds * 1e6));
  return text;
}

}  // namespace

bool gpu_cast_roundtrip_check(std::string* message) {
  std::string local;
  std::string& text = message != nullptr ? *message : local;
  const DeviceReport report = detect_gpus();
  if (report.gpus.empty()) {
    text = report.status;
    return false;
  }
  const uint64_t seed =
      std::random_device{}() * uint64_t{0x9e3779b97f4a7c15u} ^ std::random_device{}();
  const std::string seed_note = "seed " + std::to_string(seed);
  try {
    TRAINCTL_CUDA_CHECK(cudaSetDevice(report.gpus.front().index));
    std::mt19937_64 rng(seed);
    const std::vector<float> floats = make_float_inputs(rng);
    const std::vector<uint16_t> halves = make_half_inputs(rng);

    std::string problem =
        check_all_offsets<float, uint16_t>("f32->bf16", floats, kernels::launch_cast_f32_to_bf16,
                                           [](float v) { return tensor::to_bf16(v).bits; });
    if (problem.empty()) {
      problem =
          check_all_offsets<float, uint16_t>("f32->f16", floats, kernels::launch_cast_f32_to_f16,
                                             [](float v) { return tensor::to_f16(v).bits; });
    }
    if (problem.empty()) {
      problem = check_all_offsets<uint16_t, float>(
          "bf16->f32", halves, kernels::launch_cast_bf16_to_f32,
          [](uint16_t b) { return tensor::to_float(tensor::bf16{b}); });
    }
    if (problem.empty()) {
      problem = check_all_offsets<uint16_t, float>(
          "f16->f32", halves, kernels::launch_cast_f16_to_f32,
          [](uint16_t b) { return tensor::to_float(tensor::f16{b}); });
    }
    if (!problem.empty()) {
      text = problem + " (" + seed_note + ")";
      return false;
    }
    text = "cast kernels match the CPU bit for bit on " + report.gpus.front().name +
           ": f32->bf16, f32->f16, bf16->f32, f16->f32 (" + std::to_string(kNumRandom) +
           " inputs each, aligned and unaligned, " + seed_note + "); " + measure_bandwidth();
    return true;
  } catch (const std::exception& error) {
    text = std::string(error.what()) + " (" + seed_note + ")";
    return false;
  }
}

}  // namespace trainctl::backend
