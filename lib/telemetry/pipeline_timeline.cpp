#include "telemetry/pipeline_timeline.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "telemetry/format.hpp"

namespace trainctl::telemetry {

namespace {

// A round step for a time axis of `span` seconds: 1, 2 or 5 times a power of ten, about 8 ticks.
double tick_step(double span) {
  const double raw = span / 8;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double f : {1.0, 2.0, 5.0})
    if (f * power >= raw) return f * power;
  return 10 * power;
}

// "850 us", "12.5 ms", "43.9 s".
std::string duration(double seconds) {
  if (seconds < 1e-3) return fmt::format("{:.3g} us", 1e6 * seconds);
  if (seconds < 1) return fmt::format("{:.3g} ms", 1e3 * seconds);
  return fmt::format("{:.3g} s", seconds);
}

std::string bubble_line(const Timeline& t) {
  const size_t stages = t.stages.size();
  const int micro_batches = t.micro_batches();
  return fmt::format(
      "{}, {} stage{}, {} micro-batch{}: step {}, bubble {:.1f}% of the stages' time", t.schedule,
      stages, stages == 1 ? "" : "s", micro_batches, micro_batches == 1 ? "" : "es",
      duration(t.makespan), 100 * t.bubble_share());
}

// Whether the backward runs split (ZB-H1): then the weight-gradient passes are drawn too.
bool has_weight_passes(const Timeline& t) {
  for (const auto& stage : t.stages)
    for (const TimedAction& a : stage)
      if (a.action.op == PipeOp::weight_grad) return true;
  return false;
}

// A compute action's letter: F forward, B backward (its input-gradient pass with ZB-H1), W
// weight-gradient pass; lower case for odd micro-batches.
char letter(const PipeAction& a) {
  const char upper = a.op == PipeOp::forward ? 'F' : a.op == PipeOp::backward ? 'B' : 'W';
  return a.micro_batch % 2 != 0 ? static_cast<char>(upper - 'A' + 'a') : upper;
}

// A box's fill: blue forwards, orange backwards, green weight-gradient passes; later chunks
// (interleaved) in darker shades of the same colours.
const char* fill(const PipeAction& a) {
  const bool dark = a.chunk % 2 != 0;
  switch (a.op) {
    case PipeOp::forward:
      return dark ? "#2a4f7a" : "#4c78a8";
    case PipeOp::weight_grad:
      return dark ? "#37702f" : "#54a24b";
    default:
      return dark ? "#b35f0b" : "#f58518";
  }
}

}  // namespace

std::string render_text(const Timeline& t, int width) {
  width = std::max(width, 16);
  const double span = t.makespan > 0 ? t.makespan : 1.0;
  // With many micro-batches a column would hold several actions: then the fill and the drain are
  // drawn, each over half the width at two columns or more per action, with the steady state
  // between them left out.
  double shortest = span;
  for (const auto& stage : t.stages)
    for (const TimedAction& a : stage)
      if (a.compute() && a.end > a.start) shortest = std::min(shortest, a.end - a.start);
  const int half = (width - 5) / 2;
  const double window = shortest / 2 * half;
  const bool split = shortest / span * width < 1.5 && 2 * window < span;
  struct Part {
    double begin, end;
    int columns;
  };
  const std::vector<Part> parts =
      split ? std::vector<Part>{{0, window, half}, {span - window, span, half}}
            : std::vector<Part>{{0, span, width}};
  std::string out;
  for (size_t s = 0; s < t.stages.size(); ++s) {
    std::string line = fmt::format("stage {:<3} |", s);
    for (size_t p = 0; p < parts.size(); ++p) {
      const Part& part = parts[p];
      const double scale = part.columns / (part.end - part.begin);
      std::string row(static_cast<size_t>(part.columns), '.');
      for (const TimedAction& a : t.stages[s]) {
        if (!a.compute() || a.end <= part.begin || a.start >= part.end) continue;
        // The columns whose midpoints the action covers; at least one, so none vanishes.
        const int first =
            std::max(0, static_cast<int>(std::lround((a.start - part.begin) * scale)));
        const int last =
            std::max(first + 1, static_cast<int>(std::lround((a.end - part.begin) * scale)));
        const char c = letter(a.action);
        for (int i = first; i < std::min(last, part.columns); ++i)
          row[static_cast<size_t>(i)] = c;
      }
      line += (p ? " ... " : "") + row;
    }
    out += line + "|\n";
  }
  if (split) {
    out += fmt::format("{:<11}{:<{}}{}\n", "", "0 to " + duration(window), half,
                       " ... " + duration(span - window) + " to " + duration(span));
    out += "(the fill and the drain; the steady state between them is left out)\n";
  } else {
    out += fmt::format("{:<11}{:<{}}{}\n", "", "0", width / 2, duration(span));
  }
  out += has_weight_passes(t)
             ? "F/f forward, B/b backward (input gradient), W/w weight gradient (upper case: even "
               "micro-batch, lower case: odd), . idle\n"
             : "F/f forward, B/b backward (upper case: even micro-batch, lower case: odd), . "
               "idle\n";
  out += bubble_line(t) + "\n";
  return out;
}

std::string render_svg(const Timeline& t, const std::string& title) {
  std::vector<std::string> lines;  // the title's lines
  for (size_t from = 0;;) {
    const size_t end = title.find('\n', from);
    lines.push_back(title.substr(from, end == std::string::npos ? end : end - from));
    if (end == std::string::npos) break;
    from = end + 1;
  }
  const double line_height = 18;
  const double left = 70, right = 20, row = 30, gap = 8, plot = 960;
  const double top = 38 + line_height * static_cast<double>(lines.size());
  const size_t P = t.stages.size();
  const double width = left + plot + right;
  const double height = top + static_cast<double>(P) * (row + gap) + 60;
  const double span = t.makespan > 0 ? t.makespan : 1.0;
  auto x_of = [&](double seconds) { return left + seconds / span * plot; };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 "
      "{:.0f} "
      "{:.0f}\" font-family=\"sans-serif\" font-size=\"12\">\n",
      width, height, width, height);
  svg += "<title>" + escape_xml(lines.front()) + "</title>\n";
  svg +=
      fmt::format("<rect width=\"{:.0f}\" height=\"{:.0f}\" fill=\"#ffffff\"/>\n", width, height);
  for (size_t i = 0; i < lines.size(); ++i)
    svg += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"{}\"{}>{}</text>\n", left,
                       20 + line_height * static_cast<double>(i), i ? 12 : 14,
                       i ? "" : " font-weight=\"bold\"", escape_xml(lines[i]));
  svg +=
      fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\">{}</text>\n", left,
                  20 + line_height * static_cast<double>(lines.size()), escape_xml(bubble_line(t)));
  for (size_t s = 0; s < P; ++s) {
    const double y = top + static_cast<double>(s) * (row + gap);
    svg += fmt::format("<text x=\"8\" y=\"{:.1f}\">stage {}</text>\n", y + row / 2 + 4, s);
    svg += fmt::format(
        "<rect class=\"idle\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.0f}\" "
        "fill=\"#e8e8e8\"/>\n",
        left, y, plot, row);
    for (const TimedAction& a : t.stages[s]) {
      if (!a.compute()) continue;
      const PipeOp op = a.action.op;
      const double x0 = x_of(a.start), w = std::max(x_of(a.end) - x0, 0.5);
      svg += fmt::format(
          "<rect class=\"{}\" data-stage=\"{}\" data-op=\"{}\" data-micro-batch=\"{}\" "
          "x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.0f}\" fill=\"{}\" "
          "stroke=\"#ffffff\" stroke-width=\"0.5\" data-chunk=\"{}\"/>\n",
          op == PipeOp::forward    ? "forward"
          : op == PipeOp::backward ? "backward"
                                   : "weight",
          s, op_name(op), a.action.micro_batch, x0, y, w, row, fill(a.action), a.action.chunk);
      if (w >= 14)
        svg += fmt::format(
            "<text x=\"{:.2f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#ffffff\" "
            "font-size=\"11\">{}</text>\n",
            x0 + w / 2, y + row / 2 + 4,
            a.action.chunk ? fmt::format("{}.{}", a.action.micro_batch, a.action.chunk)
                           : std::to_string(a.action.micro_batch));
    }
  }
  const double axis_y = top + static_cast<double>(P) * (row + gap) + 4;
  svg += fmt::format(
      "<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"#333333\"/>\n", left,
      axis_y, left + plot, axis_y);
  const double step = tick_step(span);
  for (double tick = 0; tick <= span * (1 + 1e-9); tick += step) {
    const double x = x_of(tick);
    svg += fmt::format(
        "<line x1=\"{:.2f}\" y1=\"{:.1f}\" x2=\"{:.2f}\" y2=\"{:.1f}\" stroke=\"#333333\"/>\n", x,
        axis_y, x, axis_y + 5);
    svg += fmt::format("<text x=\"{:.2f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", x,
                       axis_y + 18, tick > 0 ? duration(tick) : "0");
  }
  const double legend_y = axis_y + 38;
  svg += fmt::format(
      "<rect x=\"{:.0f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"#4c78a8\"/><text "
      "x=\"{:.0f}\" "
      "y=\"{:.1f}\">forward</text>\n",
      left, legend_y - 10, left + 16, legend_y);
  svg += fmt::format(
      "<rect x=\"{:.0f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"#f58518\"/><text "
      "x=\"{:.0f}\" "
      "y=\"{:.1f}\">backward</text>\n",
      left + 90, legend_y - 10, left + 106, legend_y);
  double idle_x = left + 190;
  if (has_weight_passes(t)) {
    svg += fmt::format(
        "<rect x=\"{:.0f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"#54a24b\"/><text "
        "x=\"{:.0f}\" y=\"{:.1f}\">weight gradient</text>\n",
        idle_x, legend_y - 10, idle_x + 16, legend_y);
    idle_x += 130;
  }
  svg += fmt::format(
      "<rect x=\"{:.0f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"#e8e8e8\"/><text "
      "x=\"{:.0f}\" "
      "y=\"{:.1f}\">idle (waiting for a peer or done)</text>\n",
      idle_x, legend_y - 10, idle_x + 16, legend_y);
  svg += "</svg>\n";
  return svg;
}

nlohmann::json timeline_json(const Timeline& t, bool compute_only) {
  nlohmann::json stages = nlohmann::json::array();
  for (const std::vector<TimedAction>& stage : t.stages) {
    nlohmann::json actions = nlohmann::json::array();
    for (const TimedAction& a : stage) {
      if (compute_only && !a.compute()) continue;
      actions.push_back({{"op", op_name(a.action.op)},
                         {"micro_batch", a.action.micro_batch},
                         {"chunk", a.action.chunk},
                         {"start_s", a.start},
                         {"end_s", a.end}});
    }
    stages.push_back(std::move(actions));
  }
  return {{"schedule", t.schedule},
          {"micro_batches", t.micro_batches()},
          {"step_s", t.makespan},
          {"bubble_share", t.bubble_share()},
          {"stages", std::move(stages)}};
}

}  // namespace trainctl::telemetry
