#include "run/local_tier.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

#include "files/files.hpp"
#include "run/summary.hpp"
#include "train/checkpointing.hpp"
#include "train/state_json.hpp"

namespace trainctl::run {

namespace {

constexpr char kMagic[8] = {'T', 'C', 'S', 'N', 'A', 'P', '0', '1'};
constexpr const char* kFormat = "trainctl.rank_snapshot/2";  // 2: the optimizer's own state
constexpr uint64_t kMaxHeaderBytes = uint64_t{16} << 20;     // a trainer state and five buffers
constexpr size_t kChunkBytes = size_t{8} << 20;              // read and checksummed at a time

std::string run_key(const fs::path& run_dir) {
  const std::string path = fs::absolute(run_dir).lexically_normal().string();
  return fmt::format("{:016x}", XXH3_64bits(path.data(), path.size()));
}

struct Buffer {
  const char* name;
  std::vector<std::byte> train::RankSnapshot::*member;
};
constexpr Buffer kBuffers[] = {{"values", &train::RankSnapshot::values},
                               {"master", &train::RankSnapshot::master},
                               {"moment1", &train::RankSnapshot::moment1},
                               {"moment2", &train::RankSnapshot::moment2},
                               {"optimizer", &train::RankSnapshot::optimizer}};

uint64_t checksum(const std::vector<std::byte>& bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace

fs::path memory_tier_dir(const fs::path& run_dir) {
  return fs::path("/dev/shm") / fmt::format("trainctl-{}", ::getuid()) / run_key(run_dir);
}

fs::path local_tier_dir(const fs::path& local_dir, const fs::path& run_dir) {
  return local_dir / run_key(run_dir);
}

LocalTier::LocalTier(std::string name, fs::path dir, Identity identity)
    : name_(std::move(name)), dir_(std::move(dir)), identity_(std::move(identity)) {
  thread_ = std::thread([this] { work(); });
}

LocalTier::~LocalTier() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void LocalTier::submit(const train::RankSnapshot& snapshot) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !busy_ && !pending_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  pending_ = snapshot;
  changed_.notify_all();
}

void LocalTier::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !busy_ && !pending_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void LocalTier::work() {
  for (;;) {
    std::optional<train::RankSnapshot> job;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || pending_; });
      if (!pending_) return;  // stopping with nothing left
      job = std::move(pending_);
      pending_.reset();
      busy_ = true;
    }
    std::exception_ptr error;
    try {
      write(*job);
      prune();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      busy_ = false;
      if (error) error_ = error;
    }
    changed_.notify_all();
  }
}

fs::path LocalTier::file_of(int64_t step) const {
  return dir_ / fmt::format("step_{:08d}", step) / fmt::format("rank_{}.snapshot", identity_.rank);
}

void LocalTier::write(const train::RankSnapshot& snapshot) const {
  const fs::path path = file_of(snapshot.state.step);
  files::create_private_directories(path.parent_path());
  nlohmann::json header{{"format", kFormat},
                        {"step", snapshot.state.step},
                        {"rank", identity_.rank},
                        {"world_size", identity_.world_size},
                        {"model", identity_.model},
                        {"layout", identity_.layout},
                        {"state", train::to_json(snapshot.state)}};
  for (const Buffer& b : kBuffers) {
    const std::vector<std::byte>& bytes = snapshot.*b.member;
    header["buffers"].push_back({{"name", b.name},
                                 {"bytes", bytes.size()},
                                 {"xxh3", fmt::format("{:016x}", checksum(bytes))}});
  }
  const std::string text = header.dump();
  const uint64_t length = text.size();
  const fs::path temp =
      path.parent_path() / fmt::format(".{}.tmp-{}", path.filename().string(), ::getpid());
  try {
    files::UniqueFd fd = files::create_regular(temp, name_ + " snapshot");
    files::write_all(fd.get(), temp, kMagic, sizeof kMagic);
    files::write_all(fd.get(), temp, &length, sizeof length);
    files::write_all(fd.get(), temp, text.data(), text.size());
    for (const Buffer& b : kBuffers) {
      const std::vector<std::byte>& bytes = snapshot.*b.member;
      files::write_all(fd.get(), temp, bytes.data(), bytes.size());
    }
    if (::fsync(fd.get()) != 0) files::throw_os_error("fsync", temp, errno);
    if (::close(fd.release()) != 0) files::throw_os_error("close", temp, errno);
    std::error_code ec;
    fs::rename(temp, path, ec);
    if (ec) files::throw_os_error("rename to " + path.string(), temp, ec.value());
    files::fsync_directory(path.parent_path());
  } catch (...) {
    std::error_code ignored;
    fs::remove(temp, ignored);
    throw;
  }
}

std::vector<int64_t> LocalTier::steps() const {
  std::vector<int64_t> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int64_t step = 0;
    if (name.size() != 13 || name.rfind("step_", 0) != 0 ||
        std::sscanf(name.c_str() + 5, "%8ld", &step) != 1)
      continue;
    std::error_code exists;
    if (fs::is_regular_file(file_of(step), exists)) out.push_back(step);
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

std::string LocalTier::load(int64_t step, const train::SnapshotTargets& targets,
                            backend::Backend& backend, train::TrainerState& state) const {
  const fs::path path = file_of(step);
  try {
    const files::UniqueFd fd = files::open_regular(path, name_ + " snapshot");
    const uint64_t size = files::file_size(fd.get(), path);
    // Read once, front to back: the kernel reads ahead of the chunks (a disk tier, cold).
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_WILLNEED);
    char magic[sizeof kMagic];
    uint64_t length = 0;
    if (size < sizeof magic + sizeof length) return fmt::format("{}: too short", path.string());
    files::read_exact_at(fd.get(), path, magic, sizeof magic, 0);
    files::read_exact_at(fd.get(), path, &length, sizeof length, sizeof magic);
    if (std::memcmp(magic, kMagic, sizeof magic) != 0)
      return fmt::format("{}: not a rank snapshot", path.string());
    const uint64_t start = sizeof magic + sizeof length;
    if (length > kMaxHeaderBytes || length > size - start)
      return fmt::format("{}: its header length {} does not fit the file", path.string(), length);
    std::string text(length, '\0');
    files::read_exact_at(fd.get(), path, text.data(), text.size(), start);
    const nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
    if (!header.is_object() || header.value("format", "") != kFormat)
      return fmt::format("{}: its header is not readable", path.string());
    const auto differs = [&](const char* field, const nlohmann::json& want) {
      return !header.contains(field) || header[field] != want;
    };
    for (const auto& [field, want] : {std::pair<const char*, nlohmann::json>{"step", step},
                                      {"rank", identity_.rank},
                                      {"world_size", identity_.world_size},
                                      {"layout", identity_.layout},
                                      {"model", identity_.model}})
      if (differs(field, want))
        return fmt::format("{}: written with {} {}, this run has {}", path.string(), field,
                           header.contains(field) ? header[field].dump() : "none", want.dump());
    const nlohmann::json& buffers = header["buffers"];
    if (!buffers.is_array() || buffers.size() != std::size(kBuffers))
      return fmt::format("{}: its header lists no buffers", path.string());
    uint64_t offset = start + length;
    for (size_t i = 0; i < std::size(kBuffers); ++i) {
      const nlohmann::json& b = buffers[i];
      const tensor::Tensor& target = targets[i];
      const uint64_t want = target.data ? target.bytes() : 0;
      if (!b.is_object() || !b.contains("bytes") || !b["bytes"].is_number_unsigned() ||
          b.value("name", "") != kBuffers[i].name)
        return fmt::format("{}: buffer {} is not described", path.string(), i);
      if (b["bytes"].get<uint64_t>() != want)
        return fmt::format("{}: {} has {} bytes, this rank keeps {}", path.string(),
                           kBuffers[i].name, b["bytes"].get<uint64_t>(), want);
      if (want > size - offset)
        return fmt::format("{}: the file ends inside {} (damaged or cut short)", path.string(),
                           kBuffers[i].name);
      // Through one staging buffer into the target, checksummed chunk by chunk (cache-hot).
      const std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> owned(
          XXH3_createState(), &XXH3_freeState);
      XXH3_state_t* digest = owned.get();
      XXH3_64bits_reset(digest);
      const size_t item = tensor::dtype_size(target.dtype);
      const size_t chunk = (kChunkBytes / item) * item;
      std::vector<std::byte> staging(std::min<uint64_t>(chunk, want));
      for (uint64_t done = 0; done < want;) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, want - done));
        files::read_exact_at(fd.get(), path, staging.data(), n, offset + done);
        XXH3_64bits_update(digest, staging.data(), n);
        backend.copy_from_host(
            target.rows(static_cast<int64_t>(done / item), static_cast<int64_t>(n / item)),
            staging.data());
        done += n;
      }
      const uint64_t sum = XXH3_64bits_digest(digest);
      offset += want;
      if (fmt::format("{:016x}", sum) != b.value("xxh3", ""))
        return fmt::format("{}: the checksum of {} does not match (damaged)", path.string(),
                           kBuffers[i].name);
    }
    if (offset != size)
      return fmt::format("{}: {} bytes after the last buffer", path.string(), size - offset);
    state = train::trainer_state_from_json(header["state"]);
    if (state.step != step)
      return fmt::format("{}: its state is of step {}", path.string(), state.step);
  } catch (const files::FileError& e) {
    return e.what();
  } catch (const std::runtime_error& e) {  // the trainer state's fields
    return fmt::format("{}: {}", path.string(), e.what());
  }
  return "";
}

void LocalTier::prune() const {
  const std::vector<int64_t> mine = steps();
  for (size_t i = kKeep; i < mine.size(); ++i)
    remove_step(mine[i]);
  remove_stale_temporaries();
}

void LocalTier::remove_step(int64_t step) const {
  std::error_code ignored;
  fs::remove(file_of(step), ignored);
  fs::remove(file_of(step).parent_path(), ignored);  // once every rank's file is gone
}

void LocalTier::remove_stale_temporaries() const {
  // A rank killed while writing leaves its temporary file; the rank's next writer removes it
  // (this one writes only on its own thread, and not now).
  const std::string prefix = fmt::format(".rank_{}.snapshot.tmp-", identity_.rank);
  std::error_code ec;
  for (fs::directory_iterator step(dir_, ec), end; !ec && step != end; step.increment(ec)) {
    std::error_code inner;
    for (fs::directory_iterator it(step->path(), inner); !inner && it != end; it.increment(inner))
      if (it->path().filename().string().rfind(prefix, 0) == 0) {
        std::error_code ignored;
        fs::remove(it->path(), ignored);
        fs::remove(step->path(), ignored);  // once nothing else is in it
      }
  }
}

void LocalTier::remove_all() {
  wait();
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

std::vector<std::unique_ptr<LocalTier>> open_tiers(const recipe::Recipe& r, const fs::path& run_dir,
                                                   int rank) {
  LocalTier::Identity identity;
  identity.rank = rank;
  identity.world_size = r.world_size();
  const std::string model = train::describe_model(r.model).dump();
  identity.model = fmt::format("{:016x}", XXH3_64bits(model.data(), model.size()));
  identity.layout = layout_json(r).dump();
  std::vector<std::unique_ptr<LocalTier>> tiers;
  if (r.checkpoint.memory_every_steps > 0)
    tiers.push_back(std::make_unique<LocalTier>(kMemoryTier, memory_tier_dir(run_dir), identity));
  if (r.checkpoint.local_every_steps > 0)
    tiers.push_back(std::make_unique<LocalTier>(
        kLocalTier, local_tier_dir(r.checkpoint.local_dir, run_dir), identity));
  return tiers;
}

}  // namespace trainctl::run
