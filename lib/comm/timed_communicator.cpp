#include "comm/timed_communicator.hpp"

namespace trainctl::comm {

void CommClock::enter() {
  const Clock::time_point now = Clock::now();
  std::lock_guard lock(mutex_);
  if (active_++ == 0) since_ = now;
}

void CommClock::leave() {
  const Clock::time_point now = Clock::now();
  std::lock_guard lock(mutex_);
  if (--active_ == 0) total_ += now - since_;
}

double CommClock::seconds() const {
  std::lock_guard lock(mutex_);
  Clock::duration total = total_;
  if (active_ > 0) total += Clock::now() - since_;
  return std::chrono::duration<double>(total).count();
}

namespace {

// enter() on construction, leave() on scope exit, including when the call throws: the mesh's
// clock and the group's own.
class Timed {
 public:
  Timed(CommClock& mesh, CommClock& group) : mesh_(mesh), group_(group) {
    mesh_.enter();
    group_.enter();
  }
  ~Timed() {
    group_.leave();
    mesh_.leave();
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  CommClock& mesh_;
  CommClock& group_;
};

}  // namespace

TimedCommunicator::TimedCommunicator(std::unique_ptr<Communicator> inner,
                                     std::shared_ptr<CommClock> clock)
    : inner_(std::move(inner)), clock_(std::move(clock)) {}

void TimedCommunicator::all_reduce_sum(void* data, size_t count, DType dtype,
                                       std::chrono::milliseconds timeout) {
  Timed timed(*clock_, *own_);
  inner_->all_reduce_sum(data, count, dtype, timeout);
}

void TimedCommunicator::all_reduce_max(void* data, size_t count, DType dtype,
                                       std::chrono::milliseconds timeout) {
  Timed timed(*clock_, *own_);
  inner_->all_reduce_max(data, count, dtype, timeout);
}

void TimedCommunicator::reduce_scatter_sum(const void* input, void* output, size_t count,
                                           DType dtype, std::chrono::milliseconds timeout) {
  Timed timed(*clock_, *own_);
  inner_->reduce_scatter_sum(input, output, count, dtype, timeout);
}

void TimedCommunicator::reduce_scatter_sum_v(const void* input, void* output,
                                             std::span<const size_t> counts, DType dtype,
                                             std::chrono::milliseconds timeout) {
  Timed timed(*clock_, *own_);
  inner_->reduce_scatter_sum_v(input, output, counts, dtype, timeout);
}

void TimedCommunicator::all_gather_v(const void* input, void* output, std::span<const size_t> bytes,
                                     std::chrono::milliseconds timeout) {
  Timed timed(*clock_, *own_);
  inner_->all_gather_v(input, output, bytes, timeout);
}

void TimedCommunicator::all_gather(const void* input, void* output, size_t bytes,
                                   std::chrono::milliseconds timeout) {
  Timed timed(*clock_, *own_);
  inner_->all_gather(input, output, bytes, timeout);
}

void TimedCommunicator::all_to_all(const void* input, void* output, size_t bytes,
                                   std::chrono::milliseconds timeout) {
  Timed timed(*clock_, *own_);
  inner_->all_to_all(input, output, bytes, timeout);
}

void TimedCommunicator::all_to_allv(const void* input, std::span<const size_t> send_bytes,
                                    void* output, std::span<const size_t> recv_bytes,
                                    std::chrono::milliseconds timeout) {
  Timed timed(*clock_, *own_);
  inner_->all_to_allv(input, send_bytes, output, recv_bytes, timeout);
}

void TimedCommunicator::send(const void* data, size_t bytes, int peer, uint32_t tag,
                             std::chrono::milliseconds timeout) {
  Timed timed(*clock_, *own_);
  inner_->send(data, bytes, peer, tag, timeout);
}

void TimedCommunicator::recv(void* data, size_t bytes, int peer, uint32_t tag,
                             std::chrono::milliseconds timeout) {
  Timed timed(*clock_, *own_);
  inner_->recv(data, bytes, peer, tag, timeout);
}

namespace {

class TimedSend final : public PendingSend {
 public:
  TimedSend(std::unique_ptr<PendingSend> inner, std::shared_ptr<CommClock> clock,
            std::shared_ptr<CommClock> own)
      : inner_(std::move(inner)), clock_(std::move(clock)), own_(std::move(own)) {}
  void wait() override {
    Timed timed(*clock_, *own_);
    inner_->wait();
  }

 private:
  std::unique_ptr<PendingSend> inner_;
  std::shared_ptr<CommClock> clock_, own_;
};

}  // namespace

std::unique_ptr<PendingSend> TimedCommunicator::isend(const void* data, size_t bytes, int peer,
                                                      uint32_t tag,
                                                      std::chrono::milliseconds timeout) {
  std::unique_ptr<PendingSend> inner;
  {
    Timed timed(*clock_, *own_);
    inner = inner_->isend(data, bytes, peer, tag, timeout);
  }
  return std::make_unique<TimedSend>(std::move(inner), clock_, own_);
}

void TimedCommunicator::broadcast(void* data, size_t bytes, int root,
                                  std::chrono::milliseconds timeout) {
  Timed timed(*clock_, *own_);
  inner_->broadcast(data, bytes, root, timeout);
}

void TimedCommunicator::barrier(std::chrono::milliseconds timeout) {
  Timed timed(*clock_, *own_);
  inner_->barrier(timeout);
}

}  // namespace trainctl::comm
