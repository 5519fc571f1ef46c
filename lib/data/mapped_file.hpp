// Internal to lib/data: a read-only memory map of a whole file, so sources read windows without
// copying the file into memory and the OS page cache is shared between ranks on one node.
#pragma once

#include <cstddef>
#include <string>

namespace trainctl::data::detail {

class MappedFile {
 public:
  // Maps `path` read-only. Throws DataError naming the file when it is missing, unreadable or
  // empty (an empty file cannot be mapped and holds no tokens anyway).
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) = delete;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace trainctl::data::detail
