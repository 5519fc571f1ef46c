#include "comm/background_reducer.hpp"

#include "comm/error.hpp"

namespace trainctl::comm {

void Work::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (timeout.count() > 0) {
    if (!finished_.wait_for(lock, timeout, [&] { return done_; })) {
      throw CommError(CommError::Kind::timeout,
                      "waiting for the background " + what_ + ": not finished after " +
                          std::to_string(timeout.count()) +
                          " ms; the operation keeps its own timeout and may still complete",
                      "wait");
    }
  } else {
    finished_.wait(lock, [&] { return done_; });
  }
  if (error_) std::rethrow_exception(error_);
}

bool Work::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  finished_.notify_all();
}

BackgroundReducer::BackgroundReducer(std::unique_ptr<Communicator> communicator)
    : owned_(std::move(communicator)), communicator_(owned_.get()), worker_([this] { run(); }) {}

BackgroundReducer::BackgroundReducer(Communicator& communicator)
    : communicator_(&communicator), worker_([this] { run(); }) {}

BackgroundReducer::~BackgroundReducer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  worker_.join();
}

std::shared_ptr<Work> BackgroundReducer::start_all_reduce_sum(void* data, size_t count, DType dtype,
                                                              std::function<void()> ready) {
  return enqueue("all_reduce of " + std::to_string(count) + " elements",
                 [this, data, count, dtype, ready = std::move(ready)] {
                   if (ready) ready();
                   communicator_->all_reduce_sum(data, count, dtype);
                 });
}

std::shared_ptr<Work> BackgroundReducer::start_reduce_scatter_sum_v(const void* input, void* output,
                                                                    std::vector<size_t> counts,
                                                                    DType dtype,
                                                                    std::function<void()> ready) {
  size_t total = 0;
  for (size_t count : counts)
    total += count;
  return enqueue(
      "reduce_scatter_v of " + std::to_string(total) + " elements",
      [this, input, output, counts = std::move(counts), dtype, ready = std::move(ready)] {
        if (ready) ready();
        communicator_->reduce_scatter_sum_v(input, output, counts, dtype);
      });
}

std::shared_ptr<Work> BackgroundReducer::start_all_gather_v(const void* input, void* output,
                                                            std::vector<size_t> bytes,
                                                            std::function<void()> ready) {
  size_t total = 0;
  for (size_t b : bytes)
    total += b;
  return enqueue("all_gather_v of " + std::to_string(total) + " bytes",
                 [this, input, output, bytes = std::move(bytes), ready = std::move(ready)] {
                   if (ready) ready();
                   communicator_->all_gather_v(input, output, bytes);
                 });
}

std::shared_ptr<Work> BackgroundReducer::start_all_to_allv(const void* input,
                                                           std::vector<size_t> send_bytes,
                                                           void* output,
                                                           std::vector<size_t> recv_bytes,
                                                           std::function<void()> ready) {
  size_t total = 0;
  for (size_t b : send_bytes)
    total += b;
  return enqueue("all_to_allv of " + std::to_string(total) + " bytes",
                 [this, input, output, send_bytes = std::move(send_bytes),
                  recv_bytes = std::move(recv_bytes), ready = std::move(ready)] {
                   if (ready) ready();
                   communicator_->all_to_allv(input, send_bytes, output, recv_bytes);
                 });
}

std::shared_ptr<Work> BackgroundReducer::enqueue(std::string what,
                                                 std::function<void()> operation) {
  auto work = std::make_shared<Work>();
  work->what_ = std::move(what) + " on group " + communicator_->name();
  {
    std::lock_guard lock(mutex_);
    queue_.emplace_back(std::move(operation), work);
  }
  queued_.notify_one();
  return work;
}

// Drains the queue before stopping: a destructor that dropped queued operations would leave the
// other ranks waiting in a collective this rank never joins.
void BackgroundReducer::run() {
  while (true) {
    std::pair<std::function<void()>, std::shared_ptr<Work>> item;
    {
      std::unique_lock lock(mutex_);
      queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      item.first();
    } catch (...) {
      error = std::current_exception();
    }
    item.second->finish(error);
  }
}

}  // namespace trainctl::comm
