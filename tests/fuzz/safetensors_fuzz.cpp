// libFuzzer target: bytes as a whole safetensors file -> the header checks model.init_from relies
// on (parse_safetensors_header, after the 8-byte length as lib/ckpt/weights.cpp reads it).
// Findings: any exception other than WeightsError, a crash, a sanitizer report, a timeout, or a
// broken invariant (abort) of an accepted header:
//   - every tensor's bytes lie inside the data section and match dtype size x shape;
//   - no two tensors with data overlap.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/weights.hpp"

using namespace trainctl::ckpt;

namespace {

[[noreturn]] void broken(const char* what, const std::string& detail) {
  std::fprintf(stderr, "safetensors_fuzz: invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i)
    length = length << 8 | data[i];
  if (length > size - 8) return 0;  // the reader refuses this before parsing (file size known)
  const std::string_view header(reinterpret_cast<const char*>(data) + 8, length);
  const uint64_t data_bytes = size - 8 - length;
  std::map<std::string, SafetensorsTensor> tensors;
  try {
    tensors = parse_safetensors_header(header, data_bytes, "fuzz.safetensors");
  } catch (const WeightsError&) {
    return 0;
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, t] : tensors) {
    uint64_t bytes = dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) broken("negative extent", name);
      bytes *= static_cast<uint64_t>(d);
    }
    if (t.begin > t.end || t.end > data_bytes || t.end - t.begin != bytes)
      broken("accepted offsets do not hold the tensor", name);
    if (t.end > t.begin) ranges.emplace_back(t.begin, t.end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i - 1].second > ranges[i].first) broken("accepted overlapping tensors", "");
  return 0;
}
