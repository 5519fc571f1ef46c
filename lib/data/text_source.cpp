#include <fmt/format.h>

#include "data/sources.hpp"

namespace trainctl::data {

TextSource::TextSource(const std::string& path) : file_(path) {}

void TextSource::read(int64_t offset, int64_t count, int32_t* out) const {
  check_range(offset, count);
  file_.read_ids<uint8_t>(static_cast<uint64_t>(offset), count, out);
}

std::string TextSource::where(int64_t offset) const {
  return fmt::format("{}, byte {}", file_.path(), offset);
}

std::string TextSource::describe() const {
  return fmt::format("text {} ({} bytes)", file_.path(), file_.size());
}

}  // namespace trainctl::data
