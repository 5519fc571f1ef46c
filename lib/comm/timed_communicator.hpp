// TimedCommunicator: a Communicator decorator that adds the wall time spent inside each call of
// the wrapped communicator to a CommClock shared by all the groups of a rank (Mesh::comm_seconds)
// and to one of its own (Mesh::comm_seconds_by_group).
// The clock counts the union of the calls' intervals, not their sum: two groups blocked at the
// same moment (a background reduction and a tp all_reduce) count that moment once, so the figure
// stays a share of wall time. Costs two steady_clock reads and an uncontended mutex per call.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>

#include "comm/communicator.hpp"

namespace trainctl::comm {

class CommClock {
 public:
  // Thread-safe. Every enter() is followed by one leave() on the same thread.
  void enter();
  void leave();
  // Seconds during which at least one call was in progress, including a call still running.
  double seconds() const;

 private:
  using Clock = std::chrono::steady_clock;
  mutable std::mutex mutex_;
  int active_ = 0;
  Clock::time_point since_{};
  Clock::duration total_{};
};

class TimedCommunicator final : public Communicator {
 public:
  TimedCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<CommClock> clock);

  const std::string& name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  size_t buffer_bytes() const override { return inner_->buffer_bytes(); }

  void all_reduce_sum(void* data, size_t count, DType dtype,
                      std::chrono::milliseconds timeout) override;
  void all_reduce_max(void* data, size_t count, DType dtype,
                      std::chrono::milliseconds timeout) override;
  void reduce_scatter_sum(const void* input, void* output, size_t count, DType dtype,
                          std::chrono::milliseconds timeout) override;
  void reduce_scatter_sum_v(const void* input, void* output, std::span<const size_t> counts,
                            DType dtype, std::chrono::milliseconds timeout) override;
  void all_gather_v(const void* input, void* output, std::span<const size_t> bytes,
                    std::chrono::milliseconds timeout) override;
  void all_gather(const void* input, void* output, size_t bytes,
                  std::chrono::milliseconds timeout) override;
  void all_to_all(const void* input, void* output, size_t bytes,
                  std::chrono::milliseconds timeout) override;
  void all_to_allv(const void* input, std::span<const size_t> send_bytes, void* output,
                   std::span<const size_t> recv_bytes, std::chrono::milliseconds timeout) override;
  void send(const void* data, size_t bytes, int peer, uint32_t tag,
            std::chrono::milliseconds timeout) override;
  void recv(void* data, size_t bytes, int peer, uint32_t tag,
            std::chrono::milliseconds timeout) override;
  // Timed while it posts, and again while its handle waits.
  std::unique_ptr<PendingSend> isend(const void* data, size_t bytes, int peer, uint32_t tag,
                                     std::chrono::milliseconds timeout) override;
  void broadcast(void* data, size_t bytes, int root, std::chrono::milliseconds timeout) override;
  void barrier(std::chrono::milliseconds timeout) override;

  using Communicator::all_reduce_sum;

  // Seconds spent inside this group's own calls (their union), for the time by group.
  double group_seconds() const { return own_->seconds(); }

 private:
  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<CommClock> clock_;
  std::shared_ptr<CommClock> own_ = std::make_shared<CommClock>();
};

}  // namespace trainctl::comm
