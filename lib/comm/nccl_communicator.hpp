// The NCCL Communicator: the GPU twin of GlooCommunicator, same contract (communicator.hpp), with
// buffers on the communicator's GPU (host buffers are staged through device memory; see
// create_nccl_communicator).
//
// Timeouts without a hang: NCCL's blocking calls can wait forever for a peer that never joins.
// The communicator is created non-blocking (ncclConfig_t::blocking = 0), so ncclCommInitRankConfig
// and every enqueue return at once; each call then polls for completion (cudaStreamQuery on the
// communicator's own stream plus ncclCommGetAsyncError) until it is done, fails or its timeout
// passes. On a timeout or an asynchronous error the communicator is aborted (ncclCommAbort, which
// also stops the kernels stuck in the collective) and the call throws CommError; every later call
// throws at once. NCCL cannot say which peer is silent, so a timeout says "a peer did not join the
// collective" and CommError::peer() is -1. There is no process-wide watchdog thread: each call
// watches itself, which is enough because calls are blocking.
//
// The wait-and-abort logic is PendingOp below, kept free of CUDA so it is tested on any machine
// with fake poll and abort functions.
//
// Builds without NCCL (no CUDA toolkit or no libnccl at configure time) keep this header;
// nccl_available() is then false and create_nccl_communicator throws CommError (Kind::usage)
// saying so, so callers never need #if.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "comm/error.hpp"
#include "comm/gloo_communicator.hpp"
#include "comm/store.hpp"

namespace trainctl::comm {

// True when this build has NCCL compiled in (it may still find no GPU at run time).
bool nccl_available();
// The NCCL library's version, "2.21.5"; "" without NCCL.
std::string nccl_version();

// Joins a group over NCCL on GPU `cuda_device` (this process's local rank's GPU). Collective like
// create_gloo_communicator: every member calls it with the same name and size and a store private
// to this group (Mesh gives each group a PrefixStore). Rank 0 creates the ncclUniqueId and puts it
// under "trainctl/nccl_id"; the others get it within options.timeout (CommError, Kind::timeout,
// when rank 0 never publishes it), then NCCL's own rendezvous must finish within the same timeout
// or the half-made communicator is aborted (CommError, Kind::timeout).
// A one-rank group is a real NCCL communicator too (its buffers are device pointers, which the
// host-memory local communicator cannot copy). options.device (the Gloo device) is ignored.
//
// deterministic: sets NCCL_ALGO=Ring and NCCL_PROTO=Simple in the environment before NCCL reads
// it (only where the user has not set them; NCCL reads them once per process, so the first
// communicator of the process decides). See docs/comm.md, "NCCL".
//
// Buffers: device pointers on `cuda_device`, or host memory (a scalar, a few counts), which is
// staged through a device buffer of the communicator (copied in before the collective and out
// after it; the buffer grows to the largest host call and is kept). The collective runs on the
// communicator's own stream and the call returns when it has completed, outputs included.
//
// producer_stream (a cudaStream_t, or null): the stream that writes the device buffers handed to
// this communicator (the backend's, Backend::stream()). Each call first makes the communicator's
// stream wait for everything enqueued on it so far (an event recorded there), so a buffer an op
// just wrote is complete before NCCL reads it, with no host wait. Null: the caller makes inputs
// complete before the call (Backend::fence(), as the background gradient reduction does).
std::unique_ptr<Communicator> create_nccl_communicator(Store& store, const GroupOptions& options,
                                                       int cuda_device, bool deterministic = false,
                                                       void* producer_stream = nullptr);

// The result of one poll of an operation in flight.
struct PollResult {
  bool done = false;  // completed successfully
  std::string error;  // non-empty: failed asynchronously (the text says how)
};

// One enqueued NCCL operation being waited for. wait() calls poll() until it reports done or an
// error, or until `timeout` has passed since construction. On an error or a timeout it calls
// abort() (exactly once, even when wait() is called again) and throws CommError naming the op and
// the call: Kind::timeout ("timed out after N ms; a peer did not join the collective") or
// Kind::io (the poll's error text). Between polls it yields the CPU, then sleeps for growing
// intervals up to 1 ms, so a long collective does not burn a core. `now` is the clock the
// timeout is measured on (steady_clock; tests pass a clock they advance themselves).
class PendingOp {
 public:
  using Poll = std::function<PollResult()>;
  using Abort = std::function<void()>;
  using Now = std::function<std::chrono::steady_clock::time_point()>;

  // op: "all_reduce", ...; call: describe_call(op, communicator), the prefix of every message.
  PendingOp(std::string op, std::string call, std::chrono::milliseconds timeout, Poll poll,
            Abort abort, Now now = std::chrono::steady_clock::now);

  void wait();

 private:
  [[noreturn]] void fail(CommError error);

  std::string op_;
  std::string call_;
  std::chrono::milliseconds timeout_;
  Now now_;
  std::chrono::steady_clock::time_point start_;
  Poll poll_;
  Abort abort_;
  bool aborted_ = false;
};

}  // namespace trainctl::comm
