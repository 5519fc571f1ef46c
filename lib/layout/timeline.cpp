#include "layout/timeline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace trainctl {

namespace {

// The action the other side of a message runs.
PipeOp partner(PipeOp op) {
  switch (op) {
    case PipeOp::send_activation:
      return PipeOp::recv_activation;
    case PipeOp::recv_activation:
      return PipeOp::send_activation;
    case PipeOp::send_grad:
      return PipeOp::recv_grad;
    case PipeOp::recv_grad:
      return PipeOp::send_grad;
    default:
      break;
  }
  throw std::logic_error("partner: " + std::to_string(static_cast<int>(op)) + " is not a transfer");
}

bool downstream(PipeOp op) {
  return op == PipeOp::send_activation || op == PipeOp::recv_grad;
}

// printf into a std::string (the layout library takes no formatting dependency).
template <typename... Args>
std::string format(const char* pattern, Args... args) {
  const int n = std::snprintf(nullptr, 0, pattern, args...);
  std::string out(static_cast<size_t>(std::max(n, 0)), '\0');
  std::snprintf(out.data(), out.size() + 1, pattern, args...);
  return out;
}

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
  if (seconds < 1e-3) return format("%.3g us", 1e6 * seconds);
  if (seconds < 1) return format("%.3g ms", 1e3 * seconds);
  return format("%.3g s", seconds);
}

std::string bubble_line(const Timeline& t) {
  const size_t stages = t.stages.size();
  int micro_batches = 0;
  if (!t.stages.empty())
    for (const TimedAction& a : t.stages[0])
      micro_batches += a.action.op == PipeOp::forward;
  return format("%s, %zu stage%s, %d micro-batch%s: step %s, bubble %.1f%% of the stages' time",
                t.schedule.c_str(), stages, stages == 1 ? "" : "s", micro_batches,
                micro_batches == 1 ? "" : "es", duration(t.makespan).c_str(),
                100 * t.bubble_share());
}

std::string escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

}  // namespace

double Timeline::busy(int stage) const {
  double total = 0;
  for (const TimedAction& a : stages.at(static_cast<size_t>(stage)))
    if (a.compute()) total += a.end - a.start;
  return total;
}

double Timeline::bubble_share() const {
  if (stages.empty() || makespan <= 0) return 0;
  double busy_total = 0;
  for (size_t s = 0; s < stages.size(); ++s)
    busy_total += busy(static_cast<int>(s));
  return 1.0 - busy_total / (static_cast<double>(stages.size()) * makespan);
}

namespace {

// simulate() and makespan(): the intervals into `record` when it is not null.
double run(const std::vector<std::vector<PipeAction>>& lists, const std::vector<StageTimes>& times,
           double transfer_s, Timeline* record) {
  const size_t P = lists.size();
  if (times.size() != P)
    throw std::invalid_argument("pipeline timeline: " + std::to_string(P) + " action lists but " +
                                std::to_string(times.size()) + " stage times");
  for (const StageTimes& t : times)
    if (!(t.forward >= 0 && t.backward >= 0))
      throw std::invalid_argument("pipeline timeline: a stage time is negative or not a number");
  if (!(transfer_s >= 0))
    throw std::invalid_argument("pipeline timeline: the transfer time is negative");
  if (record) {
    record->stages.assign(P, {});
    for (size_t s = 0; s < P; ++s)
      record->stages[s].reserve(lists[s].size());
  }
  std::vector<size_t> done(P, 0);
  std::vector<double> clock(P, 0.0);
  // A stage runs until it waits for a peer; the peer, on reaching the other side of that
  // transfer, completes it and wakes the stage again. Every action is visited once or twice.
  std::vector<size_t> ready(P);
  for (size_t s = 0; s < P; ++s)
    ready[s] = P - 1 - s;
  while (!ready.empty()) {
    const size_t s = ready.back();
    ready.pop_back();
    const std::vector<PipeAction>& list = lists[s];
    size_t& i = done[s];
    for (; i < list.size(); ++i) {
      const PipeAction& a = list[i];
      if (a.op == PipeOp::forward || a.op == PipeOp::backward) {
        const double d = a.op == PipeOp::forward ? times[s].forward : times[s].backward;
        if (record) record->stages[s].push_back({a, clock[s], clock[s] + d});
        clock[s] += d;
        continue;
      }
      const bool down = downstream(a.op);
      if ((down && s + 1 >= P) || (!down && s == 0)) break;  // no such peer: stuck
      const size_t peer = down ? s + 1 : s - 1;
      if (done[peer] >= lists[peer].size()) break;
      const PipeAction& b = lists[peer][done[peer]];
      if (b.op != partner(a.op) || b.micro_batch != a.micro_batch) break;  // waits for the peer
      const double end = std::max(clock[s], clock[peer]) + transfer_s;
      if (record) {
        record->stages[s].push_back({a, clock[s], end});
        record->stages[peer].push_back({b, clock[peer], end});
      }
      clock[s] = clock[peer] = end;
      ++done[peer];
      ready.push_back(peer);  // it waited on this transfer
    }
  }
  std::string stuck;
  for (size_t s = 0; s < P; ++s)
    if (done[s] < lists[s].size())
      stuck += (stuck.empty() ? "" : ", ") +
               ("stage " + std::to_string(s) + " at " + to_string(lists[s][done[s]]));
  if (!stuck.empty())
    throw std::logic_error("pipeline timeline: the action lists deadlock (" + stuck + ")");
  return P ? *std::max_element(clock.begin(), clock.end()) : 0.0;
}

}  // namespace

Timeline simulate(const std::vector<std::vector<PipeAction>>& lists,
                  const std::vector<StageTimes>& times, double transfer_s) {
  Timeline t;
  t.makespan = run(lists, times, transfer_s, &t);
  return t;
}

double makespan(const std::vector<std::vector<PipeAction>>& lists,
                const std::vector<StageTimes>& times, double transfer_s) {
  return run(lists, times, transfer_s, nullptr);
}

std::vector<std::vector<PipeAction>> one_f_one_b_lists(int stages, int micro_batches) {
  std::vector<std::vector<PipeAction>> lists;
  for (int s = 0; s < stages; ++s)
    lists.push_back(one_f_one_b(stages, s, micro_batches));
  return lists;
}

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
    std::string line = format("stage %-3zu |", s);
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
        const bool odd = a.action.micro_batch % 2 != 0;
        const char c = a.action.op == PipeOp::forward ? (odd ? 'f' : 'F') : (odd ? 'b' : 'B');
        for (int i = first; i < std::min(last, part.columns); ++i)
          row[static_cast<size_t>(i)] = c;
      }
      line += (p ? " ... " : "") + row;
    }
    out += line + "|\n";
  }
  if (split) {
    out += format("%-11s%-*s%s\n", "", half, ("0 to " + duration(window)).c_str(),
                  (" ... " + duration(span - window) + " to " + duration(span)).c_str());
    out += "(the fill and the drain; the steady state between them is left out)\n";
  } else {
    out += format("%-11s%-*s%s\n", "", width / 2, "0", duration(span).c_str());
  }
  out += "F/f forward, B/b backward (upper case: even micro-batch, lower case: odd), . idle\n";
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
  std::string svg = format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f "
      "%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
      width, height, width, height);
  svg += "<title>" + escape(lines.front()) + "</title>\n";
  svg += format("<rect width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", width, height);
  for (size_t i = 0; i < lines.size(); ++i)
    svg += format("<text x=\"%.0f\" y=\"%.0f\" font-size=\"%d\"%s>%s</text>\n", left,
                  20 + line_height * static_cast<double>(i), i ? 12 : 14,
                  i ? "" : " font-weight=\"bold\"", escape(lines[i]).c_str());
  svg +=
      format("<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", left,
             20 + line_height * static_cast<double>(lines.size()), escape(bubble_line(t)).c_str());
  for (size_t s = 0; s < P; ++s) {
    const double y = top + static_cast<double>(s) * (row + gap);
    svg += format("<text x=\"8\" y=\"%.1f\">stage %zu</text>\n", y + row / 2 + 4, s);
    svg += format(
        "<rect class=\"idle\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" "
        "fill=\"#e8e8e8\"/>\n",
        left, y, plot, row);
    for (const TimedAction& a : t.stages[s]) {
      if (!a.compute()) continue;
      const bool forward = a.action.op == PipeOp::forward;
      const double x0 = x_of(a.start), w = std::max(x_of(a.end) - x0, 0.5);
      svg += format(
          "<rect class=\"%s\" data-stage=\"%zu\" data-op=\"%s\" data-micro-batch=\"%d\" "
          "x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\" stroke=\"#ffffff\" "
          "stroke-width=\"0.5\"/>\n",
          forward ? "forward" : "backward", s, forward ? "forward" : "backward",
          a.action.micro_batch, x0, y, w, row, forward ? "#4c78a8" : "#f58518");
      if (w >= 14)
        svg += format(
            "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#ffffff\" "
            "font-size=\"11\">%d</text>\n",
            x0 + w / 2, y + row / 2 + 4, a.action.micro_batch);
    }
  }
  const double axis_y = top + static_cast<double>(P) * (row + gap) + 4;
  svg += format("<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#333333\"/>\n",
                left, axis_y, left + plot, axis_y);
  const double step = tick_step(span);
  for (double tick = 0; tick <= span * (1 + 1e-9); tick += step) {
    const double x = x_of(tick);
    svg += format("<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#333333\"/>\n", x,
                  axis_y, x, axis_y + 5);
    svg += format("<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x, axis_y + 18,
                  tick > 0 ? duration(tick).c_str() : "0");
  }
  const double legend_y = axis_y + 38;
  svg += format(
      "<rect x=\"%.0f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"#4c78a8\"/><text x=\"%.0f\" "
      "y=\"%.1f\">forward</text>\n",
      left, legend_y - 10, left + 16, legend_y);
  svg += format(
      "<rect x=\"%.0f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"#f58518\"/><text x=\"%.0f\" "
      "y=\"%.1f\">backward</text>\n",
      left + 90, legend_y - 10, left + 106, legend_y);
  svg += format(
      "<rect x=\"%.0f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"#e8e8e8\"/><text x=\"%.0f\" "
      "y=\"%.1f\">idle (waiting for a peer or done)</text>\n",
      left + 190, legend_y - 10, left + 206, legend_y);
  svg += "</svg>\n";
  return svg;
}

}  // namespace trainctl
