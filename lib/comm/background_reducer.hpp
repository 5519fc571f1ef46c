// BackgroundReducer: all_reduce_sum, reduce_scatter_sum_v and all_gather_v started now and waited
// for later (c10d's Work idea), so the gradient reduction of one bucket can overlap the backward
// pass of the layers before it (ZeRO-1 reduce-scatters each bucket into the owners' parts), and
// ZeRO-1's gather of the updated parameters the next forward.
//
// Threading rules (why they are safe with Gloo):
//  - The reducer owns its communicator and a single worker thread that alone calls it. Give it a
//    group joined only for this purpose (the dp members joined a second time under another name,
//    e.g. "dp_bg"): a Gloo context is not safe for two concurrent operations, while two contexts
//    of the same members run concurrently without interference (tested).
//  - Operations run one at a time, in the order they were started. Every member must start the
//    same operations in the same order, as for blocking collectives.
//  - The start_* calls and wait are made from one thread (the training thread).
//  - The buffers are the caller's and must stay valid from start until wait() returns (the
//    handle does not copy them). Meanwhile the caller writes neither and does not read the
//    output; reading an input it left unchanged is fine.
//  - A failure (timeout, dead peer) is rethrown by wait() of the failed operation, and by wait() of
//    every later one (the communicator is broken); the destructor waits for queued operations
//    and swallows their errors, so wait on every handle you care about.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"

namespace trainctl::comm {

// The handle of one background operation.
class Work {
 public:
  // Blocks until the operation finished; rethrows its exception. Throws CommError (timeout) when
  // it has not finished after `timeout` (0: wait without limit; the operation's own timeout
  // still applies).
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  // True once the operation finished, successfully or not. Never blocks.
  bool done() const;

 private:
  friend class BackgroundReducer;
  void finish(std::exception_ptr error);

  mutable std::mutex mutex_;
  std::condition_variable finished_;
  bool done_ = false;
  std::exception_ptr error_;
  std::string what_;  // "all_reduce of N elements on group dp_bg", for the wait timeout message
};

class BackgroundReducer {
 public:
  explicit BackgroundReducer(std::unique_ptr<Communicator> communicator);
  // A communicator owned elsewhere (a Mesh's dp_bg): it must outlive the reducer, and nothing but
  // the reducer's worker may call it while the reducer exists.
  explicit BackgroundReducer(Communicator& communicator);
  ~BackgroundReducer();
  BackgroundReducer(const BackgroundReducer&) = delete;
  BackgroundReducer& operator=(const BackgroundReducer&) = delete;

  // Queues data[count] <- sum over ranks (Communicator::all_reduce_sum, same dtypes and
  // determinism) and returns at once. `ready`, when given, runs on the worker just before the
  // collective and returns once the buffer's contents are complete: the GPU's writes are still in
  // flight when a bucket is handed over (GradSync passes Backend::fence()'s wait). An exception
  // from it fails the operation without joining the collective (the peers then time out in it).
  std::shared_ptr<Work> start_all_reduce_sum(void* data, size_t count, DType dtype,
                                             std::function<void()> ready = {});
  // Queues Communicator::reduce_scatter_sum_v(input, output, counts, dtype): chunk r of `input`
  // (counts[r] elements, packed in rank order) summed into rank r's `output`. Zero counts are
  // fine (a bucket inside one rank's part is a reduce to that rank); `ready` as above.
  std::shared_ptr<Work> start_reduce_scatter_sum_v(const void* input, void* output,
                                                   std::vector<size_t> counts, DType dtype,
                                                   std::function<void()> ready = {});
  // Queues Communicator::all_gather_v(input, output, bytes): rank r's bytes[r] input bytes land
  // as chunk r of `output`, packed in rank order. Zero byte counts are fine; `ready` as above.
  std::shared_ptr<Work> start_all_gather_v(const void* input, void* output,
                                           std::vector<size_t> bytes,
                                           std::function<void()> ready = {});

  // Queues Communicator::all_to_allv(input, send_bytes, output, recv_bytes); `ready` as above.
  // (The context-parallel ring passes its key/value blocks this way while attention computes.)
  std::shared_ptr<Work> start_all_to_allv(const void* input, std::vector<size_t> send_bytes,
                                          void* output, std::vector<size_t> recv_bytes,
                                          std::function<void()> ready = {});

  const Communicator& communicator() const { return *communicator_; }

 private:
  std::shared_ptr<Work> enqueue(std::string what, std::function<void()> operation);
  void run();

  std::unique_ptr<Communicator> owned_;
  Communicator* communicator_;
  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<Work>>> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace trainctl::comm
