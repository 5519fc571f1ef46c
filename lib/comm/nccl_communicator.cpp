// NcclCommunicator: Communicator over a non-blocking NCCL communicator (see the header for why
// non-blocking). Every call: stage host buffers in (Placement), make the communicator's stream
// wait for the producer stream (an event), enqueue, then PendingOp polls for completion, aborting
// on a timeout or an asynchronous error; only then are staged outputs copied back to the host, so
// a hung collective is never waited for inside a copy. The timeout therefore also covers the
// producer's work still queued when the call starts.
//
// The ops NCCL lacks are built from grouped NCCL calls (one launch, no padding, no scratch):
//  - reduce_scatter_sum_v: one ncclReduce per rank, root r receiving chunk r (equal counts take
//    ncclReduceScatter itself, so they stay bit-identical to reduce_scatter_sum);
//  - all_gather_v: one ncclBroadcast per rank, root r sending its part;
//  - all_to_all(v): an ncclSend and an ncclRecv per rank, this rank included.
#include <cuda_runtime.h>
#include <fmt/core.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "comm/error.hpp"
#include "comm/nccl_communicator.hpp"

namespace trainctl::comm {

bool nccl_available() {
  return true;
}

std::string nccl_version() {
  int code = 0;  // major * 10000 + minor * 100 + patch (NCCL >= 2.9)
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
}

namespace {

using std::chrono::milliseconds;

const char* const kIdKey = "trainctl/nccl_id";

// "NCCL error: unhandled system error (last error: ...)". ncclGetLastError is process-wide and
// may describe an older failure, so it is shown as context only.
std::string nccl_text(ncclResult_t result) {
  std::string text = std::string("NCCL error: ") + ncclGetErrorString(result);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += " (last NCCL message: " + std::string(last) + ")";
  return text;
}

std::string cuda_text(cudaError_t error, const char* call) {
  return std::string("CUDA error in ") + call + ": " + cudaGetErrorName(error) + " (" +
         cudaGetErrorString(error) + ")";
}

// Completion of whatever was enqueued last: NCCL's own state first (ncclInProgress while a
// non-blocking enqueue or init is still being processed), then the stream the kernels run on.
PollResult poll_comm(ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
  if (queried != ncclSuccess) return {false, nccl_text(queried)};
  if (state == ncclInProgress) return {false, {}};
  if (state != ncclSuccess) return {false, nccl_text(state)};
  if (stream == nullptr) return {true, {}};
  const cudaError_t done = cudaStreamQuery(stream);
  if (done == cudaSuccess) return {true, {}};
  if (done == cudaErrorNotReady) return {false, {}};
  return {false, cuda_text(done, "cudaStreamQuery")};
}

// True for memory NCCL cannot read as is: pageable host memory (cudaMemoryTypeUnregistered on
// CUDA 11+) and pinned host memory (cudaMemoryTypeHost). Device and managed memory are used in
// place.
bool is_host_memory(const void* pointer) {
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, pointer);
  if (status != cudaSuccess) {
    // Runtimes before CUDA 11 refuse unregistered host memory instead of classifying it.
    (void)cudaGetLastError();
    return true;
  }
  return attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged;
}

// One call's buffers as the caller passed them; a side of zero bytes is left untouched.
struct Buffers {
  const void* input = nullptr;
  size_t input_bytes = 0;
  void* output = nullptr;
  size_t output_bytes = 0;
};

// The buffers NCCL gets for one call: the caller's device pointers, or regions of the staging
// buffer for host memory. host_output non-null: output_bytes go back there after completion.
struct Placement {
  const void* input = nullptr;
  void* output = nullptr;
  void* host_output = nullptr;
  size_t output_bytes = 0;
};

// The staged output region starts on NCCL's preferred alignment.
constexpr size_t kStagingAlignment = 256;
// The first staging buffer is this large, so a run's scalars and counts never regrow it (a
// cudaFree may wait for the whole device).
constexpr size_t kMinStagingBytes = size_t{1} << 20;

// Runs ops between ncclGroupStart and ncclGroupEnd; the first failure wins, but the group is
// always closed so NCCL's group state is not left open.
template <class Ops>
ncclResult_t grouped(Ops&& ops) {
  const ncclResult_t started = ncclGroupStart();
  if (started != ncclSuccess) return started;
  const ncclResult_t queued = ops();
  const ncclResult_t ended = ncclGroupEnd();
  return queued != ncclSuccess ? queued : ended;
}

class NcclCommunicator final : public Communicator {
 public:
  // producer and ready: both null, or the producer stream and an event to record on it.
  NcclCommunicator(const GroupOptions& options, int device, ncclComm_t comm, cudaStream_t stream,
                   int* barrier_word, cudaStream_t producer, cudaEvent_t ready)
      : name_(options.name),
        rank_(options.rank),
        size_(options.size),
        timeout_(options.timeout),
        device_(device),
        comm_(comm),
        stream_(stream),
        barrier_word_(barrier_word),
        producer_(producer),
        ready_(ready) {}

  ~NcclCommunicator() override {
    (void)cudaSetDevice(device_);
    if (comm_ != nullptr) {
      // Finalize flushes and may wait on peers: give it the group timeout, then abort.
      const ncclResult_t finalizing = ncclCommFinalize(comm_);
      if (finalizing == ncclSuccess || finalizing == ncclInProgress) {
        try {
          PendingOp(
              "destroy", describe_call("destroy", *this), timeout_,
              [this] { return poll_comm(comm_, nullptr); }, [this] { abort(); })
              .wait();
        } catch (const CommError&) {
          // PendingOp has aborted the communicator; a destructor has no one to tell.
        }
      } else {
        abort();
      }
      if (comm_ != nullptr) (void)ncclCommDestroy(comm_);
    }
    if (barrier_word_ != nullptr) (void)cudaFree(barrier_word_);
    if (staging_ != nullptr) (void)cudaFree(staging_);
    if (ready_ != nullptr) (void)cudaEventDestroy(ready_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  const std::string& name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  milliseconds timeout() const override { return timeout_; }

  // NCCL sums bf16/f16 natively, rounding to the narrow type after each addition along its ring, so
  // with more than two ranks narrow sums may differ from Gloo's (f32 throughout, rounded once).
  void all_reduce_sum(void* data, size_t count, DType dtype, milliseconds timeout) override {
    const ncclDataType_t type = sum_type("all_reduce", dtype);
    if (count == 0) return;
    const size_t bytes = count * tensor::dtype_size(dtype);
    run("all_reduce", timeout, {data, bytes, data, bytes}, [&](const void* in, void* out) {
      return ncclAllReduce(in, out, count, type, ncclSum, comm_, stream_);
    });
  }

  // Max is exact and order-free, so NCCL's result equals Gloo's for any number of ranks.
  void all_reduce_max(void* data, size_t count, DType dtype, milliseconds timeout) override {
    check_max_dtype("all_reduce_max", *this, dtype);  // f32 or f64, like Gloo's
    const ncclDataType_t type = dtype == DType::f32 ? ncclFloat32 : ncclFloat64;
    if (count == 0) return;
    const size_t bytes = count * tensor::dtype_size(dtype);
    run("all_reduce_max", timeout, {data, bytes, data, bytes}, [&](const void* in, void* out) {
      return ncclAllReduce(in, out, count, type, ncclMax, comm_, stream_);
    });
  }

  void reduce_scatter_sum(const void* input, void* output, size_t count, DType dtype,
                          milliseconds timeout) override {
    const ncclDataType_t type = sum_type("reduce_scatter", dtype);
    if (count == 0) return;
    const size_t bytes = count * tensor::dtype_size(dtype);
    run("reduce_scatter", timeout, {input, static_cast<size_t>(size_) * bytes, output, bytes},
        [&](const void* in, void* out) {
          return ncclReduceScatter(in, out, count, type, ncclSum, comm_, stream_);
        });
  }

  void reduce_scatter_sum_v(const void* input, void* output, std::span<const size_t> counts,
                            DType dtype, milliseconds timeout) override {
    const ncclDataType_t type = sum_type("reduce_scatter_v", dtype);
    check_counts("reduce_scatter_v", *this, counts, "element counts");
    bool equal = true;
    size_t total = 0;
    for (size_t c : counts) {
      equal = equal && c == counts[0];
      total += c;
    }
    if (total == 0) return;
    if (equal) return reduce_scatter_sum(input, output, counts[0], dtype, timeout);
    const size_t item = tensor::dtype_size(dtype);
    const Buffers buffers{input, total * item, output, counts[static_cast<size_t>(rank_)] * item};
    run("reduce_scatter_v", timeout, buffers, [&](const void* input_at, void* output_at) {
      const char* in = static_cast<const char*>(input_at);
      return grouped([&] {
        size_t offset = 0;
        for (int r = 0; r < size_; ++r) {
          const size_t count = counts[static_cast<size_t>(r)];
          if (count > 0) {
            // NCCL writes recvbuff only on the root; elsewhere it is passed but unused.
            const ncclResult_t queued =
                ncclReduce(in + offset * item, output_at, count, type, ncclSum, r, comm_, stream_);
            if (queued != ncclSuccess) return queued;
          }
          offset += count;
        }
        return ncclSuccess;
      });
    });
  }

  void all_gather_v(const void* input, void* output, std::span<const size_t> bytes,
                    milliseconds timeout) override {
    check_counts("all_gather_v", *this, bytes, "byte counts");
    size_t total = 0;
    for (size_t b : bytes)
      total += b;
    if (total == 0) return;
    const Buffers buffers{input, bytes[static_cast<size_t>(rank_)], output, total};
    run("all_gather_v", timeout, buffers, [&](const void* in, void* output_at) {
      char* out = static_cast<char*>(output_at);
      return grouped([&] {
        size_t offset = 0;
        for (int r = 0; r < size_; ++r) {
          const size_t part = bytes[static_cast<size_t>(r)];
          if (part > 0) {
            const ncclResult_t queued = ncclBroadcast(r == rank_ ? in : out + offset, out + offset,
                                                      part, ncclUint8, r, comm_, stream_);
            if (queued != ncclSuccess) return queued;
          }
          offset += part;
        }
        return ncclSuccess;
      });
    });
  }

  void all_gather(const void* input, void* output, size_t bytes, milliseconds timeout) override {
    if (bytes == 0) return;
    run("all_gather", timeout, {input, bytes, output, static_cast<size_t>(size_) * bytes},
        [&](const void* in, void* out) {
          return ncclAllGather(in, out, bytes, ncclUint8, comm_, stream_);
        });
  }

  void all_to_all(const void* input, void* output, size_t bytes, milliseconds timeout) override {
    if (bytes == 0) return;
    const std::vector<size_t> each(static_cast<size_t>(size_), bytes);
    exchange("all_to_all", input, each, output, each, timeout);
  }

  void all_to_allv(const void* input, std::span<const size_t> send_bytes, void* output,
                   std::span<const size_t> recv_bytes, milliseconds timeout) override {
    if (send_bytes.size() != static_cast<size_t>(size_) ||
        recv_bytes.size() != static_cast<size_t>(size_)) {
      throw CommError(CommError::Kind::usage,
                      describe_call("all_to_allv", *this) + ": got " +
                          std::to_string(send_bytes.size()) + " send and " +
                          std::to_string(recv_bytes.size()) + " receive counts; pass one per rank",
                      "all_to_allv");
    }
    exchange("all_to_allv", input, send_bytes, output, recv_bytes, timeout);
  }

  // NCCL has no tags: sends and receives between a pair of ranks match in the order they are
  // issued, so the tag is not checked and callers must issue them in the same order on both sides.
  void send(const void* data, size_t bytes, int peer, uint32_t /*tag*/,
            milliseconds timeout) override {
    check_peer("send", *this, peer);
    if (bytes == 0) return;
    run(
        "send", timeout, {data, bytes, nullptr, 0},
        [&](const void* in, void*) { return ncclSend(in, bytes, ncclUint8, peer, comm_, stream_); },
        peer);
  }

  void recv(void* data, size_t bytes, int peer, uint32_t /*tag*/, milliseconds timeout) override {
    check_peer("recv", *this, peer);
    if (bytes == 0) return;
    run(
        "recv", timeout, {nullptr, 0, data, bytes},
        [&](const void*, void* out) {
          return ncclRecv(out, bytes, ncclUint8, peer, comm_, stream_);
        },
        peer);
  }

  void broadcast(void* data, size_t bytes, int root, milliseconds timeout) override {
    check_peer("broadcast", *this, root, /*self_ok=*/true);
    if (bytes == 0) return;
    run("broadcast", timeout, {data, bytes, data, bytes}, [&](const void* in, void* out) {
      return ncclBroadcast(in, out, bytes, ncclUint8, root, comm_, stream_);
    });
  }

  void barrier(milliseconds timeout) override {
    run("barrier", timeout, Buffers{}, [&](const void*, void*) {
      return ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, stream_);
    });
  }

 private:
  void exchange(const char* op, const void* input, std::span<const size_t> send_bytes, void* output,
                std::span<const size_t> recv_bytes, milliseconds timeout) {
    size_t total_sent = 0, total_received = 0;
    for (size_t r = 0; r < send_bytes.size(); ++r) {
      total_sent += send_bytes[r];
      total_received += recv_bytes[r];
    }
    if (total_sent + total_received == 0) return;
    const Buffers buffers{input, total_sent, output, total_received};
    run(op, timeout, buffers, [&](const void* input_at, void* output_at) {
      const char* in = static_cast<const char*>(input_at);
      char* out = static_cast<char*>(output_at);
      return grouped([&] {
        size_t sent = 0, received = 0;
        for (int r = 0; r < size_; ++r) {
          const size_t to = send_bytes[static_cast<size_t>(r)];
          const size_t from = recv_bytes[static_cast<size_t>(r)];
          if (to > 0) {
            const ncclResult_t queued = ncclSend(in + sent, to, ncclUint8, r, comm_, stream_);
            if (queued != ncclSuccess) return queued;
          }
          if (from > 0) {
            const ncclResult_t queued =
                ncclRecv(out + received, from, ncclUint8, r, comm_, stream_);
            if (queued != ncclSuccess) return queued;
          }
          sent += to;
          received += from;
        }
        return ncclSuccess;
      });
    });
  }

  // Enqueues one NCCL call (or group) on the buffers placed for it (enqueue(input, output)) and
  // waits for it; any failure aborts the communicator and leaves it broken.
  template <class Enqueue>
  void run(const char* op, milliseconds timeout, const Buffers& buffers, Enqueue&& enqueue,
           int peer = -1) {
    if (broken_) {
      throw CommError(CommError::Kind::io,
                      describe_call(op, *this) + ": this group is broken by an earlier failure (" +
                          broken_reason_ + "); stop and restart the job",
                      op, peer);
    }
    const milliseconds t = timeout.count() > 0 ? timeout : timeout_;
    try {
      check_cuda(op, cudaSetDevice(device_), "cudaSetDevice", peer);
      // Staged inputs are copied before the stream waits for the producer: a copy from pageable
      // memory may synchronise its stream, which must not mean waiting for the producer's work.
      const Placement placement = place(op, buffers, peer);
      if (ready_ != nullptr) {
        check_cuda(op, cudaEventRecord(ready_, producer_), "cudaEventRecord on the producer stream",
                   peer);
        check_cuda(op, cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent", peer);
      }
      const ncclResult_t queued = enqueue(placement.input, placement.output);
      if (queued != ncclSuccess && queued != ncclInProgress) {
        const bool misuse = queued == ncclInvalidArgument || queued == ncclInvalidUsage;
        fail(op, misuse ? CommError::Kind::usage : CommError::Kind::io,
             "enqueue failed: " + nccl_text(queued), peer);
      }
      PendingOp(
          op, describe_call(op, *this), t, [this] { return poll_comm(comm_, stream_); },
          [this] { abort(); })
          .wait();
      copy_out(op, placement, peer);
    } catch (const CommError& error) {
      broken_ = true;
      broken_reason_ = error.what();
      if (peer >= 0 && error.peer() < 0)
        throw CommError(error.kind(), error.what(), error.op(), peer);
      throw;
    }
  }

  // Host buffers go through the staging buffer (inputs copied in on our stream, before the
  // collective); device buffers are used as they are. In place (all_reduce, broadcast, or an
  // in-place gather at rank 0) keeps one region, so NCCL sees the same aliasing as the caller's.
  Placement place(const char* op, const Buffers& call, int peer) {
    Placement placement{call.input, call.output};
    const bool stage_input = call.input_bytes > 0 && is_host_memory(call.input);
    const bool stage_output = call.output_bytes > 0 && is_host_memory(call.output);
    if (!stage_input && !stage_output) return placement;
    const bool in_place = stage_input && stage_output && call.input == call.output;
    const size_t input_region =
        stage_input && !in_place
            ? (call.input_bytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment
            : 0;
    const size_t needed = in_place ? std::max(call.input_bytes, call.output_bytes)
                                   : input_region + (stage_output ? call.output_bytes : 0);
    char* base = staging_for(op, needed, peer);
    if (stage_input) {
      check_cuda(
          op, cudaMemcpyAsync(base, call.input, call.input_bytes, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync of the host input to the staging buffer", peer);
      placement.input = base;
    }
    if (stage_output) {
      placement.output = base + input_region;
      placement.host_output = call.output;
      placement.output_bytes = call.output_bytes;
    }
    return placement;
  }

  // After the collective has completed: the staged output back to the caller's host memory.
  void copy_out(const char* op, const Placement& placement, int peer) {
    if (placement.host_output == nullptr) return;
    check_cuda(op,
               cudaMemcpyAsync(placement.host_output, placement.output, placement.output_bytes,
                               cudaMemcpyDeviceToHost, stream_),
               "cudaMemcpyAsync of the staged output to the host", peer);
    check_cuda(op, cudaStreamSynchronize(stream_),
               "cudaStreamSynchronize after the copy to the host", peer);
  }

  // The staging buffer, at least `bytes`. Regrown only between calls, when nothing of ours is in
  // flight (every call has waited for its completion).
  char* staging_for(const char* op, size_t bytes, int peer) {
    if (bytes <= staging_bytes_) return staging_;
    if (staging_ != nullptr)
      check_cuda(op, cudaFree(staging_), "cudaFree of the staging buffer", peer);
    staging_ = nullptr;
    staging_bytes_ = 0;
    const size_t grown = std::max(bytes, kMinStagingBytes);
    void* memory = nullptr;
    check_cuda(op, cudaMalloc(&memory, grown),
               ("cudaMalloc of a " + std::to_string(grown) + "-byte staging buffer for host memory")
                   .c_str(),
               peer);
    staging_ = static_cast<char*>(memory);
    staging_bytes_ = grown;
    return staging_;
  }

  void check_cuda(const char* op, cudaError_t error, const char* call, int peer) {
    if (error == cudaSuccess) return;
    (void)cudaGetLastError();  // reported here, not again by the next unrelated check
    fail(op, CommError::Kind::io, cuda_text(error, call), peer);
  }

  [[noreturn]] void fail(const char* op, CommError::Kind kind, const std::string& what, int peer) {
    abort();
    throw CommError(kind,
                    describe_call(op, *this) + ": " + what +
                        "; the communicator was aborted, stop and restart the job",
                    op, peer);
  }

  void abort() {
    if (comm_ == nullptr) return;
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  ncclDataType_t sum_type(const char* op, DType dtype) const {
    switch (dtype) {
      case DType::f32:
        return ncclFloat32;
      case DType::f64:
        return ncclFloat64;
      case DType::bf16:
        return ncclBfloat16;
      case DType::f16:
        return ncclFloat16;
      default:
        throw CommError(CommError::Kind::usage,
                        describe_call(op, *this) + ": cannot sum " +
                            std::string(tensor::dtype_name(dtype)) + "; use f32, f64, bf16 or f16",
                        op);
    }
  }

  std::string name_;
  int rank_;
  int size_;
  milliseconds timeout_;
  int device_;
  ncclComm_t comm_;  // null once aborted
  cudaStream_t stream_;
  int* barrier_word_;        // one device int that barrier() all-reduces
  cudaStream_t producer_;    // null: the caller completes inputs before each call
  cudaEvent_t ready_;        // recorded on producer_ by each call; null without a producer
  char* staging_ = nullptr;  // device copy of host buffers (see place())
  size_t staging_bytes_ = 0;
  bool broken_ = false;
  std::string broken_reason_;
};

// NCCL reads NCCL_ALGO and NCCL_PROTO once, at its first initialisation in the process.
void pin_deterministic_algorithms() {
  ::setenv("NCCL_ALGO", "Ring", /*overwrite=*/0);
  ::setenv("NCCL_PROTO", "Simple", /*overwrite=*/0);
}

ncclUniqueId exchange_unique_id(Store& store, const GroupOptions& options,
                                const std::string& where) {
  ncclUniqueId id{};
  if (options.rank == 0) {
    const ncclResult_t made = ncclGetUniqueId(&id);
    if (made != ncclSuccess) {
      throw CommError(CommError::Kind::io,
                      where + ": ncclGetUniqueId failed: " + nccl_text(made) +
                          "; check NCCL_SOCKET_IFNAME and that a network interface is up",
                      "rendezvous");
    }
    store.set(kIdKey, std::string_view(reinterpret_cast<const char*>(&id), sizeof(id)));
    return id;
  }
  std::string value;
  try {
    value = store.get(kIdKey, options.timeout);
  } catch (const CommError& error) {
    if (error.kind() != CommError::Kind::timeout) throw;
    throw CommError(CommError::Kind::timeout,
                    where + ": rank 0 did not publish the NCCL id within " +
                        std::to_string(options.timeout.count()) + " ms in " + store.describe() +
                        "; check that rank 0 started, with the same job id and restart count",
                    "rendezvous", 0);
  }
  if (value.size() != sizeof(id)) {
    throw CommError(CommError::Kind::io,
                    where + ": the NCCL id in " + store.describe() + " has " +
                        std::to_string(value.size()) + " bytes, expected " +
                        std::to_string(sizeof(id)) +
                        "; another program or NCCL version wrote it: use a fresh job id",
                    "rendezvous");
  }
  std::memcpy(&id, value.data(), sizeof(id));
  return id;
}

}  // namespace

std::unique_ptr<Communicator> create_nccl_communicator(Store& store, const GroupOptions& options,
                                                       int cuda_device, bool deterministic,
                                                       void* producer_stream) {
  const std::string where = "rendezvous of group " + options.name + " (" +
                            std::to_string(options.size) + " ranks, this is rank " +
                            std::to_string(options.rank) + ", NCCL on GPU " +
                            std::to_string(cuda_device) + ")";
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    throw CommError(CommError::Kind::usage,
                    where + ": rank must be in 0.." + std::to_string(options.size - 1),
                    "rendezvous");
  }
  if (options.timeout.count() <= 0)
    throw CommError(CommError::Kind::usage, where + ": timeout must be positive", "rendezvous");
  auto cuda_check = [&](cudaError_t error, const char* call) {
    if (error == cudaSuccess) return;
    (void)cudaGetLastError();
    throw CommError(CommError::Kind::io,
                    where + ": " + cuda_text(error, call) + "; check that GPU " +
                        std::to_string(cuda_device) +
                        " exists and is visible (CUDA_VISIBLE_DEVICES)",
                    "rendezvous");
  };
  cuda_check(cudaSetDevice(cuda_device), "cudaSetDevice");
  if (deterministic) pin_deterministic_algorithms();

  const ncclUniqueId id = exchange_unique_id(store, options, where);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t started =
      ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    if (comm != nullptr) (void)ncclCommAbort(comm);
    throw CommError(CommError::Kind::io,
                    where + ": ncclCommInitRankConfig failed: " + nccl_text(started), "rendezvous");
  }
  PendingOp(
      "rendezvous", where, options.timeout, [comm] { return poll_comm(comm, nullptr); },
      [comm] { (void)ncclCommAbort(comm); })
      .wait();

  cudaStream_t stream = nullptr;
  int* barrier_word = nullptr;
  cudaEvent_t ready = nullptr;
  const auto producer = static_cast<cudaStream_t>(producer_stream);
  auto release = [&] {
    (void)ncclCommAbort(comm);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
    if (barrier_word != nullptr) (void)cudaFree(barrier_word);
    if (ready != nullptr) (void)cudaEventDestroy(ready);
  };
  try {
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&barrier_word), sizeof(int)), "cudaMalloc");
    cuda_check(cudaMemset(barrier_word, 0, sizeof(int)), "cudaMemset");
    if (producer != nullptr)
      cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming),
                 "cudaEventCreateWithFlags");
    return std::make_unique<NcclCommunicator>(options, cuda_device, comm, stream, barrier_word,
                                              producer, ready);
  } catch (...) {
    release();
    throw;
  }
}

}  // namespace trainctl::comm
