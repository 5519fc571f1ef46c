#include <glob.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "data/sources.hpp"

namespace trainctl::data {

static_assert(std::endian::native == std::endian::little,
              "llm.c shards are little-endian; reading them on a big-endian host needs byte swaps");

namespace {

struct ShardHeader {
  int64_t num_tokens;
  int32_t version;
};

// Checks one opened shard against the llm.c layout and returns its token count and version.
ShardHeader validate_shard(const detail::DataFile& file) {
  using S = LlmcShardSource;
  const auto file_bytes = static_cast<int64_t>(file.size());
  if (file_bytes < S::kHeaderBytes) {
    throw DataError(fmt::format(
        "{}: not an llm.c token shard: {} bytes is shorter than the {}-byte header; re-create it "
        "with llm.c's data scripts or scripts/make-llmc-shard",
        file.path(), file_bytes, S::kHeaderBytes));
  }
  int32_t header[S::kHeaderInts];
  file.read(0, sizeof(header), header);
  if (header[0] != S::kMagic) {
    throw DataError(fmt::format(
        "{}: not an llm.c token shard: header[0] is {}, expected the magic number {}; point the "
        "data path at llm.c .bin shards",
        file.path(), header[0], S::kMagic));
  }
  if (header[1] != S::kVersion && header[1] != S::kVersion2) {
    throw DataError(fmt::format(
        "{}: llm.c shard version {} is not supported (version {}: uint16 GPT-2 tokens, version "
        "{}: uint32 Llama 3 tokens); re-create the shard with llm.c's data scripts",
        file.path(), header[1], S::kVersion, S::kVersion2));
  }
  const int64_t num_tokens = header[2];
  if (num_tokens < 1) {
    throw DataError(
        fmt::format("{}: llm.c shard header says {} tokens; a shard must hold at least one token",
                    file.path(), num_tokens));
  }
  const int64_t token_bytes = header[1] == S::kVersion ? 2 : 4;
  const int64_t expected_bytes = S::kHeaderBytes + token_bytes * num_tokens;
  if (file_bytes < expected_bytes) {
    throw DataError(fmt::format(
        "{}: truncated llm.c shard: the header says {} tokens ({} bytes with the header) but the "
        "file has {} bytes; re-create or re-download the shard",
        file.path(), num_tokens, expected_bytes, file_bytes));
  }
  if (file_bytes > expected_bytes) {
    throw DataError(fmt::format(
        "{}: llm.c shard has {} bytes after its {} tokens (expected {} bytes, the file has {}); "
        "re-create the shard",
        file.path(), file_bytes - expected_bytes, num_tokens, expected_bytes, file_bytes));
  }
  return {num_tokens, header[1]};
}

// Version 2 ids are uint32; an id above int32's range cannot be a vocabulary index, so it is
// refused here rather than wrapping to a negative id.
void read_uint32_ids(const detail::DataFile& file, uint64_t offset, int64_t count, int32_t* out) {
  file.read_ids<int32_t>(offset, count, out);
  for (int64_t i = 0; i < count; ++i)
    if (out[i] < 0)
      throw DataError(fmt::format(
          "{}: token {} is {}, above any vocabulary (ids are uint32 in version 2 shards); the "
          "shard is corrupt: re-create it",
          file.path(),
          (offset - static_cast<uint64_t>(LlmcShardSource::kHeaderBytes)) / 4 +
              static_cast<uint64_t>(i),
          static_cast<uint32_t>(out[i])));
}

}  // namespace

LlmcShardSource::LlmcShardSource(const std::vector<std::string>& paths) {
  if (paths.empty()) {
    throw DataError("llm.c shards: no shard files given; give a path or glob pattern that matches");
  }
  shards_.reserve(paths.size());
  for (const std::string& path : paths) {
    detail::DataFile file(path);
    const auto [num_tokens, version] = validate_shard(file);
    if (shards_.empty()) {
      version_ = version;
    } else if (version != version_) {
      throw DataError(fmt::format(
          "{}: llm.c shard version {} among shards of version {} (first: {}); every shard of one "
          "dataset must hold the same token type: use shards of one tokenizer",
          path, version, version_, shards_.front().path()));
    }
    first_token_.push_back(total_tokens_);
    total_tokens_ += num_tokens;
    shards_.push_back(std::move(file));
  }
}

void LlmcShardSource::read(int64_t offset, int64_t count, int32_t* out) const {
  check_range(offset, count);
  size_t shard = shard_of(offset);
  while (count > 0) {
    const int64_t shard_end =
        shard + 1 < first_token_.size() ? first_token_[shard + 1] : total_tokens_;
    const int64_t local = offset - first_token_[shard];
    const int64_t take = std::min(count, shard_end - offset);
    if (version_ == kVersion)
      shards_[shard].read_ids<uint16_t>(static_cast<uint64_t>(kHeaderBytes + 2 * local), take, out);
    else
      read_uint32_ids(shards_[shard], static_cast<uint64_t>(kHeaderBytes + 4 * local), take, out);
    out += take;
    offset += take;
    count -= take;
    ++shard;
  }
}

size_t LlmcShardSource::shard_of(int64_t offset) const {
  // The last shard whose first token is <= offset.
  return static_cast<size_t>(std::upper_bound(first_token_.begin(), first_token_.end(), offset) -
                             first_token_.begin() - 1);
}

std::string LlmcShardSource::where(int64_t offset) const {
  if (offset < 0 || offset >= total_tokens_) return TokenSource::where(offset);
  const size_t shard = shard_of(offset);
  return fmt::format("{}, token {}", shards_[shard].path(), offset - first_token_[shard]);
}

std::vector<SourceFile> LlmcShardSource::files() const {
  std::vector<SourceFile> out;
  for (const detail::DataFile& shard : shards_)
    out.push_back({shard.path(), shard.size()});
  return out;
}

std::string LlmcShardSource::describe() const {
  const char* kind = version_ == kVersion ? "" : " (version 2, uint32)";
  if (shards_.size() == 1) {
    return fmt::format("llm.c shard {}{} ({} tokens)", shards_.front().path(), kind, total_tokens_);
  }
  return fmt::format("llm.c shards {} .. {}{} ({} files, {} tokens)", shards_.front().path(),
                     shards_.back().path(), kind, shards_.size(), total_tokens_);
}

std::vector<std::string> expand_shard_pattern(const std::string& pattern) {
  glob_t matches{};
  const int status = ::glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> paths;
  if (status == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i)
      paths.emplace_back(matches.gl_pathv[i]);
  }
  ::globfree(&matches);
  if (status == GLOB_NOMATCH || (status == 0 && paths.empty())) {
    throw DataError(fmt::format(
        "{}: no file matches this data path; check the path or glob pattern (relative paths are "
        "taken from the working directory)",
        pattern));
  }
  if (status != 0) {
    throw DataError(
        fmt::format("{}: cannot expand the data path (glob error {})", pattern, status));
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace trainctl::data
