#include "ckpt/writer.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <utility>

#include <fmt/format.h>

#include "ckpt/scan.hpp"

namespace trainctl::ckpt {

namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kPageBytes = 4096;
constexpr size_t kMinCopyPerThread = size_t{8} << 20;
constexpr unsigned kMaxCopyThreads = 4;
constexpr size_t kMinStreamBytes = size_t{256} << 10;

size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

HostArena::HostArena(HostArena&& other) noexcept
    : blocks_(std::move(other.blocks_)),
      spare_(std::move(other.spare_)),
      next_spare_(std::exchange(other.next_spare_, 0)),
      next_block_bytes_(other.next_block_bytes_) {
  other.blocks_.clear();
  other.spare_.clear();
}

HostArena& HostArena::operator=(HostArena&& other) noexcept {
  if (this != &other) {
    release();
    blocks_ = std::exchange(other.blocks_, {});
    spare_ = std::exchange(other.spare_, {});
    next_spare_ = std::exchange(other.next_spare_, 0);
    next_block_bytes_ = other.next_block_bytes_;
  }
  return *this;
}

HostArena::~HostArena() {
  release();
}

HostArena::Block HostArena::map_block(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED)
    throw CheckpointError(fmt::format(
        "cannot map {} bytes of host memory for a checkpoint copy: {}; free memory or save less "
        "state per rank",
        bytes, std::strerror(errno)));
  return {static_cast<std::byte*>(p), bytes, 0};
}

void HostArena::unmap(Block& block) noexcept {
  if (block.data) ::munmap(block.data, block.bytes);
  block = {};
}

void HostArena::release() noexcept {
  for (Block& b : blocks_)
    unmap(b);
  for (Block& b : spare_)
    unmap(b);
  blocks_.clear();
  spare_.clear();
  next_spare_ = 0;
}

std::byte* HostArena::allocate(size_t bytes) {
  const size_t rounded = round_up(std::max<size_t>(bytes, 1), kAlignment);
  if (blocks_.empty() || blocks_.back().bytes - blocks_.back().used < rounded) {
    Block block;
    // Spares come in the order the previous request used them, so the same sequence of
    // allocations takes the same blocks; one too small for this piece is released.
    while (!block.data && next_spare_ < spare_.size()) {
      Block& spare = spare_[next_spare_++];
      if (spare.bytes >= rounded)
        block = std::exchange(spare, {});
      else
        unmap(spare);
    }
    if (!block.data) {
      block = map_block(round_up(std::max(rounded, next_block_bytes_), kPageBytes));
      next_block_bytes_ = std::min(next_block_bytes_ * 2, kMaxBlockBytes);
    }
    block.used = 0;
    blocks_.push_back(block);
  }
  Block& current = blocks_.back();
  std::byte* p = current.data + current.used;
  current.used += rounded;
  return p;
}

bool HostArena::owns(const void* data, size_t bytes) const {
  const auto* p = static_cast<const std::byte*>(data);
  for (const Block& b : blocks_)
    if (p >= b.data && p <= b.data + b.used && bytes <= static_cast<size_t>(b.data + b.used - p))
      return true;
  return false;
}

size_t HostArena::mapped_bytes() const {
  size_t total = 0;
  for (const Block& b : blocks_)
    total += b.bytes;
  for (const Block& b : spare_)
    total += b.bytes;
  return total;
}

void HostArena::reserve(size_t bytes) {
  if (bytes == 0 || mapped_bytes() >= bytes) return;
  spare_.push_back(map_block(round_up(round_up(bytes, kAlignment), kPageBytes)));
}

HostArena HostArena::recycle() {
  HostArena next;
  next.spare_ = std::exchange(blocks_, {});
  for (size_t i = next_spare_; i < spare_.size(); ++i)
    unmap(spare_[i]);
  spare_.clear();
  next_spare_ = 0;
  return next;
}

namespace {

#if defined(__x86_64__)
// Copies with non-temporal stores: the destination (a request about to be written out) is not
// read again soon, so filling it without first reading each line into the cache moves a third
// less memory traffic; measured 1.5x faster than memcpy for a 1 GB state of 7-150 MB tensors.
__attribute__((target("avx2"))) void stream_copy_avx2(char* dst, const char* src, size_t bytes) {
  size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  _mm_sfence();
  std::memcpy(dst + i, src + i, bytes - i);
}

void stream_copy_sse2(char* dst, const char* src, size_t bytes) {
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  _mm_sfence();
  std::memcpy(dst + i, src + i, bytes - i);
}
#endif

// memcpy for small copies (they stay in cache); streaming stores for large ones.
void copy_bytes(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  if (bytes >= kMinStreamBytes) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    const size_t head = (32 - reinterpret_cast<uintptr_t>(d) % 32) % 32;  // align the stores
    std::memcpy(d, s, head);
    static const bool avx2 = __builtin_cpu_supports("avx2");
    (avx2 ? stream_copy_avx2 : stream_copy_sse2)(d + head, s + head, bytes - head);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace

void copy_parallel(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;  // dst/src may be null then (an empty vector's data())
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const auto threads = static_cast<unsigned>(std::min<size_t>(
      {kMaxCopyThreads, hardware, std::max<size_t>(1, bytes / kMinCopyPerThread)}));
  if (threads <= 1) {
    copy_bytes(dst, src, bytes);
    return;
  }
  const size_t part = round_up(bytes / threads, kPageBytes);
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  std::vector<std::thread> helpers;
  size_t begin = 0;
  for (unsigned t = 0; t + 1 < threads && begin + part < bytes; ++t, begin += part)
    helpers.emplace_back([=] { copy_bytes(d + begin, s + begin, part); });
  copy_bytes(d + begin, s + begin, bytes - begin);  // the last part on this thread
  for (std::thread& h : helpers)
    h.join();
}

uint64_t SaveRequest::box_bytes(const std::string& name, DType dtype,
                                const std::vector<int64_t>& shape, std::vector<Range>& index) {
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
  return bytes;
}

void SaveRequest::add(std::string name, DType dtype, std::vector<int64_t> shape,
                      std::vector<Range> index, const void* data) {
  const uint64_t bytes = box_bytes(name, dtype, shape, index);
  if (!data) throw CheckpointError(fmt::format("SaveRequest: tensor '{}' has no data", name));
  std::byte* copy = memory_.allocate(static_cast<size_t>(bytes));
  copy_parallel(copy, data, static_cast<size_t>(bytes));
  slices_.push_back({std::move(name), dtype, std::move(shape), std::move(index), copy});
  bytes_ += bytes;
}

std::byte* SaveRequest::allocate(size_t bytes) {
  return memory_.allocate(bytes);
}

void SaveRequest::add_view(std::string name, DType dtype, std::vector<int64_t> shape,
                           std::vector<Range> index, const void* data) {
  const uint64_t bytes = box_bytes(name, dtype, shape, index);
  if (!data || !memory_.owns(data, static_cast<size_t>(bytes)))
    throw CheckpointError(fmt::format(
        "SaveRequest::add_view: the {} bytes of tensor '{}' are not inside memory from this "
        "request's allocate() (use add() to copy them)",
        bytes, name));
  slices_.push_back({std::move(name), dtype, std::move(shape), std::move(index), data});
  bytes_ += bytes;
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
    : dir_(std::move(checkpoints_dir)), options_(std::move(options)) {
  if (options_.world_size < 1 || options_.rank < 0 || options_.rank >= options_.world_size)
    throw CheckpointError(fmt::format("CheckpointWriter: rank {} is outside world size {}",
                                      options_.rank, options_.world_size));
  if (options_.world_size > 1) shared_tmp_dir(dir_, 0, options_.save_id);  // checks the id now
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

SaveStats CheckpointWriter::save_multi_rank(const SaveRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t step = request.header.step;
  const fs::path tmp = join_save(dir_, step, options_.save_id);
  SaveStats stats;
  stats.step = step;
  try {
    const ShardIndex mine = write_shard(tmp, options_.rank, request.slices(), options_.after_slice);
    publish_shard_index(tmp, step, mine);
    stats.bytes = mine.bytes;
  } catch (const std::exception& e) {
    publish_shard_error(tmp, options_.rank, e.what());
    throw;
  }
  stats.path = dir_ / step_dir_name(step);
  if (options_.rank == 0) {
    try {
      std::vector<ShardIndex> all =
          collect_shard_indices(tmp, step, options_.world_size, options_.timeout);
      stats.bytes = 0;
      for (const ShardIndex& index : all)
        stats.bytes += index.bytes;
      write_manifest(tmp, request.header, std::move(all));
      remove_shard_indices(tmp, options_.world_size);
      stats.path = commit(dir_, tmp, step);
    } catch (...) {
      abandon(tmp);
      throw;
    }
  }
  stats.write_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.bandwidth =
      stats.write_seconds > 0 ? static_cast<double>(stats.bytes) / stats.write_seconds : 0;
  return stats;
}

void CheckpointWriter::run(SaveRequest& request) {
  const bool multi_rank = options_.world_size > 1;
  const fs::path tmp = multi_rank
                           ? shared_tmp_dir(dir_, request.header.step, options_.save_id)
                           : dir_ / fmt::format(".tmp-{}.{}", step_dir_name(request.header.step),
                                                static_cast<long>(::getpid()));
  SaveStats stats;
  try {
    stats = multi_rank ? save_multi_rank(request)
                       : ckpt::save(dir_, request.header, request.slices(), options_.after_slice);
  } catch (...) {
    std::error_code ec;
    // Rank 0 removes a failed multi-rank save's directory; the other ranks leave it to rank 0.
    if ((!multi_rank || options_.rank == 0) && fs::exists(tmp, ec))
      failed_tmp_dirs_.push_back(tmp);  // removal failed: retry later
    throw;
  }
  if (options_.rank == 0) apply_retention(dir_, options_.keep_last);
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
    keep_memory(request);
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

void CheckpointWriter::keep_memory(SaveRequest& request) {
  request.slices_.clear();  // they point into the memory handed on
  spare_memory_ = request.memory_.recycle();
}

SaveRequest CheckpointWriter::new_request() {
  SaveRequest request;
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return !busy_; });  // an in-flight save holds the memory
  request.memory_ = std::exchange(spare_memory_, HostArena{});
  return request;
}

void CheckpointWriter::save(SaveRequest request) {
  wait();
  if (!options_.async) {
    try {
      run(request);
    } catch (...) {
      std::lock_guard lock(mutex_);
      keep_memory(request);
      throw;
    }
    std::lock_guard lock(mutex_);
    keep_memory(request);
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

void CheckpointWriter::reserve(size_t bytes) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return !busy_; });  // an in-flight save holds the memory
  spare_memory_.reserve(bytes);
}

std::optional<SaveStats> CheckpointWriter::last_stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace trainctl::ckpt
