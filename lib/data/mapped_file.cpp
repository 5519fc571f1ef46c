#include "data/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "data/token_source.hpp"

namespace trainctl::data::detail {

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw DataError(
        fmt::format("{}: cannot open data file: {}; check the path (relative paths are "
                    "taken from the working directory)",
                    path_, std::strerror(err)));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw DataError(fmt::format("{}: not a regular file; point the data path at a file", path_));
  }
  size_ = static_cast<size_t>(info.st_size);
  if (size_ == 0) {
    ::close(fd);
    throw DataError(fmt::format(
        "{}: the file is empty; give a data file that holds at least one token", path_));
  }
  void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (mapped == MAP_FAILED) {
    throw DataError(fmt::format("{}: cannot memory-map the file: {}", path_, std::strerror(err)));
  }
  data_ = static_cast<const unsigned char*>(mapped);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
}

}  // namespace trainctl::data::detail
