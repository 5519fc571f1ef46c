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

// ZB-H1 (pp2 over 2 micro-batches, F = B = W = 1 s, buffered sends): stage 1 runs B0 then F1,
// holding W0 back until after B1; stage 0 runs each W right after its B. 7 s, 2 of the 14 stage
// seconds idle.
TEST_CASE("the text timeline of ZB-H1 draws the weight-gradient passes as W and w",
          "[telemetry][pipeline]") {
  Timeline t = simulate(pipeline_lists({2, 2, PipeSchedule::zb_h1, 1}),
                        std::vector<StageTimes>(2, StageTimes{1.0, 1.0, 1.0}), 0, true);
  t.schedule = "zb-h1";
  const std::string text = render_text(t, 28);
  INFO(text);
  CHECK(text.find("stage 0   |FFFFffff....BBBBWWWWbbbbwwww|") != std::string::npos);
  CHECK(text.find("stage 1   |....FFFFBBBBffffbbbbWWWWwwww|") != std::string::npos);
  CHECK(text.find("W/w weight gradient") != std::string::npos);
  CHECK(text.find("B/b backward (input gradient)") != std::string::npos);
  CHECK(text.find("zb-h1, 2 stages, 2 micro-batches: step 7 s, bubble 14.3%") != std::string::npos);
  // 1F1B's legend has no W.
  CHECK(render_text(run(2, 2, {1.0, 2.0}), 18).find("W/w") == std::string::npos);
}

TEST_CASE(
    "the SVG timeline of ZB-H1: forward, backward and weight-gradient boxes, none overlapping",
    "[telemetry][pipeline]") {
  const Timeline t = simulate(pipeline_lists({4, 8, PipeSchedule::zb_h1, 1}),
                              std::vector<StageTimes>(4, StageTimes{1e-3, 1e-3, 1e-3}), 1e-4, true);
  const std::string svg = render_svg(t, "gpt pp4 zb-h1");
  const std::regex box(
      "class=\"(\\w+)\" data-stage=\"(\\d+)\" data-op=\"(forward|backward|weight_grad)\" "
      "data-micro-batch=\"(\\d+)\" x=\"([0-9.]+)\" y=\"[0-9.]+\" width=\"([0-9.]+)\" "
      "height=\"[0-9]+\" fill=\"(#[0-9a-f]+)\"");
  std::vector<std::vector<std::pair<double, double>>> spans(4);
  std::vector<int> weight_boxes(4, 0);
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), box); it != std::sregex_iterator();
       ++it) {
    const size_t stage = static_cast<size_t>(std::stoi((*it)[2]));
    const double x = std::stod((*it)[5]), w = std::stod((*it)[6]);
    spans.at(stage).push_back({x, x + w});
    if ((*it)[3] == "weight_grad") {
      ++weight_boxes[stage];
      CHECK((*it)[1] == "weight");
      CHECK((*it)[7] == "#54a24b");  // green, apart from forward blue and backward orange
    } else {
      CHECK((*it)[7] != "#54a24b");
    }
  }
  for (size_t s = 0; s < 4; ++s) {
    INFO("stage " << s);
    CHECK(weight_boxes[s] == 8);
    REQUIRE(spans[s].size() == 24);
    std::sort(spans[s].begin(), spans[s].end());
    for (size_t i = 1; i < spans[s].size(); ++i)
      CHECK(spans[s][i].first >= spans[s][i - 1].second - 0.011);  // printed to 0.01 px
  }
  CHECK(svg.find(">weight gradient</text>") != std::string::npos);
  CHECK(svg.find(">idle (waiting for a peer or done)</text>") != std::string::npos);
  // 1F1B's page has no weight-gradient legend.
  CHECK(render_svg(run(4, 8, {1e-3, 2e-3}), "1f1b").find("weight gradient") == std::string::npos);
}
