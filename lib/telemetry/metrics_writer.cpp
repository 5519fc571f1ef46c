#include "telemetry/metrics_writer.hpp"

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <system_error>

#include <fmt/format.h>

namespace trainctl::telemetry {

MetricsWriter::MetricsWriter(const std::filesystem::path& path) : path_(path) {
  if (path.has_parent_path()) {
    std::error_code error;
    std::filesystem::create_directories(path.parent_path(), error);
    if (error) {
      throw std::runtime_error(fmt::format(
          "cannot create the directory of metrics file {}: {} (check the run directory)",
          path.string(), error.message()));
    }
  }
  file_ = std::fopen(path.c_str(), "ab");
  if (file_ == nullptr) {
    throw std::runtime_error(
        fmt::format("cannot open metrics file {} for appending: {} (check the run directory and "
                    "its permissions)",
                    path.string(), std::strerror(errno)));
  }
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!record.is_object()) {
    throw std::invalid_argument(
        fmt::format("metrics record for {} must be a JSON object, got a JSON {}", path_.string(),
                    record.type_name()));
  }
  // nlohmann::json serializes NaN and +-Infinity as null (the contract in the header relies on
  // that; a test checks it).
  std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  line.push_back('\n');
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    throw std::runtime_error(fmt::format("cannot write metrics file {}: {} (is the disk full?)",
                                         path_.string(), std::strerror(errno)));
  }
}

}  // namespace trainctl::telemetry
