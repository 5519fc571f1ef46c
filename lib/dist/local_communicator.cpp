// The one-rank communicator (tp=1, pp=1, ... groups) and describe_call().
#include <algorithm>
#include <cstring>
#include <vector>

#include "dist/error.hpp"
#include "dist/gloo_communicator.hpp"

namespace trainctl::dist {

std::string describe_call(const std::string& op, const Communicator& communicator) {
  return op + " on group " + communicator.name() + " (" + std::to_string(communicator.size()) +
         (communicator.size() == 1 ? " rank" : " ranks") + ", this is rank " +
         std::to_string(communicator.rank()) + ")";
}

void Communicator::reduce_scatter_sum_v(const void* input, void* output,
                                        std::span<const size_t> counts, DType dtype,
                                        std::chrono::milliseconds timeout) {
  if (counts.size() != static_cast<size_t>(size()))
    throw DistError(DistError::Kind::usage,
                    describe_call("reduce_scatter_v", *this) + ": got " +
                        std::to_string(counts.size()) + " element counts; pass one per rank (" +
                        std::to_string(size()) + ")",
                    "reduce_scatter_v");
  size_t total = 0, before = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (r == static_cast<size_t>(rank())) before = total;
    total += counts[r];
  }
  const size_t item = tensor::dtype_size(dtype);
  std::vector<char> whole(total * item);
  std::memcpy(whole.data(), input, whole.size());
  all_reduce_sum(whole.data(), total, dtype, timeout);
  std::memcpy(output, whole.data() + before * item, counts[static_cast<size_t>(rank())] * item);
}

void Communicator::all_gather_v(const void* input, void* output, std::span<const size_t> bytes,
                                std::chrono::milliseconds timeout) {
  if (bytes.size() != static_cast<size_t>(size()))
    throw DistError(DistError::Kind::usage,
                    describe_call("all_gather_v", *this) + ": got " + std::to_string(bytes.size()) +
                        " byte counts; pass one per rank (" + std::to_string(size()) + ")",
                    "all_gather_v");
  size_t largest = 0;
  for (size_t b : bytes)
    largest = std::max(largest, b);
  std::vector<char> mine(largest), all(largest * bytes.size());
  std::memcpy(mine.data(), input, bytes[static_cast<size_t>(rank())]);
  all_gather(mine.data(), all.data(), largest, timeout);
  char* out = static_cast<char*>(output);
  for (size_t r = 0; r < bytes.size(); ++r) {
    std::memcpy(out, all.data() + r * largest, bytes[r]);
    out += bytes[r];
  }
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
    check_sum_dtype("all_reduce", dtype);
  }
  void reduce_scatter_sum(const void* input, void* output, size_t count, DType dtype,
                          std::chrono::milliseconds) override {
    check_sum_dtype("reduce_scatter", dtype);
    copy(input, output, count * tensor::dtype_size(dtype));
  }
  void reduce_scatter_sum_v(const void* input, void* output, std::span<const size_t> counts,
                            DType dtype, std::chrono::milliseconds) override {
    check_sum_dtype("reduce_scatter_v", dtype);
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
      throw DistError(DistError::Kind::usage,
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
  void check_sum_dtype(const char* op, DType dtype) const {
    if (dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16 || dtype == DType::f16)
      return;
    throw DistError(DistError::Kind::usage,
                    describe_call(op, *this) + ": cannot sum " +
                        std::string(tensor::dtype_name(dtype)) + "; use f32, f64, bf16 or f16",
                    op);
  }
  void check_one_count(const char* op, std::span<const size_t> counts, const char* what) const {
    if (counts.size() == 1) return;
    throw DistError(DistError::Kind::usage,
                    describe_call(op, *this) + ": got " + std::to_string(counts.size()) + " " +
                        what + "; a group of one rank takes exactly one",
                    op);
  }
  [[noreturn]] void no_peer(const char* op, int peer) const {
    throw DistError(DistError::Kind::usage,
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

}  // namespace trainctl::dist
