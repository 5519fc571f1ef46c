#include "layout/layout.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace trainctl {

namespace {

int stride_of(const Layout& layout, const std::vector<Axis>& order, Axis axis) {
  int stride = 1;
  for (Axis a : order) {
    if (a == axis) return stride;
    stride *= layout.degree(a);
  }
  return stride;
}

// The axes' names joined by `separator`.
std::string axis_names(std::string_view separator) {
  std::string names;
  for (const Layout::AxisInfo& a : kAxes) {
    if (!names.empty()) names.append(separator);
    names.append(a.name);
  }
  return names;
}

std::string axis_list() {
  return axis_names(", ");
}

std::string default_order() {
  return axis_names("-");
}

// Empty, or why `order` is not a permutation of the axes.
std::string order_problem(const std::string& order, std::vector<Axis>* axes) {
  std::vector<Axis> found;
  size_t start = 0;
  while (start <= order.size()) {
    const size_t end = std::min(order.find('-', start), order.size());
    const std::string token = order.substr(start, end - start);
    const auto it = std::find_if(kAxes.begin(), kAxes.end(),
                                 [&](const Layout::AxisInfo& a) { return a.name == token; });
    if (it == kAxes.end())
      return "order '" + order + "' has unknown axis '" + token + "'; use the axes " + axis_list() +
             " joined by '-', e.g. " + default_order();
    if (std::find(found.begin(), found.end(), it->axis) != found.end())
      return "order '" + order + "' names axis " + token + " twice";
    found.push_back(it->axis);
    start = end + 1;
  }
  for (const Layout::AxisInfo& a : kAxes)
    if (std::find(found.begin(), found.end(), a.axis) == found.end())
      return "order '" + order + "' lacks axis " + std::string(a.name) + "; name all " +
             std::to_string(kAxes.size()) + ", e.g. " + default_order();
  if (axes) *axes = std::move(found);
  return "";
}

}  // namespace

int Layout::world_size() const {
  int world = 1;
  for (const AxisInfo& a : kAxes)
    world *= this->*a.degree;
  return world;
}

std::string Layout::degrees() const {
  std::string text;
  for (const AxisInfo& a : kAxes) {
    if (!text.empty()) text.push_back(' ');
    text.append(a.name);
    text.append(std::to_string(this->*a.degree));
  }
  return text;
}

std::string Layout::to_string() const {
  return degrees() + " (order " + order + ")";
}

std::string Layout::world_formula() const {
  std::string values;
  for (const AxisInfo& a : kAxes) {
    if (!values.empty()) values.push_back('*');
    values.append(std::to_string(this->*a.degree));
  }
  return axis_names("*") + " = " + values + " = " + std::to_string(world_size());
}

std::vector<std::string> Layout::problems() const {
  std::vector<std::string> found;
  for (const AxisInfo& a : kAxes)
    if (this->*a.degree < 1)
      found.push_back(std::string(a.name) + " = " + std::to_string(this->*a.degree) +
                      "; every degree must be at least 1");
  if (zero < 0 || zero > 3)
    found.push_back("zero = " + std::to_string(zero) + "; the ZeRO stage must be 0, 1, 2 or 3");
  if (sequence_parallel && tp < 2)
    found.push_back("sequence_parallel with tp = " + std::to_string(tp) +
                    "; it splits the tokens over the tensor-parallel ranks, so it needs tp >= 2");
  if (std::string why = order_problem(order, nullptr); !why.empty()) found.push_back(why);
  return found;
}

std::vector<Axis> rank_order(const Layout& layout) {
  std::vector<Axis> axes;
  if (std::string why = order_problem(layout.order, &axes); !why.empty())
    throw std::invalid_argument(why);
  return axes;
}

Coordinates coordinates_of(const Layout& layout, int rank) {
  const std::vector<Axis> order = rank_order(layout);
  if (rank < 0 || rank >= layout.world_size())
    throw std::invalid_argument("rank " + std::to_string(rank) + " is outside 0.." +
                                std::to_string(layout.world_size() - 1) + " for " +
                                layout.to_string());
  Coordinates at;
  for (const Layout::AxisInfo& a : kAxes)
    at.*a.coordinate = (rank / stride_of(layout, order, a.axis)) % layout.degree(a.axis);
  return at;
}

std::vector<int> group_of(const Layout& layout, int rank, const std::vector<Axis>& axes) {
  const std::vector<Axis> order = rank_order(layout);
  const Coordinates here = coordinates_of(layout, rank);
  // The base rank: this rank with every spanned axis set to 0.
  int base = rank;
  std::vector<Axis> spanned;  // in order-string order, fastest first
  for (Axis a : order) {
    if (std::find(axes.begin(), axes.end(), a) == axes.end()) continue;
    base -= here.of(a) * stride_of(layout, order, a);
    spanned.push_back(a);
  }
  int members = 1;
  for (Axis a : spanned)
    members *= layout.degree(a);
  std::vector<int> group;
  group.reserve(static_cast<size_t>(members));
  for (int index = 0; index < members; ++index) {
    int rest = index;
    int member = base;
    for (Axis a : spanned) {
      member += (rest % layout.degree(a)) * stride_of(layout, order, a);
      rest /= layout.degree(a);
    }
    group.push_back(member);
  }
  return group;
}

int group_rank(const Layout& layout, const Coordinates& at, const std::vector<Axis>& axes) {
  int index = 0, stride = 1;
  for (Axis a : rank_order(layout)) {
    if (std::find(axes.begin(), axes.end(), a) == axes.end()) continue;
    index += at.of(a) * stride;
    stride *= layout.degree(a);
  }
  return index;
}

std::vector<std::vector<int>> all_groups(const Layout& layout, const std::vector<Axis>& axes) {
  std::set<std::vector<int>> unique;
  for (int rank = 0; rank < layout.world_size(); ++rank)
    unique.insert(group_of(layout, rank, axes));
  std::vector<std::vector<int>> groups(unique.begin(), unique.end());
  std::sort(groups.begin(), groups.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });
  return groups;
}

}  // namespace trainctl
