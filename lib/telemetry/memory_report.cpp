#include "telemetry/memory_report.hpp"

#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "telemetry/format.hpp"

namespace trainctl::telemetry {

std::array<std::pair<std::string_view, std::uint64_t>, 6> MemoryReport::categories() const {
  return {{{"params", params},
           {"grads", grads},
           {"optimizer", optimizer},
           {"activations", activations},
           {"comm", comm},
           {"other", other}}};
}

std::uint64_t MemoryReport::total() const {
  std::uint64_t sum = 0;
  for (const auto& [name, bytes] : categories()) {
    if (bytes > std::numeric_limits<std::uint64_t>::max() - sum) {
      throw std::overflow_error(fmt::format(
          "memory report total overflows 64 bits at category '{}' (a byte count is corrupt)",
          name));
    }
    sum += bytes;
  }
  return sum;
}

std::string MemoryReport::to_string() const {
  const std::uint64_t sum = total();
  const auto line = [sum](std::string_view name, std::uint64_t bytes) {
    const double percent = sum == 0 ? 0.0 : 100.0 * static_cast<double>(bytes) / sum;
    return fmt::format("{:<12}{:>12}{:>8.1f}%\n", name, format_bytes(bytes), percent);
  };
  std::string out;
  for (const auto& [name, bytes] : categories())
    out += line(name, bytes);
  out += line("total", sum);
  return out;
}

std::string MemoryReport::to_string(const MemoryReport& planned) const {
  const std::uint64_t sum = total();
  const auto line = [sum](std::string_view name, std::uint64_t bytes, std::uint64_t plan) {
    const double percent = sum == 0 ? 0.0 : 100.0 * static_cast<double>(bytes) / sum;
    const std::string ratio =
        plan == 0 ? std::string("-")
                  : fmt::format("{:.3f}", static_cast<double>(bytes) / static_cast<double>(plan));
    return fmt::format("{:<12}{:>12}{:>8.1f}%{:>12}{:>8}\n", name, format_bytes(bytes), percent,
                       format_bytes(plan), ratio);
  };
  std::string out =
      fmt::format("{:<12}{:>12}{:>9}{:>12}{:>8}\n", "", "used", "", "planned", "ratio");
  const auto plans = planned.categories();
  size_t i = 0;
  for (const auto& [name, bytes] : categories())
    out += line(name, bytes, plans[i++].second);
  out += line("total", sum, planned.total());
  return out;
}

nlohmann::json MemoryReport::to_json() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, bytes] : categories())
    out[std::string(name)] = bytes;
  out["total"] = total();
  return out;
}

}  // namespace trainctl::telemetry
