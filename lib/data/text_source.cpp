#include <fmt/format.h>

#include "data/sources.hpp"

namespace trainctl::data {

TextSource::TextSource(const std::string& path) : file_(path) {}

void TextSource::read(int64_t offset, int64_t count, int32_t* out) const {
  check_range(offset, count);
  const unsigned char* bytes = file_.data() + offset;
  for (int64_t i = 0; i < count; ++i)
    out[i] = bytes[i];
}

std::string TextSource::describe() const {
  return fmt::format("text {} ({} bytes)", file_.path(), file_.size());
}

}  // namespace trainctl::data
