// The build without NCCL (no CUDA toolkit or no libnccl at configure time): the same header, a
// factory that says why it cannot work.
#include "comm/error.hpp"
#include "comm/nccl_communicator.hpp"

namespace trainctl::comm {

bool nccl_available() {
  return false;
}

std::string nccl_version() {
  return "";
}

std::unique_ptr<Communicator> create_nccl_communicator(Store& /*store*/,
                                                       const GroupOptions& options, int cuda_device,
                                                       bool /*deterministic*/,
                                                       void* /*producer_stream*/) {
  throw CommError(CommError::Kind::usage,
                  "group " + options.name + ": cannot create an NCCL communicator on GPU " +
                      std::to_string(cuda_device) +
                      ": this build has no NCCL (CUDA toolkit or libnccl not found at configure "
                      "time); rebuild where both are present, or use the gloo backend",
                  "rendezvous");
}

}  // namespace trainctl::comm
