// The pipeline timeline's pictures (telemetry/pipeline_timeline.hpp): the terminal's and the SVG
// page's, drawn from schedules run on a clock (layout/timeline.hpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <regex>
#include <string>
#include <vector>

#include "layout/timeline.hpp"
#include "telemetry/pipeline_timeline.hpp"

using namespace trainctl;
using telemetry::render_svg;
using telemetry::render_text;

namespace {

Timeline run(int stages, int micro_batches, StageTimes each, double transfer = 0) {
  return simulate(pipeline_lists({stages, micro_batches}),
                  std::vector<StageTimes>(static_cast<size_t>(stages), each), transfer);
}

}  // namespace

TEST_CASE("the text timeline: a row per stage, F and B by micro-batch, the bubble",
          "[telemetry][pipeline]") {
  const Timeline t = run(2, 2, {1.0, 2.0});  // 9 s: stage 0 F0 F1 . . B0 B0 . B1 B1
  const std::string text = render_text(t, 18);
  INFO(text);
  CHECK(text.find("stage 0   |FFff....BBBB..bbbb|") != std::string::npos);
  CHECK(text.find("stage 1   |..FFBBBBffbbbb....|") != std::string::npos);
  CHECK(text.find("bubble 33.3%") != std::string::npos);
  CHECK(text.find("2 stages, 2 micro-batches: step 9 s") != std::string::npos);
  // 64 micro-batches would be a column each: the fill and the drain, two columns per forward.
  const std::string long_run = render_text(run(4, 64, {1.0, 2.0}), 45);
  INFO(long_run);
  CHECK(long_run.find("stage 0   |FFffFFff............ ... BB..bbbb..BBBB..bbbb|") !=
        std::string::npos);
  CHECK(long_run.find("stage 3   |......FFBBBBffbbbbFF ... BBffbbbb............|") !=
        std::string::npos);
  CHECK(long_run.find("the steady state between them is left out") != std::string::npos);
}

TEST_CASE("the SVG timeline: a box per forward and backward of every stage, none overlapping",
          "[telemetry][pipeline]") {
  const Timeline t = run(4, 8, {1e-3, 2e-3}, 1e-4);
  const std::string svg = render_svg(t, "gpt pp4 <test>");
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(svg.find("gpt pp4 &lt;test&gt;") != std::string::npos);
  const std::regex box(
      "data-stage=\"(\\d+)\" data-op=\"(forward|backward)\" data-micro-batch=\"(\\d+)\" "
      "x=\"([0-9.]+)\" y=\"[0-9.]+\" width=\"([0-9.]+)\"");
  std::vector<std::vector<std::pair<double, double>>> spans(4);
  int boxes = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), box); it != std::sregex_iterator();
       ++it, ++boxes) {
    const double x = std::stod((*it)[4]), w = std::stod((*it)[5]);
    spans.at(static_cast<size_t>(std::stoi((*it)[1]))).push_back({x, x + w});
  }
  CHECK(boxes == 4 * 8 * 2);
  for (auto& stage : spans) {
    REQUIRE(stage.size() == 16);
    std::sort(stage.begin(), stage.end());
    for (size_t i = 1; i < stage.size(); ++i)
      CHECK(stage[i].first >= stage[i - 1].second - 0.011);  // printed to 0.01 px
  }
}
