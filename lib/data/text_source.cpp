#include <algorithm>

#include <fmt/format.h>

#include "data/sources.hpp"

namespace trainctl::data {

TextSource::TextSource(const std::string& path) : file_(path) {}

void TextSource::read(int64_t offset, int64_t count, int32_t* out) const {
  check_range(offset, count);
  unsigned char bytes[16384];
  while (count > 0) {
    const int64_t take = std::min<int64_t>(count, sizeof bytes);
    file_.read(static_cast<uint64_t>(offset), static_cast<size_t>(take), bytes);
    for (int64_t i = 0; i < take; ++i)
      out[i] = bytes[i];
    out += take;
    offset += take;
    count -= take;
  }
}

std::string TextSource::where(int64_t offset) const {
  return fmt::format("{}, byte {}", file_.path(), offset);
}

std::string TextSource::describe() const {
  return fmt::format("text {} ({} bytes)", file_.path(), file_.size());
}

}  // namespace trainctl::data
