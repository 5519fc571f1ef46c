#include "prepare/inputs.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "files/files.hpp"

namespace trainctl::prepare {
namespace {

namespace fs = std::filesystem;

constexpr size_t kReadBytes = size_t{1} << 20;

// The format of a file by its name; false for names data prepare does not read.
bool classify(const std::string& name, InputFile& out) {
  std::string base = name;
  out.compression = Compression::none;
  if (base.ends_with(".gz")) {
    out.compression = Compression::gzip;
    base.resize(base.size() - 3);
  } else if (base.ends_with(".zst")) {
    out.compression = Compression::zstd;
    base.resize(base.size() - 4);
  }
  if (base.ends_with(".txt")) {
    out.format = InputFormat::text;
    return true;
  }
  if (base.ends_with(".jsonl") || base.ends_with(".json")) {
    out.format = InputFormat::jsonl;
    return true;
  }
  return false;
}

constexpr const char* kFormats = ".txt, .jsonl or .json, each optionally .gz or .zst";

}  // namespace

std::vector<InputFile> list_inputs(const std::vector<std::string>& paths) {
  if (paths.empty()) throw PrepareError("no input given; name text or JSON Lines files or folders");
  std::vector<InputFile> inputs;
  for (const std::string& path : paths) {
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    if (status.type() == fs::file_type::not_found)
      throw PrepareError(fmt::format("{}: no such file or folder", path));
    if (ec) throw PrepareError(fmt::format("{}: cannot be read ({})", path, ec.message()));
    if (fs::is_directory(status)) {
      std::vector<InputFile> found;
      for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
        InputFile input;
        if (!it->is_regular_file(ec) || !classify(it->path().filename().string(), input)) continue;
        input.path = it->path().string();
        found.push_back(std::move(input));
      }
      if (ec)
        throw PrepareError(fmt::format("{}: cannot list the folder ({})", path, ec.message()));
      if (found.empty())
        throw PrepareError(fmt::format("{}: the folder holds no input file ({})", path, kFormats));
      std::sort(found.begin(), found.end(),
                [](const InputFile& a, const InputFile& b) { return a.path < b.path; });
      inputs.insert(inputs.end(), found.begin(), found.end());
      continue;
    }
    InputFile input;
    if (!classify(fs::path(path).filename().string(), input))
      throw PrepareError(
          fmt::format("{}: data prepare reads {}; rename the file or convert it", path, kFormats));
    if (!fs::is_regular_file(status))
      throw PrepareError(fmt::format("{}: not a regular file", path));
    input.path = path;
    inputs.push_back(std::move(input));
  }
  std::set<std::string> seen;
  for (InputFile& input : inputs) {
    std::error_code ec;
    const std::string canonical = fs::weakly_canonical(input.path, ec).string();
    if (!seen.insert(ec ? input.path : canonical).second)
      throw PrepareError(fmt::format(
          "{}: named twice among the inputs (directly or inside a folder); name it once",
          input.path));
    input.bytes = fs::file_size(input.path, ec);
    if (ec) throw PrepareError(fmt::format("{}: cannot be read ({})", input.path, ec.message()));
  }
  return inputs;
}

// ---- decompressing streams --------------------------------------------------------------------

class RecordReader::Stream {
 public:
  virtual ~Stream() = default;
  // Appends up to kReadBytes decompressed bytes to out; returns false at the end.
  virtual bool read(std::string& out) = 0;
  uint64_t consumed = 0;  // bytes of the file read so far
};

namespace {

class PlainStream final : public RecordReader::Stream {
 public:
  explicit PlainStream(const std::string& path) : path_(path) {
    try {
      fd_ = files::open_regular(path, "input");
    } catch (const files::FileError& e) {
      throw PrepareError(e.what());
    }
  }
  bool read(std::string& out) override { return read_some(out, kReadBytes); }

 protected:
  bool read_some(std::string& out, size_t bytes) {
    const size_t at = out.size();
    out.resize(at + bytes);
    ssize_t got = 0;
    do {
      got = ::read(fd_.get(), out.data() + at, bytes);
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
      out.resize(at);
      throw PrepareError(files::os_error_message("read", path_, errno));
    }
    out.resize(at + static_cast<size_t>(got));
    consumed += static_cast<uint64_t>(got);
    return got > 0;
  }

  std::string path_;
  files::UniqueFd fd_;
};

class GzipStream final : public RecordReader::Stream {
 public:
  explicit GzipStream(const std::string& path) : path_(path) {
    files::UniqueFd fd;
    try {
      fd = files::open_regular(path, "input");
    } catch (const files::FileError& e) {
      throw PrepareError(e.what());
    }
    file_ = gzdopen(fd.release(), "rb");
    if (file_ == nullptr) throw PrepareError(fmt::format("{}: cannot open as gzip", path));
    gzbuffer(file_, 1 << 17);
  }
  ~GzipStream() override { gzclose(file_); }
  bool read(std::string& out) override {
    const size_t at = out.size();
    out.resize(at + kReadBytes);
    const int got = gzread(file_, out.data() + at, static_cast<unsigned>(kReadBytes));
    if (got < 0) {
      int code = 0;
      const char* message = gzerror(file_, &code);
      out.resize(at);
      throw PrepareError(
          fmt::format("{}: corrupt gzip data ({}); recompress or re-download it", path_, message));
    }
    out.resize(at + static_cast<size_t>(got));
    consumed = static_cast<uint64_t>(gzoffset(file_));
    return got > 0;
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

class ZstdStream final : public RecordReader::Stream {
 public:
  explicit ZstdStream(const std::string& path) : raw_(path), path_(path) {
    context_ = ZSTD_createDStream();
    ZSTD_initDStream(context_);
  }
  ~ZstdStream() override { ZSTD_freeDStream(context_); }
  bool read(std::string& out) override {
    for (;;) {
      if (in_.pos == in_.size) {
        compressed_.clear();
        if (!raw_.read(compressed_)) {
          if (!frame_done_)
            throw PrepareError(
                fmt::format("{}: the zstd data ends inside a frame (truncated); "
                            "recompress or re-download it",
                            path_));
          return false;
        }
        consumed = raw_.consumed;
        in_ = {compressed_.data(), compressed_.size(), 0};
      }
      const size_t at = out.size();
      out.resize(at + kReadBytes);
      ZSTD_outBuffer output{out.data() + at, kReadBytes, 0};
      const size_t status = ZSTD_decompressStream(context_, &output, &in_);
      out.resize(at + output.pos);
      if (ZSTD_isError(status))
        throw PrepareError(fmt::format("{}: corrupt zstd data ({}); recompress or re-download it",
                                       path_, ZSTD_getErrorName(status)));
      frame_done_ = status == 0;
      if (output.pos > 0) return true;
    }
  }

 private:
  PlainStream raw_;
  std::string path_;
  ZSTD_DStream* context_ = nullptr;
  std::string compressed_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  bool frame_done_ = true;
};

}  // namespace

RecordReader::RecordReader(const InputFile& input, int32_t file_index)
    : input_(input), file_index_(file_index) {
  switch (input.compression) {
    case Compression::none:
      stream_ = std::make_unique<PlainStream>(input.path);
      break;
    case Compression::gzip:
      stream_ = std::make_unique<GzipStream>(input.path);
      break;
    case Compression::zstd:
      stream_ = std::make_unique<ZstdStream>(input.path);
      break;
  }
}

RecordReader::~RecordReader() = default;

uint64_t RecordReader::bytes_read() const {
  return stream_->consumed;
}

bool RecordReader::fill() {
  if (done_) return false;
  if (start_ > 0) {
    buffer_.erase(0, start_);
    start_ = 0;
  }
  if (!stream_->read(buffer_)) done_ = true;
  return !done_;
}

bool RecordReader::next(Record& record) {
  record.file = file_index_;
  if (input_.format == InputFormat::text) {
    if (done_ && buffer_.empty()) return false;
    while (fill()) {
    }
    record.text = std::move(buffer_);
    record.line = 0;
    buffer_.clear();
    start_ = 0;
    return true;
  }
  for (;;) {
    const size_t newline = buffer_.find('\n', start_);
    if (newline == std::string::npos) {
      if (fill()) continue;
      if (start_ >= buffer_.size()) return false;
      // The last line without a newline.
      record.text.assign(buffer_, start_);
      start_ = buffer_.size();
    } else {
      record.text.assign(buffer_, start_, newline - start_);
      start_ = newline + 1;
    }
    ++line_;
    if (!record.text.empty() && record.text.back() == '\r') record.text.pop_back();
    if (record.text.find_first_not_of(" \t") == std::string::npos) continue;  // blank line
    record.line = line_;
    return true;
  }
}

}  // namespace trainctl::prepare
