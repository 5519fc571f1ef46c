// Formatting helpers, MemoryReport and MFU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "telemetry/telemetry.hpp"

using namespace trainctl::telemetry;

TEST_CASE("format_bytes uses binary units with one decimal") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1024) == "1.0 KiB");
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_bytes(12'897'485) == "12.3 MiB");
  CHECK(format_bytes(1024ULL * 1024 - 1) == "1.0 MiB");  // never "1024.0 KiB"
  CHECK(format_bytes(80ULL << 30) == "80.0 GiB");
  CHECK(format_bytes(std::numeric_limits<std::uint64_t>::max()) == "16.0 EiB");
}

TEST_CASE("format_duration prints H:MM:SS") {
  CHECK(format_duration(0) == "0:00:00");
  CHECK(format_duration(83) == "0:01:23");
  CHECK(format_duration(3723) == "1:02:03");
  CHECK(format_duration(59.6) == "0:01:00");
  CHECK(format_duration(90000) == "25:00:00");
  CHECK(format_duration(-1) == "?:??:??");
  CHECK(format_duration(std::nan("")) == "?:??:??");
  CHECK(format_duration(std::numeric_limits<double>::infinity()) == "?:??:??");
}

TEST_CASE("format_count groups thousands") {
  CHECK(format_count(0) == "0");
  CHECK(format_count(999) == "999");
  CHECK(format_count(1000) == "1,000");
  CHECK(format_count(12345) == "12,345");
  CHECK(format_count(1234567) == "1,234,567");
}

TEST_CASE("MemoryReport totals, tabulates and serializes its categories") {
  MemoryReport report;
  report.params = 4ULL << 20;
  report.grads = 4ULL << 20;
  report.optimizer = 8ULL << 20;
  report.activations = 3ULL << 20;
  report.comm = 1ULL << 20;
  report.other = 0;
  CHECK(report.total() == 20ULL << 20);
  CHECK(report.to_string() ==
        "params           4.0 MiB    20.0%\n"
        "grads            4.0 MiB    20.0%\n"
        "optimizer        8.0 MiB    40.0%\n"
        "activations      3.0 MiB    15.0%\n"
        "comm             1.0 MiB     5.0%\n"
        "other                0 B     0.0%\n"
        "total           20.0 MiB   100.0%\n");
  const nlohmann::json json = report.to_json();
  CHECK(json["params"] == 4ULL << 20);
  CHECK(json["optimizer"] == 8ULL << 20);
  CHECK(json["other"] == 0);
  CHECK(json["total"] == 20ULL << 20);
  CHECK(json.size() == 7);
  CHECK(MemoryReport{}.to_string().find("total                0 B     0.0%\n") !=
        std::string::npos);
}

TEST_CASE("MemoryReport beside a planned one: both columns and their ratio") {
  MemoryReport used, planned;
  used.params = 1024;
  used.grads = 3072;
  planned.params = 1024;
  planned.grads = 2048;
  planned.other = 512;
  const std::string table = used.to_string(planned);
  CHECK(table.find("used") != std::string::npos);
  CHECK(table.find("planned") != std::string::npos);
  CHECK(table.find("params           1.0 KiB    25.0%     1.0 KiB   1.000\n") != std::string::npos);
  CHECK(table.find("grads            3.0 KiB    75.0%     2.0 KiB   1.500\n") != std::string::npos);
  CHECK(table.find("optimizer            0 B     0.0%         0 B       -\n") != std::string::npos);
  CHECK(table.find("total            4.0 KiB   100.0%     3.5 KiB   1.143\n") != std::string::npos);
}

TEST_CASE("MemoryReport total refuses to overflow") {
  MemoryReport report;
  report.params = std::numeric_limits<std::uint64_t>::max();
  report.grads = 1;
  CHECK_THROWS_WITH(report.total(), Catch::Contains("grads"));
}

TEST_CASE("mfu is achieved over peak FLOP/s") {
  // 6 x 124M params per token, 100k tokens/s on a 989 TFLOP/s device.
  CHECK(mfu(6 * 124e6, 100e3, 989e12) == Approx(0.0752275).epsilon(1e-6));
  CHECK(mfu(1e9, 0, 1e12) == 0.0);
  CHECK_THROWS_WITH(mfu(1e9, 1e3, 0), Catch::Contains("peak"));
  CHECK_THROWS(mfu(1e9, 1e3, std::nan("")));
}
