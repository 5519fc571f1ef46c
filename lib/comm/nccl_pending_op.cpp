// PendingOp: the wait-until-done-or-timeout loop of the NCCL communicator, without CUDA, so the
// timeout and abort paths are tested on machines that have no GPU.
#include <algorithm>
#include <thread>
#include <utility>

#include "comm/nccl_communicator.hpp"

namespace trainctl::comm {

PendingOp::PendingOp(std::string op, std::string call, std::chrono::milliseconds timeout, Poll poll,
                     Abort abort, Now now)
    : op_(std::move(op)),
      call_(std::move(call)),
      timeout_(timeout),
      now_(std::move(now)),
      start_(now_()),
      poll_(std::move(poll)),
      abort_(std::move(abort)) {}

void PendingOp::wait() {
  using namespace std::chrono;
  // A small collective finishes in tens of microseconds: poll hot at first (yield), then back off
  // so that a long one costs little CPU while its latency grows by at most a millisecond.
  constexpr int kHotPolls = 256;
  constexpr microseconds kLongestSleep{1000};
  microseconds sleep{20};
  const auto deadline = start_ + timeout_;
  for (int polls = 0;; ++polls) {
    PollResult result = poll_();
    if (!result.error.empty()) {
      fail(CommError(CommError::Kind::io,
                     call_ + ": " + result.error +
                         "; the communicator was aborted, stop and restart "
                         "the job",
                     op_));
    }
    if (result.done) return;
    if (now_() >= deadline) {
      fail(CommError(CommError::Kind::timeout,
                     call_ + ": timed out after " + std::to_string(timeout_.count()) +
                         " ms; a peer did not join the collective (NCCL cannot name which); the "
                         "communicator was aborted: check the other ranks' logs for the rank "
                         "that failed or stalled first",
                     op_));
    }
    if (polls < kHotPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, kLongestSleep);
    }
  }
}

void PendingOp::fail(CommError error) {
  if (!aborted_) {
    aborted_ = true;
    abort_();
  }
  throw error;
}

}  // namespace trainctl::comm
