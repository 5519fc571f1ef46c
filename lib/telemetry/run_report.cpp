#include "telemetry/run_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "telemetry/format.hpp"

namespace trainctl::telemetry {
namespace {

constexpr double kWidth = 720, kHeight = 260;
constexpr double kLeft = 72, kRight = 24, kTop = 34, kBottom = 42;

std::string number(double x) {
  return fmt::format("{:.6g}", x);  // 11000 rather than 1.1e+04; 0.0025
}

struct Series {
  std::string name, color;
  const std::vector<ReportPoint>* points;
  bool dots = false;  // points (evaluations) rather than a line
};

std::vector<ReportPoint> finite(const std::vector<ReportPoint>& points) {
  std::vector<ReportPoint> out;
  for (const ReportPoint& p : points)
    if (std::isfinite(p.step) && std::isfinite(p.value)) out.push_back(p);
  return out;
}

struct Pixel {
  double x = 0, y = 0;
};

// At most four points per pixel column: its first, lowest, highest and last, in the order drawn.
// The line looks the same (a spike stays a spike), and a million-step run's page stays a few
// hundred kilobytes.
std::vector<Pixel> thin(const std::vector<Pixel>& in) {
  std::vector<Pixel> out;
  for (size_t first = 0, next = 0; first < in.size(); first = next) {
    const double column = std::floor(in[first].x);
    size_t low = first, high = first;
    for (next = first; next < in.size() && std::floor(in[next].x) == column; ++next) {
      if (in[next].y < in[low].y) low = next;
      if (in[next].y > in[high].y) high = next;
    }
    size_t taken = in.size();  // none yet in this column
    for (size_t i : {first, std::min(low, high), std::max(low, high), next - 1})
      if (i != taken) out.push_back(in[taken = i]);
  }
  return out;
}

// One chart: the series over steps, the checkpoints as dashed verticals, grid and tick labels.
std::string line_chart(std::string_view id, std::string_view title, std::string_view y_label,
                       const std::vector<Series>& all, const std::vector<int64_t>& checkpoints,
                       double y_scale = 1.0) {
  double x_low = std::numeric_limits<double>::infinity(), x_high = -x_low;
  double y_low = x_low, y_high = -x_low;
  std::vector<std::vector<ReportPoint>> kept;
  for (const Series& s : all) {
    kept.push_back(finite(*s.points));
    for (const ReportPoint& p : kept.back()) {
      x_low = std::min(x_low, p.step);
      x_high = std::max(x_high, p.step);
      y_low = std::min(y_low, p.value * y_scale);
      y_high = std::max(y_high, p.value * y_scale);
    }
  }
  if (!std::isfinite(x_low)) return "";
  const Axis x = nice_axis(x_low, x_high, 8), y = nice_axis(y_low, y_high, 5);
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto px = [&](double v) { return kLeft + (v - x.low) / (x.high - x.low) * plot_w; };
  auto py = [&](double v) { return kTop + plot_h - (v - y.low) / (y.high - y.low) * plot_h; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" data-chart=\"{}\" "
      "data-x-min=\"{}\" data-x-max=\"{}\" data-y-min=\"{}\" data-y-max=\"{}\">\n"
      "<text x=\"{}\" y=\"20\" class=\"title\">{}</text>\n",
      kWidth, kHeight, id, number(x.low), number(x.high), number(y.low), number(y.high), kLeft,
      escape_xml(title));
  for (double v = y.low; v <= y.high + y.step * 1e-6; v += y.step) {
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" class=\"grid\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"end\">{}</text>\n",
        kLeft, py(v), kWidth - kRight, py(v), kLeft - 6, py(v) + 4, number(v));
  }
  for (double v = x.low; v <= x.high + x.step * 1e-6; v += x.step) {
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" class=\"grid\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"middle\">{}</text>\n",
        px(v), kTop, px(v), kTop + plot_h, px(v), kTop + plot_h + 16, number(v));
  }
  svg += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>\n"
      "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"middle\">step</text>\n"
      "<text x=\"14\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 14 {:.1f})\">{}</text>\n",
      kLeft, kTop, plot_w, plot_h, kLeft + plot_w / 2, kHeight - 6, kTop + plot_h / 2,
      kTop + plot_h / 2, escape_xml(y_label));
  for (int64_t step : checkpoints) {
    const double s = static_cast<double>(step);
    if (s < x.low || s > x.high) continue;
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" class=\"checkpoint\">"
        "<title>checkpoint at step {3}</title></line>\n",
        px(s), kTop, kTop + plot_h, step);
  }
  double legend_x = kWidth - kRight - 8;
  for (size_t i = all.size(); i-- > 0;) {
    const Series& s = all[i];
    const std::vector<ReportPoint>& points = kept[i];
    if (points.empty()) continue;
    std::vector<Pixel> pixels;
    for (const ReportPoint& p : points)
      pixels.push_back({px(p.step), py(p.value * y_scale)});
    if (s.dots) {
      std::string drawn;  // the previous dot's position: dots on the same pixel are drawn once
      for (const Pixel& p : pixels) {
        std::string at = fmt::format("cx=\"{:.1f}\" cy=\"{:.1f}\"", p.x, p.y);
        if (at == drawn) continue;
        svg += fmt::format("<circle {} r=\"3\" fill=\"{}\"/>\n", at, s.color);
        drawn = std::move(at);
      }
    } else {
      svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"",
                         s.color);
      for (const Pixel& p : thin(pixels))
        svg += fmt::format("{:.1f},{:.1f} ", p.x, p.y);
      svg += "\"/>\n";
    }
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"legend\" text-anchor=\"end\" fill=\"{}\">{}"
        "</text>\n",
        legend_x, kTop + 14, s.color, escape_xml(s.name));
    legend_x -= 9.0 * static_cast<double>(s.name.size()) + 16;
  }
  return svg + "</svg>\n";
}

std::string memory_chart(const std::vector<std::pair<std::string, uint64_t>>& memory) {
  uint64_t total = 0, largest = 0;
  for (const auto& [name, bytes] : memory) {
    total += bytes;
    largest = std::max(largest, bytes);
  }
  if (memory.empty() || largest == 0) return "";
  const double row = 26, height = kTop + row * static_cast<double>(memory.size()) + 16;
  const double bar_w = kWidth - 150 - 150;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{:.0f}\" "
      "data-chart=\"memory\" data-x-min=\"0\" data-x-max=\"{}\">\n"
      "<text x=\"{}\" y=\"20\" class=\"title\">memory by category ({} in all, this rank)</text>\n",
      kWidth, height, largest, kLeft, format_bytes(total));
  double y = kTop;
  for (const auto& [name, bytes] : memory) {
    const double w = bar_w * static_cast<double>(bytes) / static_cast<double>(largest);
    svg += fmt::format(
        "<text x=\"140\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"end\">{}</text>"
        "<rect x=\"150\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"18\" class=\"bar\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\">{} ({:.1f}%)</text>\n",
        y + 13, escape_xml(name), y, std::max(w, 1.0), 156 + w, y + 13, format_bytes(bytes),
        total > 0 ? 100.0 * static_cast<double>(bytes) / static_cast<double>(total) : 0.0);
    y += row;
  }
  return svg + "</svg>\n";
}

}  // namespace

Axis nice_axis(double low, double high, int ticks) {
  if (!std::isfinite(low) || !std::isfinite(high)) return {};
  if (high < low) std::swap(low, high);
  if (high - low < 1e-12 * std::max(1.0, std::abs(high))) {
    const double pad = std::abs(low) > 0 ? std::abs(low) * 0.1 : 1.0;
    low -= pad;
    high += pad;
  }
  const double raw = (high - low) / std::max(1, ticks);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double normal = raw / magnitude;
  // The nearest of 1, 2, 5 and 10 (Heckbert's "nice numbers").
  const double step = (normal < 1.5 ? 1 : normal < 3 ? 2 : normal < 7 ? 5 : 10) * magnitude;
  // Snap to the step, keeping values that already sit on a tick where they are.
  const double eps = step * 1e-9;
  return {std::floor((low + eps) / step) * step, std::ceil((high - eps) / step) * step, step};
}

std::string render_run_report(const RunReportData& d) {
  std::string summary;
  if (!d.loss.empty()) summary += fmt::format("{} steps", static_cast<int64_t>(d.loss.back().step));
  if (d.final_loss) summary += fmt::format(" | final loss {:.4f}", *d.final_loss);
  if (d.final_val_loss) summary += fmt::format(" | final val_loss {:.4f}", *d.final_val_loss);
  if (d.seconds) summary += " | " + format_duration(*d.seconds) + " of training";
  if (!d.checkpoints.empty())
    summary += fmt::format(" | {} checkpoint{} kept (dashed lines)", d.checkpoints.size(),
                           d.checkpoints.size() == 1 ? "" : "s");

  std::string page = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>trainctl report: {0}</title>\n<style>\n"
      "body {{ font-family: sans-serif; margin: 24px; color: #222; background: #fff; }}\n"
      "svg {{ display: block; margin: 12px 0 20px 0; }}\n"
      ".title {{ font-size: 15px; font-weight: bold; fill: #222; }}\n"
      ".tick {{ font-size: 11px; fill: #444; }}\n"
      ".legend {{ font-size: 12px; }}\n"
      ".grid {{ stroke: #e4e4e4; stroke-width: 1; }}\n"
      ".frame {{ fill: none; stroke: #888; stroke-width: 1; }}\n"
      ".checkpoint {{ stroke: #2a9d4b; stroke-width: 1; stroke-dasharray: 4 3; }}\n"
      ".bar {{ fill: #4c78a8; }}\n"
      "</style>\n</head>\n<body>\n<h1>{0}</h1>\n<p>{1}</p>\n",
      escape_xml(d.name), escape_xml(summary));
  page += line_chart(
      "loss", "loss (nats/token)", "loss",
      {{"train", "#1f77b4", &d.loss, false}, {"validation", "#d62728", &d.val_loss, true}},
      d.checkpoints);
  page += line_chart("lr", "learning rate", "lr", {{"lr", "#9467bd", &d.lr, false}}, {});
  page += line_chart("throughput", "throughput (tokens/s)", "tokens/s",
                     {{"tokens/s", "#ff7f0e", &d.tokens_per_s, false}}, {});
  page += line_chart("mfu", "model FLOPs utilisation (%)", "MFU %",
                     {{"MFU", "#8c564b", &d.mfu, false}}, {}, 100.0);
  page += memory_chart(d.memory);
  return page + "</body>\n</html>\n";
}

}  // namespace trainctl::telemetry
