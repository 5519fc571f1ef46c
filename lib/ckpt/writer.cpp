#include "ckpt/writer.hpp"

#include <unistd.h>

#include <cstring>
#include <iostream>

#include <fmt/format.h>

#include "ckpt/scan.hpp"

namespace trainctl::ckpt {

void SaveRequest::add(std::string name, DType dtype, std::vector<int64_t> shape,
                      std::vector<Range> index, const void* data) {
  if (index.empty())
    for (int64_t d : shape)
      index.push_back({0, d});
  uint64_t bytes = tensor::dtype_size(dtype);
  for (const Range& r : index) {
    if (r.size() <= 0)
      throw CheckpointError(
          fmt::format("SaveRequest: tensor '{}' has an empty index {}", name, format_index(index)));
    bytes *= static_cast<uint64_t>(r.size());
  }
  tensor::Buffer copy(static_cast<size_t>(bytes));
  if (!data) throw CheckpointError(fmt::format("SaveRequest: tensor '{}' has no data", name));
  std::memcpy(copy.data(), data, static_cast<size_t>(bytes));
  slices_.push_back({std::move(name), dtype, std::move(shape), std::move(index), copy.data()});
  copies_.push_back(std::move(copy));
  bytes_ += bytes;
}

void SaveRequest::add(std::string name, const tensor::Tensor& whole) {
  if (whole.device != tensor::Device::cpu)
    throw CheckpointError(fmt::format("SaveRequest: tensor '{}' is not in host memory", name));
  std::vector<int64_t> shape(whole.shape.dims.begin(), whole.shape.dims.begin() + whole.shape.rank);
  add(std::move(name), whole.dtype, std::move(shape), {}, whole.data);
}

std::vector<fs::path> apply_retention(const fs::path& checkpoints_dir, int keep_last) {
  std::vector<fs::path> removed;
  if (keep_last <= 0) return removed;
  const ScanReport report = scan(checkpoints_dir);
  int kept = 0;
  int64_t oldest_kept = -1;
  for (const ScanEntry& e : report.entries) {  // newest first
    if (e.status != Status::valid) continue;
    if (kept == keep_last) break;
    ++kept;
    oldest_kept = e.step;
  }
  if (kept < keep_last) return removed;  // not enough valid ones yet: delete nothing
  for (const ScanEntry& e : report.entries) {
    if (e.step >= oldest_kept || e.name.starts_with(".tmp-")) continue;
    std::error_code ec;
    fs::remove_all(e.path, ec);
    if (!ec) removed.push_back(e.path);
  }
  return removed;
}

CheckpointWriter::CheckpointWriter(fs::path checkpoints_dir, Options options)
    : dir_(std::move(checkpoints_dir)), options_(options) {
  if (options_.async) worker_ = std::thread([this] { worker_loop(); });
}

CheckpointWriter::~CheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::cerr << "trainctl: checkpoint save failed: " << e.what() << "\n";
  }
  if (worker_.joinable()) {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    worker_.join();
  }
}

void CheckpointWriter::run(SaveRequest& request) {
  const fs::path tmp = dir_ / fmt::format(".tmp-{}.{}", step_dir_name(request.header.step),
                                          static_cast<long>(::getpid()));
  SaveStats stats;
  try {
    stats = ckpt::save(dir_, request.header, request.slices());
  } catch (...) {
    std::error_code ec;
    if (fs::exists(tmp, ec)) failed_tmp_dirs_.push_back(tmp);  // removal failed: retry later
    throw;
  }
  apply_retention(dir_, options_.keep_last);
  std::vector<fs::path> still_there;
  for (const fs::path& p : failed_tmp_dirs_) {
    std::error_code ec;
    fs::remove_all(p, ec);
    if (ec) still_there.push_back(p);
  }
  failed_tmp_dirs_ = std::move(still_there);
  std::lock_guard lock(mutex_);
  stats_ = stats;
}

void CheckpointWriter::worker_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stop_ || pending_.has_value(); });
    if (!pending_) return;  // stop requested and nothing left to write
    SaveRequest request = std::move(*pending_);
    pending_.reset();
    lock.unlock();
    std::exception_ptr error;
    try {
      run(request);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    busy_ = false;
    changed_.notify_all();
  }
}

void CheckpointWriter::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return !busy_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void CheckpointWriter::save(SaveRequest request) {
  wait();
  if (!options_.async) {
    run(request);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    pending_.emplace(std::move(request));
    busy_ = true;
  }
  changed_.notify_all();
}

void CheckpointWriter::poll() {
  std::lock_guard lock(mutex_);
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

std::optional<SaveStats> CheckpointWriter::last_stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace trainctl::ckpt
