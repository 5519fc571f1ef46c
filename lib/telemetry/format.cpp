#include "telemetry/format.hpp"

#include <array>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace trainctl::telemetry {

std::string format_bytes(std::uint64_t bytes) {
  constexpr std::array<const char*, 7> kUnits = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  // Move up while the value would print as 1024.0 or more in the current unit.
  while (value >= 1023.95 && unit + 1 < kUnits.size()) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?:??:??";
  const auto total = static_cast<std::uint64_t>(std::llround(seconds));
  return fmt::format("{}:{:02}:{:02}", total / 3600, (total / 60) % 60, total % 60);
}

std::string format_count(std::uint64_t count) {
  const std::string digits = std::to_string(count);
  std::string out;
  out.reserve(digits.size() + digits.size() / 3);
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string escape_xml(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

double mfu(double flops_per_token, double tokens_per_s, double peak_flops) {
  if (!std::isfinite(peak_flops) || peak_flops <= 0) {
    throw std::invalid_argument(fmt::format(
        "MFU needs the device's peak FLOP/s as a positive number, got {} (leave MFU out when the "
        "peak is unknown)",
        peak_flops));
  }
  return flops_per_token * tokens_per_s / peak_flops;
}

}  // namespace trainctl::telemetry
