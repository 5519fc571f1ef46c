// Checking CUDA calls. Every runtime call and every kernel launch goes through one of these, so a
// failure names the statement, the file and the line instead of surfacing later as a wrong number.
//
//   TRAINCTL_CUDA_CHECK(stmt)   host code: throws trainctl::kernels::CudaError on failure. The
//                               error keeps the cudaError_t so a caller can act on, e.g., out of
//                               memory (a recoverable condition) instead of parsing the message.
//   TRAINCTL_CUDA_RETURN(stmt)  launch wrappers that report by value: returns the cudaError_t from
//                               the enclosing function when stmt fails.
//
// The last-error state is cleared on failure (cudaGetLastError), so one failure is reported once.
// Includable from host C++ (g++) and from .cu files; keeps to light standard headers.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace trainctl::kernels {

class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

// "error 2 cudaErrorMemoryAllocation (out of memory)": the number, the name and the text.
inline std::string describe_cuda_error(cudaError_t code) {
  return "error " + std::to_string(static_cast<int>(code)) + " " + cudaGetErrorName(code) + " (" +
         cudaGetErrorString(code) + ")";
}

[[noreturn]] inline void throw_cuda_error(cudaError_t code, const char* statement, const char* file,
                                          int line) {
  throw CudaError(code, std::string("CUDA ") + describe_cuda_error(code) + " in `" + statement +
                            "` at " + file + ":" + std::to_string(line));
}

}  // namespace trainctl::kernels

#define TRAINCTL_CUDA_CHECK(statement)                                                   \
  do {                                                                                   \
    const cudaError_t trainctl_cuda_status_ = (statement);                               \
    if (trainctl_cuda_status_ != cudaSuccess) {                                          \
      (void)cudaGetLastError();                                                          \
      ::trainctl::kernels::throw_cuda_error(trainctl_cuda_status_, #statement, __FILE__, \
                                            __LINE__);                                   \
    }                                                                                    \
  } while (0)

#define TRAINCTL_CUDA_RETURN(statement)                    \
  do {                                                     \
    const cudaError_t trainctl_cuda_status_ = (statement); \
    if (trainctl_cuda_status_ != cudaSuccess) {            \
      (void)cudaGetLastError();                            \
      return trainctl_cuda_status_;                        \
    }                                                      \
  } while (0)
