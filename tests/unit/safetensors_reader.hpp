// A small, independent safetensors reader for the export tests: it follows the format description
// (8-byte little-endian header length, JSON header, data) and checks the invariants a real reader
// checks (header length a multiple of 8, offsets contiguous from 0 to the end of the file), so a
// test fails if lib/ckpt/export.cpp writes a file the real `safetensors` package would refuse.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace safetensors_test {

struct Tensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
};

struct File {
  nlohmann::json metadata;
  std::map<std::string, Tensor> tensors;
  uint64_t header_bytes = 0;
};

inline File read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  const std::vector<unsigned char> all((std::istreambuf_iterator<char>(in)),
                                       std::istreambuf_iterator<char>());
  REQUIRE(all.size() >= 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | all[static_cast<size_t>(i)];
  REQUIRE(n % 8 == 0);
  REQUIRE(8 + n <= all.size());
  const nlohmann::json header =
      nlohmann::json::parse(std::string(all.begin() + 8, all.begin() + 8 + static_cast<long>(n)));
  File file;
  file.header_bytes = n;
  const size_t base = 8 + n;
  std::map<uint64_t, uint64_t> extents;  // begin -> end
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      file.metadata = entry;
      continue;
    }
    Tensor t{
        entry.at("dtype").get<std::string>(), entry.at("shape").get<std::vector<int64_t>>(), {}};
    const uint64_t begin = entry.at("data_offsets").at(0), end = entry.at("data_offsets").at(1);
    REQUIRE(begin <= end);
    REQUIRE(base + end <= all.size());
    extents[begin] = end;
    t.bytes.assign(all.begin() + static_cast<long>(base + begin),
                   all.begin() + static_cast<long>(base + end));
    file.tensors.emplace(name, std::move(t));
  }
  uint64_t at = 0;  // the data is covered exactly: no gaps, no overlaps, nothing after
  for (const auto& [begin, end] : extents) {
    REQUIRE(begin == at);
    at = end;
  }
  REQUIRE(base + at == all.size());
  return file;
}

}  // namespace safetensors_test
