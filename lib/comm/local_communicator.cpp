// The one-rank communicator (tp=1, pp=1, ... groups), describe_call() and the usage checks every
// communicator makes before any traffic.
#include <cstring>

#include "comm/error.hpp"
#include "comm/gloo_communicator.hpp"

namespace trainctl::comm {

namespace {

class CompletedSend final : public PendingSend {
 public:
  void wait() override {}
};

}  // namespace

std::unique_ptr<PendingSend> Communicator::isend(const void* data, size_t bytes, int peer,
                                                 uint32_t tag, std::chrono::milliseconds timeout) {
  send(data, bytes, peer, tag, timeout);
  return std::make_unique<CompletedSend>();
}

std::string describe_call(const std::string& op, const Communicator& communicator) {
  return op + " on group " + communicator.name() + " (" + std::to_string(communicator.size()) +
         (communicator.size() == 1 ? " rank" : " ranks") + ", this is rank " +
         std::to_string(communicator.rank()) + ")";
}

void check_sum_dtype(const char* op, const Communicator& communicator, DType dtype) {
  if (dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16 || dtype == DType::f16)
    return;
  throw CommError(CommError::Kind::usage,
                  describe_call(op, communicator) + ": cannot sum " +
                      std::string(tensor::dtype_name(dtype)) + "; use f32, f64, bf16 or f16",
                  op);
}

void check_max_dtype(const char* op, const Communicator& communicator, DType dtype) {
  if (dtype == DType::f32 || dtype == DType::f64) return;
  throw CommError(CommError::Kind::usage,
                  describe_call(op, communicator) + ": cannot take the max of " +
                      std::string(tensor::dtype_name(dtype)) + "; use f32 or f64",
                  op);
}

void check_counts(const char* op, const Communicator& communicator, std::span<const size_t> counts,
                  const char* what) {
  if (counts.size() == static_cast<size_t>(communicator.size())) return;
  throw CommError(CommError::Kind::usage,
                  describe_call(op, communicator) + ": got " + std::to_string(counts.size()) + " " +
                      what + "; pass one per rank (" + std::to_string(communicator.size()) + ")",
                  op);
}

void check_peer(const char* op, const Communicator& communicator, int peer, bool self_ok) {
  const int rank = communicator.rank(), size = communicator.size();
  if (peer >= 0 && peer < size && (self_ok || peer != rank)) return;
  throw CommError(CommError::Kind::usage,
                  describe_call(op, communicator) + ": peer " + std::to_string(peer) +
                      (peer == rank ? " is this rank" : " is not a member") +
                      "; use a rank in 0.." + std::to_string(size - 1) +
                      (self_ok ? "" : " other than this one"),
                  op, peer);
}

namespace {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::string name, std::chrono::milliseconds timeout)
      : name_(std::move(name)), timeout_(timeout) {}

  const std::string& name() const override { return name_; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void all_reduce_sum(void*, size_t, DType dtype, std::chrono::milliseconds) override {
    check_sum_dtype("all_reduce", *this, dtype);
  }
  void all_reduce_max(void*, size_t, DType dtype, std::chrono::milliseconds) override {
    check_max_dtype("all_reduce_max", *this, dtype);
  }
  void reduce_scatter_sum(const void* input, void* output, size_t count, DType dtype,
                          std::chrono::milliseconds) override {
    check_sum_dtype("reduce_scatter", *this, dtype);
    copy(input, output, count * tensor::dtype_size(dtype));
  }
  void reduce_scatter_sum_v(const void* input, void* output, std::span<const size_t> counts,
                            DType dtype, std::chrono::milliseconds) override {
    check_sum_dtype("reduce_scatter_v", *this, dtype);
    check_one_count("reduce_scatter_v", counts, "element counts");
    copy(input, output, counts[0] * tensor::dtype_size(dtype));
  }
  void all_gather(const void* input, void* output, size_t bytes,
                  std::chrono::milliseconds) override {
    copy(input, output, bytes);
  }
  void all_gather_v(const void* input, void* output, std::span<const size_t> bytes,
                    std::chrono::milliseconds) override {
    check_one_count("all_gather_v", bytes, "byte counts");
    copy(input, output, bytes[0]);
  }
  void all_to_all(const void* input, void* output, size_t bytes,
                  std::chrono::milliseconds) override {
    copy(input, output, bytes);
  }
  void all_to_allv(const void* input, std::span<const size_t> send_bytes, void* output,
                   std::span<const size_t> recv_bytes, std::chrono::milliseconds) override {
    if (send_bytes.size() != 1 || recv_bytes.size() != 1 || send_bytes[0] != recv_bytes[0]) {
      throw CommError(CommError::Kind::usage,
                      describe_call("all_to_allv", *this) +
                          ": needs one send and one receive count, and they must be equal",
                      "all_to_allv");
    }
    copy(input, output, send_bytes[0]);
  }
  void send(const void*, size_t, int peer, uint32_t, std::chrono::milliseconds) override {
    no_peer("send", peer);
  }
  void recv(void*, size_t, int peer, uint32_t, std::chrono::milliseconds) override {
    no_peer("recv", peer);
  }
  void broadcast(void*, size_t, int root, std::chrono::milliseconds) override {
    if (root != 0) no_peer("broadcast", root);
  }
  void barrier(std::chrono::milliseconds) override {}

 private:
  static void copy(const void* input, void* output, size_t bytes) {
    if (bytes > 0 && input != output) std::memmove(output, input, bytes);
  }
  void check_one_count(const char* op, std::span<const size_t> counts, const char* what) const {
    if (counts.size() == 1) return;
    throw CommError(CommError::Kind::usage,
                    describe_call(op, *this) + ": got " + std::to_string(counts.size()) + " " +
                        what + "; a group of one rank takes exactly one",
                    op);
  }
  [[noreturn]] void no_peer(const char* op, int peer) const {
    throw CommError(CommError::Kind::usage,
                    describe_call(op, *this) + ": peer " + std::to_string(peer) +
                        " does not exist in a group of one rank",
                    op, peer);
  }

  std::string name_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::unique_ptr<Communicator> create_local_communicator(std::string name,
                                                        std::chrono::milliseconds timeout) {
  return std::make_unique<LocalCommunicator>(std::move(name), timeout);
}

}  // namespace trainctl::comm
