#include "ckpt/reader.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <future>

#include <fmt/format.h>

#include "files/files.hpp"
#include "tensor/checksum.hpp"

namespace trainctl::ckpt {

namespace {

constexpr size_t kReadChunk = size_t{8} << 20;

std::string corrupt_hint() {
  return "the checkpoint is corrupt: resume from an earlier one (`trainctl ckpt verify` checks "
         "each)";
}

// Copies the intersection `box` of a source box and a destination box (both row-major).
void copy_box(const char* src, const std::vector<Range>& src_box, char* dst,
              const std::vector<Range>& dst_box, const std::vector<Range>& box, size_t element) {
  const size_t dims = box.size();
  if (dims == 0) {
    std::memcpy(dst, src, element);
    return;
  }
  std::vector<uint64_t> src_stride(dims), dst_stride(dims);
  uint64_t s = element, d = element;
  for (size_t k = dims; k-- > 0;) {
    src_stride[k] = s;
    dst_stride[k] = d;
    s *= static_cast<uint64_t>(src_box[k].size());
    d *= static_cast<uint64_t>(dst_box[k].size());
  }
  const size_t run = static_cast<size_t>(box[dims - 1].size()) * element;
  std::vector<int64_t> at(dims);
  for (size_t k = 0; k < dims; ++k)
    at[k] = box[k].begin;
  for (;;) {
    uint64_t so = 0, doff = 0;
    for (size_t k = 0; k < dims; ++k) {
      so += static_cast<uint64_t>(at[k] - src_box[k].begin) * src_stride[k];
      doff += static_cast<uint64_t>(at[k] - dst_box[k].begin) * dst_stride[k];
    }
    std::memcpy(dst + doff, src + so, run);
    size_t k = dims - 1;  // advance the counter over all dimensions but the last
    for (;;) {
      if (k == 0) return;
      --k;
      if (++at[k] < box[k].end) break;
      at[k] = box[k].begin;
    }
  }
}

// When `slice` lies inside `region` and its bytes are one contiguous run of the region's
// row-major layout, the byte offset of that run; otherwise -1.
int64_t contiguous_offset(const std::vector<Range>& slice, const std::vector<Range>& region,
                          size_t element) {
  const size_t dims = region.size();
  size_t k = dims;  // dims after k must be full; dims before k must have extent 1
  while (k > 0 && slice[k - 1] == region[k - 1])
    --k;
  for (size_t d = 0; d + 1 < k; ++d)
    if (slice[d].size() != 1) return -1;
  for (size_t d = 0; d < dims; ++d)
    if (slice[d].begin < region[d].begin || slice[d].end > region[d].end) return -1;
  int64_t offset = 0, stride = static_cast<int64_t>(element);
  for (size_t d = dims; d-- > 0;) {
    offset += (slice[d].begin - region[d].begin) * stride;
    stride *= region[d].size();
  }
  return offset;
}

}  // namespace

CheckpointReader CheckpointReader::open(const fs::path& step_dir) {
  CheckpointReader reader;
  reader.dir_ = step_dir;
  const fs::path manifest_path = step_dir / kManifestFile;
  std::error_code ec;
  if (!fs::exists(manifest_path, ec))
    throw CheckpointError(
        fmt::format("{} is missing: {} is not a complete checkpoint (a save that "
                    "never finished); use an earlier one",
                    manifest_path.string(), step_dir.string()));
  std::string text;
  try {
    text = io::read_small_file(manifest_path, kMaxManifestBytes, "checkpoint manifest");
  } catch (const CheckpointError& e) {
    throw CheckpointError(fmt::format("{}; {}", e.what(), corrupt_hint()));
  }
  reader.manifest_ = parse_manifest(text, manifest_path.string());
  for (const auto& [name, entry] : reader.manifest_.files) {
    const fs::path path = step_dir / name;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
      throw CheckpointError(fmt::format("shard file {} listed in {} is missing; {}", path.string(),
                                        manifest_path.string(), corrupt_hint()));
    // Only checked here; each read opens the file again without blocking (File::open_read), so
    // a FIFO put in its place later is refused, never waited on.
    if (!S_ISREG(st.st_mode))
      throw CheckpointError(fmt::format("shard file {} is {}, not a regular file; {}",
                                        path.string(), files::file_type_name(st.st_mode),
                                        corrupt_hint()));
    if (static_cast<uint64_t>(st.st_size) != entry.bytes)
      throw CheckpointError(
          fmt::format("shard file {} has {} bytes but {} says {} (truncated?); {}", path.string(),
                      st.st_size, manifest_path.string(), entry.bytes, corrupt_hint()));
  }
  return reader;
}

const TensorEntry& CheckpointReader::tensor(std::string_view name) const {
  if (const TensorEntry* t = manifest_.find(name)) return *t;
  throw CheckpointError(
      fmt::format("checkpoint {} has no tensor '{}' ({} tensors; `trainctl ckpt "
                  "inspect` lists them): was it saved by another model shape?",
                  dir_.string(), name, manifest_.tensors.size()));
}

const io::File& CheckpointReader::file(const std::string& name) const {
  auto it = files_.find(name);
  if (it == files_.end()) {
    it = files_.emplace(name, io::File::open_read(dir_ / name)).first;
    it->second.advise_sequential();
  }
  return it->second;
}

void CheckpointReader::read_slice(const TensorEntry& t, const SliceRecord& s, void* dst) const {
  const io::File& f = file(s.file);
  auto* out = static_cast<char*>(dst);
  // Large reads straight into dst; each chunk is checksummed on another thread while the next
  // one is read, so the checksum costs (almost) no time beyond the read itself.
  uint32_t crc = 0;
  std::future<uint32_t> pending;
  uint64_t pending_bytes = 0;
  for (uint64_t done = 0; done < s.length;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kReadChunk, s.length - done));
    f.read_exact(out + done, n, s.offset + done);
    if (pending.valid()) crc = tensor::crc32c_combine(crc, pending.get(), pending_bytes);
    const char* chunk = out + done;
    if (done + n < s.length)
      pending = std::async(std::launch::async, [chunk, n] { return tensor::crc32c(chunk, n); });
    else  // the last chunk: nothing left to overlap it with
      crc = tensor::crc32c_combine(crc, tensor::crc32c(chunk, n), n);
    pending_bytes = n;
    done += n;
  }
  if (crc != s.crc32c)
    throw CheckpointError(fmt::format(
        "checksum mismatch in {}: tensor '{}' slice {} (bytes {}..{}) has crc32c {:#010x}, the "
        "manifest says {:#010x}; {}",
        (dir_ / s.file).string(), t.name, format_index(s.index), s.offset, s.offset + s.length, crc,
        s.crc32c, corrupt_hint()));
}

void CheckpointReader::read(std::string_view name, DType dtype, void* dst) const {
  const TensorEntry& t = tensor(name);
  std::vector<Range> whole;
  for (int64_t d : t.shape)
    whole.push_back({0, d});
  read(name, whole, dtype, dst);
}

void CheckpointReader::read(std::string_view name, const std::vector<Range>& region, DType dtype,
                            void* dst) const {
  const TensorEntry& t = tensor(name);
  if (dtype != t.dtype)
    throw CheckpointError(fmt::format("tensor '{}' in {} is stored as {}, not {}", t.name,
                                      dir_.string(), tensor::dtype_name(t.dtype),
                                      tensor::dtype_name(dtype)));
  bool empty = false;
  if (region.size() != t.shape.size())
    throw CheckpointError(fmt::format("read '{}': region {} has {} dimensions, the tensor {}",
                                      t.name, format_index(region), region.size(), t.shape.size()));
  for (size_t d = 0; d < region.size(); ++d) {
    if (region[d].begin < 0 || region[d].begin > region[d].end || region[d].end > t.shape[d])
      throw CheckpointError(fmt::format("read '{}': region {} is outside dimension {} of size {}",
                                        t.name, format_index(region), d, t.shape[d]));
    empty = empty || region[d].size() == 0;
  }
  if (empty) return;
  const size_t element = tensor::dtype_size(t.dtype);
  std::vector<char> scratch;
  for (const SliceRecord& s : t.slices) {
    std::vector<Range> box(region.size());
    bool intersects = true;
    for (size_t d = 0; d < region.size(); ++d) {
      box[d] = {std::max(region[d].begin, s.index[d].begin),
                std::min(region[d].end, s.index[d].end)};
      intersects = intersects && box[d].begin < box[d].end;
    }
    if (!intersects) continue;
    const int64_t direct = contiguous_offset(s.index, region, element);
    if (direct >= 0) {  // the slice is one run of dst: read it in place
      read_slice(t, s, static_cast<char*>(dst) + direct);
      continue;
    }
    scratch.resize(static_cast<size_t>(s.length));  // bounded: validated against the file size
    read_slice(t, s, scratch.data());
    copy_box(scratch.data(), s.index, static_cast<char*>(dst), region, box, element);
  }
}

void CheckpointReader::verify() const {
  struct Piece {
    uint64_t offset, length;
    const TensorEntry* tensor;
    const SliceRecord* slice;
  };
  std::map<std::string, std::vector<Piece>> by_file;
  for (const auto& t : manifest_.tensors)
    for (const auto& s : t.slices)
      by_file[s.file].push_back({s.offset, s.length, &t, &s});
  std::vector<char> buffer(kReadChunk);
  for (const auto& [name, entry] : manifest_.files) {
    const fs::path path = dir_ / name;
    const io::File& f = file(name);
    char header[kShardHeaderBytes];
    f.read_exact(header, sizeof header, 0);
    if (std::memcmp(header, kShardMagic, sizeof kShardMagic) != 0)
      throw CheckpointError(fmt::format("{} is not a trainctl shard file (bad magic); {}",
                                        path.string(), corrupt_hint()));
    uint32_t version = 0;
    std::memcpy(&version, header + 8, 4);
    if (version != static_cast<uint32_t>(kFormatVersion))
      throw CheckpointError(fmt::format("{} has shard format version {} (this build reads {}); {}",
                                        path.string(), version, kFormatVersion, corrupt_hint()));
    // Stream the file once, as gaps and slices in offset order (validated not to overlap).
    std::vector<Piece> pieces = by_file[name];
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
    std::vector<Piece> stream;
    uint64_t at = 0;
    for (const Piece& p : pieces) {
      if (p.offset > at) stream.push_back({at, p.offset - at, nullptr, nullptr});
      stream.push_back(p);
      at = p.offset + p.length;
    }
    if (entry.bytes > at) stream.push_back({at, entry.bytes - at, nullptr, nullptr});
    uint32_t file_crc = 0;
    for (const Piece& p : stream) {
      uint32_t crc = 0;
      for (uint64_t done = 0; done < p.length;) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(buffer.size(), p.length - done));
        f.read_exact(buffer.data(), n, p.offset + done);
        crc = tensor::crc32c(buffer.data(), n, crc);
        done += n;
      }
      if (p.slice && crc != p.slice->crc32c)
        throw CheckpointError(fmt::format(
            "checksum mismatch in {}: tensor '{}' slice {} (bytes {}..{}) has crc32c {:#010x}, the "
            "manifest says {:#010x}; {}",
            path.string(), p.tensor->name, format_index(p.slice->index), p.offset,
            p.offset + p.length, crc, p.slice->crc32c, corrupt_hint()));
      file_crc = tensor::crc32c_combine(file_crc, crc, p.length);
    }
    if (f.size() != entry.bytes)
      throw CheckpointError(
          fmt::format("{} changed size while being verified; {}", path.string(), corrupt_hint()));
    if (file_crc != entry.crc32c)
      throw CheckpointError(
          fmt::format("checksum mismatch in {} (outside any tensor's bytes): "
                      "crc32c {:#010x}, the manifest says {:#010x}; {}",
                      path.string(), file_crc, entry.crc32c, corrupt_hint()));
  }
}

}  // namespace trainctl::ckpt
