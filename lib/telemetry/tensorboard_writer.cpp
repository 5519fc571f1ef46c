#include "telemetry/tensorboard_writer.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

#include "telemetry/tfrecord.hpp"

namespace trainctl::telemetry {
namespace {

double now_unix_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    throw std::runtime_error(fmt::format(
        "cannot create TensorBoard directory {}: {} (check the run directory and its permissions)",
        dir.string(), error.message()));
  }
  const double wall_time = now_unix_seconds();
  const std::string prefix =
      fmt::format("events.out.tfevents.{}.{}.{}.", static_cast<std::int64_t>(wall_time),
                  host_name(), static_cast<long>(getpid()));
  // "x" (C11, glibc): fail instead of truncating a file that already exists.
  for (int n = 0; file_ == nullptr; ++n) {
    path_ = dir / (prefix + std::to_string(n));
    file_ = std::fopen(path_.c_str(), "wbx");
    if (file_ == nullptr && (errno != EEXIST || n >= 1000)) {
      throw std::runtime_error(fmt::format(
          "cannot create TensorBoard event file {}: {} (check the run directory and its "
          "permissions)",
          path_.string(), std::strerror(errno)));
    }
  }
  write_record(encode_file_version_event(wall_time));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);  // fclose flushes; errors cannot be reported here
}

void TensorBoardWriter::add_scalar(const std::string& tag, std::int64_t step, double value) {
  add_scalars(step, {{tag, value}});
}

void TensorBoardWriter::add_scalars(std::int64_t step,
                                    const std::vector<std::pair<std::string, double>>& scalars) {
  std::vector<std::pair<std::string, float>> rounded;
  rounded.reserve(scalars.size());
  for (const auto& [tag, value] : scalars)
    rounded.emplace_back(tag, static_cast<float>(value));
  write_record(encode_scalars_event(now_unix_seconds(), step, rounded));
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0) {
    throw std::runtime_error(fmt::format("cannot write TensorBoard event file {}: {}",
                                         path_.string(), std::strerror(errno)));
  }
}

void TensorBoardWriter::write_record(const std::string& event) {
  const std::string record = encode_tfrecord(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    throw std::runtime_error(
        fmt::format("cannot write TensorBoard event file {}: {} (is the disk full?)",
                    path_.string(), std::strerror(errno)));
  }
}

}  // namespace trainctl::telemetry
