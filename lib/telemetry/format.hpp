// Human-readable numbers for progress lines and reports, plus model FLOPs utilization.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace trainctl::telemetry {

// Binary units with one decimal: 512 -> "512 B", 12'897'485 -> "12.3 MiB", up to EiB.
std::string format_bytes(std::uint64_t bytes);

// H:MM:SS, rounded to the nearest second; hours are not wrapped into days:
// 83 -> "0:01:23", 3723 -> "1:02:03", 90000 -> "25:00:00". Negative or non-finite -> "?:??:??"
// (an ETA that cannot be estimated yet).
std::string format_duration(double seconds);

// Thousands separators: 12345 -> "12,345".
std::string format_count(std::uint64_t count);

// Text for an XML or HTML page: & < > " as entities.
std::string escape_xml(std::string_view text);

// Model FLOPs utilization: achieved flops (flops_per_token * tokens_per_s) over peak_flops, as a
// fraction (0.42 = 42%). flops_per_token counts forward + backward (about 6 * parameters for a
// dense transformer, plus attention). Throws std::invalid_argument when peak_flops is not a
// positive finite number (the device's peak is unknown: report no MFU rather than a wrong one).
double mfu(double flops_per_token, double tokens_per_s, double peak_flops);

}  // namespace trainctl::telemetry
