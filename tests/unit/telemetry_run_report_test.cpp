// The run report's page (telemetry/run_report.hpp): readable axes that contain the data, charts
// only for what the run recorded, and text escaped for HTML.
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "telemetry/run_report.hpp"

using namespace trainctl::telemetry;

TEST_CASE("nice_axis ends on 1/2/5 x 10^k ticks that contain the data") {
  const Axis a = nice_axis(1, 200, 8);
  CHECK(a.step == 20);
  CHECK(a.low == 0);
  CHECK(a.high == 200);  // a value on a tick stays the end
  const Axis b = nice_axis(1.7871, 5.5402, 5);
  CHECK(b.step == 1);
  CHECK(b.low == 1);
  CHECK(b.high == 6);
  const Axis c = nice_axis(3e-4, 3e-3, 5);
  CHECK(c.step == Approx(5e-4));
  CHECK(c.low == 0);
  CHECK(c.high == Approx(3e-3));
  const Axis flat = nice_axis(2.5, 2.5);  // one value: widened so the axis has a length
  CHECK(flat.low < 2.5);
  CHECK(flat.high > 2.5);
  const Axis reversed = nice_axis(10, -10);
  CHECK(reversed.low == -10);
  CHECK(reversed.high == 10);
}

TEST_CASE("the report draws only what the run recorded, with its text escaped") {
  RunReportData d;
  d.name = "a<b>&\"c\"";
  d.loss = {{1, 5.0}, {2, 4.0}, {3, 3.5}};
  d.lr = {{1, 1e-3}, {2, 2e-3}, {3, 3e-3}};
  d.checkpoints = {2};
  const std::string page = render_run_report(d);
  CHECK(page.find("<h1>a&lt;b&gt;&amp;&quot;c&quot;</h1>") != std::string::npos);
  CHECK(page.find("data-chart=\"loss\"") != std::string::npos);
  CHECK(page.find("data-chart=\"lr\"") != std::string::npos);
  // No throughput, MFU or memory recorded: no empty charts for them.
  CHECK(page.find("data-chart=\"throughput\"") == std::string::npos);
  CHECK(page.find("data-chart=\"mfu\"") == std::string::npos);
  CHECK(page.find("data-chart=\"memory\"") == std::string::npos);
  CHECK(page.find("checkpoint at step 2") != std::string::npos);
  CHECK(page.find("<script") == std::string::npos);
  // Non-finite values (a skipped fp16 step) are left out, not drawn at infinity.
  d.loss.push_back({4, std::numeric_limits<double>::quiet_NaN()});
  CHECK(render_run_report(d).find("nan") == std::string::npos);
}

TEST_CASE("a long run's line keeps at most four points per pixel column, spikes included") {
  RunReportData d;
  for (int step = 1; step <= 200000; ++step)
    d.loss.push_back({static_cast<double>(step), step == 123457 ? 10.0 : 1.0 + 1.0 / step});
  const std::string page = render_run_report(d);
  const size_t begin = page.find("points=\"");
  REQUIRE(begin != std::string::npos);
  const std::string points = page.substr(begin + 8, page.find('"', begin + 8) - begin - 8);
  std::vector<std::pair<double, double>> xy;
  for (size_t at = 0; at < points.size();) {
    const size_t comma = points.find(',', at), space = points.find(' ', comma);
    xy.emplace_back(std::stod(points.substr(at, comma - at)),
                    std::stod(points.substr(comma + 1, space - comma - 1)));
    at = space + 1;
  }
  CHECK(xy.size() <= 4 * 720);  // the chart is 720 pixels wide
  CHECK(page.size() < 100000);
  double top = 1e9, left = 1e9, right = -1e9;
  for (const auto& [x, y] : xy) {
    top = std::min(top, y);
    left = std::min(left, x);
    right = std::max(right, x);
  }
  // The spike reaches the axis's top (10 at the page's y 34, the plot's top edge) and the line
  // spans the steps from the first to the last.
  CHECK(top == Approx(34.0));
  CHECK(page.find("data-y-max=\"10\"") != std::string::npos);
  CHECK(right - left > 600);
  for (size_t i = 1; i < xy.size(); ++i)
    CHECK(xy[i].first >= xy[i - 1].first);  // drawn in step order
}
