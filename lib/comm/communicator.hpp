// Communicator: the collectives of one process group (c10d's Backend + ProcessGroup in one).
// GlooCommunicator implements it for CPU ranks, NcclCommunicator for GPU ranks, which is why
// buffers are raw pointers with explicit counts (device pointers fit).
//
// Contract shared by every implementation:
//  - Calls are blocking and collective: every member calls the same ops in the same order with
//    matching sizes. Reductions take an element count and a dtype; data movement takes bytes.
//  - `timeout` of 0 (the default) means the group's timeout. A call that does not finish in time,
//    or whose peer dies, throws CommError naming the op, the group, its size, this rank and the
//    peer when known. After such an error the communicator is broken: every later call throws at
//    once.
//  - Sums are deterministic: the same inputs give bit-identical outputs on every run and on every
//    rank (Gloo's ring all-reduce adds in a fixed order for a fixed group size; reduce_scatter adds
//    the chunks in rank order 0, 1, ..., size-1). Results still differ from a single-rank sum in
//    the last bits, because the order differs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "tensor/dtype.hpp"

namespace trainctl::comm {

using tensor::DType;

// A send under way (Communicator::isend). wait() returns once the data has left the caller's
// buffer for the peer and throws as send would; the destructor waits too, swallowing errors (the
// group is broken then, and its next call says so). It must not outlive its communicator.
class PendingSend {
 public:
  virtual ~PendingSend() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  static constexpr std::chrono::milliseconds kGroupTimeout{0};

  virtual ~Communicator() = default;

  virtual const std::string& name() const = 0;  // "dp", "tp", "world", ...
  virtual int rank() const = 0;                 // this process's rank within the group
  virtual int size() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // data[count] <- sum over ranks, in place. f32 and f64 natively; bf16 and f16 are summed in f32
  // and rounded once at the end.
  virtual void all_reduce_sum(void* data, size_t count, DType dtype,
                              std::chrono::milliseconds timeout = kGroupTimeout) = 0;
  // data[count] <- element-wise max over ranks, in place; f32 and f64 (exact, order-free). A NaN
  // may or may not win, so reduce magnitudes that map NaN to +inf (Backend::amax does).
  virtual void all_reduce_max(void* data, size_t count, DType dtype,
                              std::chrono::milliseconds timeout = kGroupTimeout) = 0;
  // input[size*count] holds one chunk per rank; output[count] <- sum over ranks of their chunk
  // rank(), added in rank order.
  virtual void reduce_scatter_sum(const void* input, void* output, size_t count, DType dtype,
                                  std::chrono::milliseconds timeout = kGroupTimeout) = 0;
  // Uneven reduce_scatter: input holds size() chunks packed in rank order, chunk r of counts[r]
  // elements; output[counts[rank()]] <- sum over ranks of their chunk rank(), added in rank order
  // (bit-identical to reduce_scatter_sum when the counts are equal). Every rank passes the same
  // counts. Used by ZeRO-1, whose parts end at parameter-row boundaries. Zero-length parts are
  // allowed. A wrong number of counts is a usage error; counts that differ between ranks cannot
  // be seen locally, and Gloo aborts the process that receives more bytes than it expected, so
  // derive them on every rank from the same layout.
  virtual void reduce_scatter_sum_v(const void* input, void* output, std::span<const size_t> counts,
                                    DType dtype,
                                    std::chrono::milliseconds timeout = kGroupTimeout) = 0;
  // Uneven all_gather: output holds size() chunks packed in rank order, chunk r of bytes[r] bytes
  // from rank r; input is this rank's bytes[rank()] bytes. Every rank passes the same bytes.
  virtual void all_gather_v(const void* input, void* output, std::span<const size_t> bytes,
                            std::chrono::milliseconds timeout = kGroupTimeout) = 0;
  // output[size*bytes]: chunk r is rank r's input[bytes].
  virtual void all_gather(const void* input, void* output, size_t bytes,
                          std::chrono::milliseconds timeout = kGroupTimeout) = 0;
  // input and output hold size() chunks of `bytes`; chunk r of input goes to rank r, chunk r of
  // output came from rank r.
  virtual void all_to_all(const void* input, void* output, size_t bytes,
                          std::chrono::milliseconds timeout = kGroupTimeout) = 0;
  // Uneven all_to_all: send_bytes[r] bytes (packed in rank order in input) go to rank r;
  // recv_bytes[r] bytes come from rank r, packed in rank order in output. Each pair of ranks must
  // agree: my send_bytes[r] == rank r's recv_bytes[me].
  virtual void all_to_allv(const void* input, std::span<const size_t> send_bytes, void* output,
                           std::span<const size_t> recv_bytes,
                           std::chrono::milliseconds timeout = kGroupTimeout) = 0;
  // Point to point; a send matches the recv with the same peer pair and tag.
  virtual void send(const void* data, size_t bytes, int peer, uint32_t tag,
                    std::chrono::milliseconds timeout = kGroupTimeout) = 0;
  virtual void recv(void* data, size_t bytes, int peer, uint32_t tag,
                    std::chrono::milliseconds timeout = kGroupTimeout) = 0;
  // A send that runs while the caller goes on (buffered: the caller need not wait for the peer's
  // receive); `data` must stay unchanged until the handle's wait() returns. Gloo posts it and
  // returns; the default (NCCL, whose sends share the group's stream with its receives, and the
  // one-rank group) sends before returning, so a caller's order must also work unbuffered.
  virtual std::unique_ptr<PendingSend> isend(const void* data, size_t bytes, int peer, uint32_t tag,
                                             std::chrono::milliseconds timeout = kGroupTimeout);
  // data[bytes] <- root's data[bytes].
  virtual void broadcast(void* data, size_t bytes, int root,
                         std::chrono::milliseconds timeout = kGroupTimeout) = 0;
  virtual void barrier(std::chrono::milliseconds timeout = kGroupTimeout) = 0;
  // Host memory the communicator keeps between calls for its own staging (Gloo's receive buffer
  // of reduce-scatters, its f32 copy of 16-bit all-reduces); 0 when it keeps none. Thread-safe.
  virtual size_t buffer_bytes() const { return 0; }

  // Typed conveniences over the calls above.
  void all_reduce_sum(std::span<float> data) {
    all_reduce_sum(data.data(), data.size(), DType::f32);
  }
  void all_reduce_sum(std::span<double> data) {
    all_reduce_sum(data.data(), data.size(), DType::f64);
  }
};

// "all_reduce on group dp (4 ranks, rank 1)": the prefix every error of a group starts with.
std::string describe_call(const std::string& op, const Communicator& communicator);

// The usage checks every implementation makes before any traffic; each throws CommError
// (Kind::usage) starting with describe_call(op, communicator).
// dtype is one a reduction can sum: f32, f64, bf16, f16.
void check_sum_dtype(const char* op, const Communicator& communicator, DType dtype);
// all_reduce_max's dtypes: f32 or f64.
void check_max_dtype(const char* op, const Communicator& communicator, DType dtype);
// One entry of `what` per rank of the group.
void check_counts(const char* op, const Communicator& communicator, std::span<const size_t> counts,
                  const char* what);
// peer is a member of the group (and, unless self_ok, not this rank).
void check_peer(const char* op, const Communicator& communicator, int peer, bool self_ok = false);

}  // namespace trainctl::comm
