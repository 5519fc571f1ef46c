// Shared by the lib/data unit tests (data_*_test.cpp): a temporary folder, writers of text and
// llm.c shard files (broken ones included), the message of a DataError and a source's tokens.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "data/data.hpp"

namespace trainctl::data::test {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device device;
    path = fs::temp_directory_path() / ("trainctl_data_test_" + std::to_string(device()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// The message of the DataError `action` throws, or "(no DataError thrown)".
inline std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const DataError& error) {
    return error.what();
  }
  return "(no DataError thrown)";
}

// Every token of a source.
inline std::vector<int32_t> read_all(const TokenSource& source) {
  std::vector<int32_t> tokens(static_cast<size_t>(source.size()));
  source.read(0, source.size(), tokens.data());
  return tokens;
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Writes an llm.c shard: 256 int32 header then uint16 tokens. The header fields and the number of
// token bytes actually written can be overridden to make broken shards.
struct ShardSpec {
  int32_t magic = LlmcShardSource::kMagic;
  int32_t version = LlmcShardSource::kVersion;
  int64_t header_tokens = -1;  // -1: the real count
  int64_t drop_bytes = 0;      // bytes cut from the end
  int64_t extra_bytes = 0;     // zero bytes appended
};
inline void write_shard(const std::string& path, const std::vector<uint16_t>& tokens,
                        ShardSpec spec = {}) {
  std::array<int32_t, 256> header{};
  header[0] = spec.magic;
  header[1] = spec.version;
  header[2] = static_cast<int32_t>(spec.header_tokens >= 0 ? spec.header_tokens
                                                           : static_cast<int64_t>(tokens.size()));
  std::string bytes(reinterpret_cast<const char*>(header.data()), sizeof(header));
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  bytes.resize(bytes.size() - static_cast<size_t>(spec.drop_bytes));
  bytes.append(static_cast<size_t>(spec.extra_bytes), '\0');
  write_bytes(path, bytes);
}

}  // namespace trainctl::data::test
