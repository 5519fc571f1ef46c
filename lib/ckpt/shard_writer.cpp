#include "ckpt/shard_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "ckpt/file_io.hpp"
#include "files/files.hpp"
#include "tensor/checksum.hpp"

namespace trainctl::ckpt {

using nlohmann::json;
using tensor::crc32c;
using tensor::crc32c_combine;

namespace {

constexpr size_t kStagingBytes = size_t{4} << 20;  // small slices are gathered into one write
constexpr uint64_t kWritebackBytes = uint64_t{32} << 20;  // start write-back this often

// Checks a caller's slice and returns its index (the whole tensor when none was given).
std::vector<Range> checked_index(const SliceData& s) {
  if (s.name.empty()) throw CheckpointError("write_shard: a slice has an empty tensor name");
  std::vector<Range> index = s.index;
  if (index.empty() && !s.shape.empty())
    for (int64_t d : s.shape)
      index.push_back({0, d});
  if (index.size() != s.shape.size())
    throw CheckpointError(fmt::format("write_shard: tensor '{}' has {} dimensions but its index {}",
                                      s.name, s.shape.size(), format_index(index)));
  for (size_t d = 0; d < index.size(); ++d)
    if (index[d].begin < 0 || index[d].begin >= index[d].end || index[d].end > s.shape[d])
      throw CheckpointError(fmt::format("write_shard: tensor '{}': index {} outside its shape",
                                        s.name, format_index(index)));
  if (!s.data) throw CheckpointError(fmt::format("write_shard: tensor '{}' has no data", s.name));
  return index;
}

// One piece of the shard file in order: header, padding or a slice's bytes (not owned).
struct Piece {
  const char* data;
  uint64_t offset;
  uint64_t length;
  int slice;  // index into the caller's slices, -1 for header and padding
};

// Writes the pieces in order: small ones gathered in a staging buffer, large ones straight from
// the caller's memory (no copy), asking the kernel to start writing back every kWritebackBytes
// so the disk works while later bytes are still being copied into the page cache.
class ShardStream {
 public:
  explicit ShardStream(io::File& file) : file_(file), staging_(kStagingBytes) {}

  void append(const char* data, uint64_t bytes) {
    if (bytes < kStagingBytes / 4) {
      if (used_ + bytes > staging_.size()) flush();
      std::memcpy(staging_.data() + used_, data, static_cast<size_t>(bytes));
      used_ += static_cast<size_t>(bytes);
      return;
    }
    flush();
    for (uint64_t done = 0; done < bytes;) {
      const auto n = static_cast<size_t>(std::min<uint64_t>(kWritebackBytes, bytes - done));
      file_.write_all(data + done, n);
      advance(n);
      done += n;
    }
  }
  void flush() {
    if (used_) file_.write_all(staging_.data(), used_);
    advance(used_);
    used_ = 0;
  }

 private:
  void advance(uint64_t bytes) {
    written_ += bytes;
    if (written_ - started_ >= kWritebackBytes) {
      file_.start_writeback(started_, written_ - started_);
      started_ = written_;
    }
  }

  io::File& file_;
  std::vector<char> staging_;
  size_t used_ = 0;
  uint64_t written_ = 0;  // bytes handed to the kernel
  uint64_t started_ = 0;  // bytes whose write-back was started
};

// The checksum of every piece, computed on another thread while the pieces are written: the
// caller's bytes do not change during a save, so checksum and write may read them concurrently.
std::vector<uint32_t> checksum_pieces(const std::vector<Piece>& pieces) {
  std::vector<uint32_t> crcs(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i)
    crcs[i] = crc32c(pieces[i].data, static_cast<size_t>(pieces[i].length));
  return crcs;
}

}  // namespace

json shard_index_to_json(const ShardIndex& index) {
  Manifest m;  // reuse the manifest's slice encoding
  json slices = json::array();
  for (const auto& s : index.slices) {
    TensorEntry t{s.name, s.dtype, s.shape, {s.record}};
    m.tensors = {t};
    slices.push_back(manifest_to_json(m)["tensors"][0]);
  }
  return {{"rank", index.rank},
          {"file", index.file},
          {"bytes", index.bytes},
          {"crc32c", index.crc32c},
          {"slices", slices}};
}

ShardIndex shard_index_from_json(const json& j) {
  try {
    ShardIndex index;
    index.rank = j.at("rank").get<int>();
    index.file = j.at("file").get<std::string>();
    index.bytes = j.at("bytes").get<uint64_t>();
    index.crc32c = j.at("crc32c").get<uint32_t>();
    for (const json& t : j.at("slices")) {
      const auto dtype = parse_dtype(t.at("dtype").get<std::string>());
      if (!dtype) throw CheckpointError("unknown dtype " + t.at("dtype").dump());
      const json& s = t.at("slices").at(0);
      SliceRecord record{s.at("file").get<std::string>(),
                         s.at("offset").get<uint64_t>(),
                         s.at("length").get<uint64_t>(),
                         {},
                         s.at("crc32c").get<uint32_t>()};
      for (const json& r : s.at("index"))
        record.index.push_back({r.at(0).get<int64_t>(), r.at(1).get<int64_t>()});
      index.slices.push_back({t.at("name").get<std::string>(), *dtype,
                              t.at("shape").get<std::vector<int64_t>>(), record});
    }
    return index;
  } catch (const json::exception& e) {
    throw CheckpointError(fmt::format("malformed shard index from a rank: {}", e.what()));
  }
}

fs::path begin_save(const fs::path& checkpoints_dir, int64_t step) {
  if (step < 0) throw CheckpointError(fmt::format("cannot save a negative step ({})", step));
  std::error_code ec;
  fs::create_directories(checkpoints_dir, ec);
  if (ec) io::throw_os_error("cannot create checkpoint directory", checkpoints_dir, ec.value());
  const fs::path final_dir = checkpoints_dir / step_dir_name(step);
  if (fs::exists(final_dir, ec))
    throw CheckpointError(
        fmt::format("checkpoint {} already exists; refusing to overwrite it (move it away to save "
                    "step {} again)",
                    final_dir.string(), step));
  const fs::path tmp = checkpoints_dir / fmt::format(".tmp-{}.{}", step_dir_name(step),
                                                     static_cast<long>(::getpid()));
  fs::remove_all(tmp, ec);  // a failed earlier save of this process
  if (!fs::create_directory(tmp, ec) || ec)
    io::throw_os_error("cannot create", tmp, ec ? ec.value() : EEXIST);
  return tmp;
}

ShardIndex write_shard(const fs::path& dir, int rank, std::span<const SliceData> slices,
                       const SliceHook& after_slice) {
  if (rank < 0) throw CheckpointError(fmt::format("write_shard: negative rank {}", rank));
  ShardIndex index;
  index.rank = rank;
  index.file = shard_file_name(rank);

  // Lay the file out first: header, then each slice at a multiple of kSliceAlignment.
  static const char zeros[kSliceAlignment] = {};
  char header[kShardHeaderBytes] = {};
  std::memcpy(header, kShardMagic, sizeof kShardMagic);
  const uint32_t version = kFormatVersion, rank_u32 = static_cast<uint32_t>(rank);
  std::memcpy(header + 8, &version, 4);  // little-endian hosts only (x86-64, aarch64)
  std::memcpy(header + 12, &rank_u32, 4);
  std::vector<Piece> pieces{{header, 0, kShardHeaderBytes, -1}};
  uint64_t offset = kShardHeaderBytes;
  for (size_t i = 0; i < slices.size(); ++i) {
    const SliceData& s = slices[i];
    std::vector<Range> slice_index = checked_index(s);
    uint64_t length = tensor::dtype_size(s.dtype);
    for (const Range& r : slice_index)
      length *= static_cast<uint64_t>(r.size());
    if (const uint64_t pad = (kSliceAlignment - offset % kSliceAlignment) % kSliceAlignment) {
      pieces.push_back({zeros, offset, pad, -1});
      offset += pad;
    }
    pieces.push_back({static_cast<const char*>(s.data), offset, length, static_cast<int>(i)});
    index.slices.push_back({s.name, s.dtype, s.shape,
                            SliceRecord{index.file, offset, length, std::move(slice_index), 0}});
    offset += length;
  }

  std::future<std::vector<uint32_t>> checksums =
      std::async(std::launch::async, checksum_pieces, std::cref(pieces));
  try {
    io::File file = io::File::create(dir / index.file);
    ShardStream out(file);
    for (const Piece& p : pieces) {
      out.append(p.data, p.length);
      if (after_slice && p.slice >= 0) {
        out.flush();
        after_slice(static_cast<size_t>(p.slice));
      }
    }
    out.flush();
    file.sync();
    file.close();
  } catch (...) {
    checksums.wait();  // it reads `pieces` and the caller's bytes
    throw;
  }
  const std::vector<uint32_t> crcs = checksums.get();
  uint32_t file_crc = 0;
  for (size_t i = 0, slice = 0; i < pieces.size(); ++i) {
    file_crc = crc32c_combine(file_crc, crcs[i], pieces[i].length);
    if (pieces[i].slice >= 0) index.slices[slice++].record.crc32c = crcs[i];
  }
  index.bytes = offset;
  index.crc32c = file_crc;
  return index;
}

void write_manifest(const fs::path& dir, const ManifestHeader& header,
                    std::vector<ShardIndex> all_ranks) {
  const fs::path path = dir / kManifestFile;
  Manifest m;
  m.header = header;
  m.created = files::utc_timestamp();
  std::map<std::string, size_t> position;
  for (ShardIndex& shard : all_ranks) {
    if (!m.files.emplace(shard.file, FileEntry{shard.bytes, shard.crc32c}).second)
      throw CheckpointError(fmt::format("write_manifest: two ranks wrote {}", shard.file));
    for (ShardSlice& s : shard.slices) {
      auto [it, added] = position.emplace(s.name, m.tensors.size());
      if (added) m.tensors.push_back(TensorEntry{s.name, s.dtype, s.shape, {}});
      TensorEntry& t = m.tensors[it->second];
      if (t.dtype != s.dtype || t.shape != s.shape)
        throw CheckpointError(fmt::format(
            "write_manifest: ranks disagree on tensor '{}' ({} vs {} or a different shape)", s.name,
            tensor::dtype_name(t.dtype), tensor::dtype_name(s.dtype)));
      t.slices.push_back(std::move(s.record));
    }
  }
  validate_manifest(m, path.string());
  // Compact (no indentation): half the bytes per slice of dump(1), so twice the slices fit the
  // readers' limit. Too large for it, the save fails now instead of the resume later.
  const std::string text = manifest_to_json(m).dump();
  if (text.size() > kMaxManifestBytes)
    throw CheckpointError(fmt::format(
        "write_manifest: the manifest of step {} would have {} bytes ({} tensors), more than the "
        "{} a reader accepts (docs/checkpoints.md, \"Limits\"); not saved",
        header.step, text.size(), m.tensors.size(), kMaxManifestBytes));
  io::File file = io::File::create(path);
  file.write_all(text.data(), text.size());
  file.sync();
  file.close();
}

fs::path shared_tmp_dir(const fs::path& checkpoints_dir, int64_t step, const std::string& save_id) {
  const bool valid = !save_id.empty() && save_id.size() <= 128 &&
                     std::all_of(save_id.begin(), save_id.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
                     });
  if (!valid)
    throw CheckpointError(fmt::format(
        "checkpoint save id \"{}\" must be 1-128 letters, digits, '-' or '_' (it names the tmp "
        "directory every rank writes into); pass the job id and restart count",
        save_id));
  return checkpoints_dir / fmt::format(".tmp-{}.{}", step_dir_name(step), save_id);
}

fs::path join_save(const fs::path& checkpoints_dir, int64_t step, const std::string& save_id) {
  if (step < 0) throw CheckpointError(fmt::format("cannot save a negative step ({})", step));
  const fs::path tmp = shared_tmp_dir(checkpoints_dir, step, save_id);
  std::error_code ec;
  fs::create_directories(checkpoints_dir, ec);
  if (ec) io::throw_os_error("cannot create checkpoint directory", checkpoints_dir, ec.value());
  const fs::path final_dir = checkpoints_dir / step_dir_name(step);
  if (fs::exists(final_dir, ec))
    throw CheckpointError(
        fmt::format("checkpoint {} already exists; refusing to overwrite it (move it away to save "
                    "step {} again)",
                    final_dir.string(), step));
  // Another rank may have created it first: that is the normal case, not an error.
  if (!fs::create_directory(tmp, ec) && (ec || !fs::is_directory(tmp)))
    io::throw_os_error("cannot create", tmp, ec ? ec.value() : ENOTDIR);
  return tmp;
}

namespace {

fs::path index_path(const fs::path& dir, int rank) {
  return dir / fmt::format("rank_{}.index.json", rank);
}
fs::path error_path(const fs::path& dir, int rank) {
  return dir / fmt::format("rank_{}.error", rank);
}

// The rank's published index, nullopt while there is none; throws for a bad one.
std::optional<ShardIndex> published_index(const fs::path& dir, int rank, int64_t step) {
  const fs::path path = index_path(dir, rank);
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  const std::string text = io::read_small_file(path, kMaxShardIndexBytes, "shard index");
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("step") || !j.contains("index"))
    throw CheckpointError(fmt::format("{}: not a shard index (rank {})", path.string(), rank));
  if (j["step"] != step)
    throw CheckpointError(fmt::format("{}: rank {} published an index of step {}, not {}",
                                      path.string(), rank, j["step"].dump(), step));
  ShardIndex index = shard_index_from_json(j["index"]);
  if (index.rank != rank || index.file != shard_file_name(rank))
    throw CheckpointError(fmt::format("{}: the index names rank {} and file {}, expected rank {}",
                                      path.string(), index.rank, index.file, rank));
  return index;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i)
    s += fmt::format("{}{}", i ? ", " : "", ranks[i]);
  return s;
}

}  // namespace

void publish_shard_index(const fs::path& dir, int64_t step, const ShardIndex& index) {
  const json j = {{"step", step}, {"index", shard_index_to_json(index)}};
  io::write_file_atomically(index_path(dir, index.rank), j.dump());
}

void publish_shard_error(const fs::path& dir, int rank, const std::string& message) noexcept {
  try {
    io::write_file_atomically(error_path(dir, rank), message);
  } catch (...) {
    // rank 0 then reports the rank as missing when the timeout passes
  }
}

std::vector<ShardIndex> collect_shard_indices(const fs::path& dir, int64_t step, int world_size,
                                              std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  std::vector<std::optional<ShardIndex>> found(static_cast<size_t>(world_size));
  auto deadline = Clock::now() + timeout;
  uint64_t last_progress = 0;
  for (auto wait = std::chrono::milliseconds(1);;
       wait = std::min(wait * 2, std::chrono::milliseconds(50))) {
    std::vector<int> missing;
    uint64_t progress = 0;  // grows while any rank gets on with its save
    for (int r = 0; r < world_size; ++r) {
      auto& slot = found[static_cast<size_t>(r)];
      if (!slot) {
        std::error_code ec;
        if (fs::exists(error_path(dir, r), ec)) {
          std::string reason;
          try {
            reason =
                io::read_small_file(error_path(dir, r), kMaxShardErrorBytes, "shard error report");
          } catch (const std::exception& e) {
            reason = e.what();
          }
          throw CheckpointError(fmt::format(
              "checkpoint step {}: rank {} could not write its shard: {}", step, r, reason));
        }
        slot = published_index(dir, r, step);
      }
      if (slot) {
        progress += uint64_t{1} << 48;
      } else {
        missing.push_back(r);
        std::error_code ec;
        const auto bytes = fs::file_size(dir / shard_file_name(r), ec);
        if (!ec) progress += bytes + 1;
      }
    }
    if (missing.empty()) break;
    if (progress != last_progress) {
      last_progress = progress;
      deadline = Clock::now() + timeout;
    } else if (Clock::now() >= deadline) {
      throw CheckpointError(fmt::format(
          "checkpoint step {}: rank{} {} made no progress writing {} for {} ms (no shard index "
          "published, no shard file growing): the rank died, hangs or cannot reach this file "
          "system (see its log); the save was abandoned, earlier checkpoints are intact",
          step, missing.size() > 1 ? "s" : "", rank_list(missing), dir.string(), timeout.count()));
    }
    std::this_thread::sleep_for(wait);
  }
  std::vector<ShardIndex> all;
  for (auto& slot : found)
    all.push_back(std::move(*slot));
  return all;
}

void remove_shard_indices(const fs::path& dir, int world_size) {
  for (int r = 0; r < world_size; ++r) {
    std::error_code ec;
    fs::remove(index_path(dir, r), ec);
    if (ec) io::throw_os_error("cannot remove", index_path(dir, r), ec.value());
  }
}

fs::path commit(const fs::path& checkpoints_dir, const fs::path& tmp_dir, int64_t step) {
  const fs::path final_dir = checkpoints_dir / step_dir_name(step);
  io::fsync_directory(tmp_dir);
  if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_NOREPLACE) != 0) {
    const int error = errno;
    if (error == EEXIST || error == ENOTEMPTY)
      throw CheckpointError(fmt::format("checkpoint {} already exists; refusing to overwrite it",
                                        final_dir.string()));
    io::throw_os_error("cannot rename " + tmp_dir.string() + " to", final_dir, error);
  }
  io::fsync_directory(checkpoints_dir);
  io::write_file_atomically(checkpoints_dir / kLatestFile, step_dir_name(step) + "\n");
  return final_dir;
}

void abandon(const fs::path& tmp_dir) noexcept {
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
}

SaveStats save(const fs::path& checkpoints_dir, const ManifestHeader& header,
               std::span<const SliceData> slices, const SliceHook& after_slice) {
  const auto start = std::chrono::steady_clock::now();
  const fs::path tmp = begin_save(checkpoints_dir, header.step);
  SaveStats stats;
  try {
    ShardIndex index = write_shard(tmp, 0, slices, after_slice);
    stats.bytes = index.bytes;
    write_manifest(tmp, header, {std::move(index)});
    stats.path = commit(checkpoints_dir, tmp, header.step);
  } catch (...) {
    abandon(tmp);
    throw;
  }
  stats.step = header.step;
  stats.write_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.bandwidth =
      stats.write_seconds > 0 ? static_cast<double>(stats.bytes) / stats.write_seconds : 0;
  return stats;
}

void ignore_file_size_signal() {
  std::signal(SIGXFSZ, SIG_IGN);
}

}  // namespace trainctl::ckpt
