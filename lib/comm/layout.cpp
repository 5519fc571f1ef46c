#include "comm/layout.hpp"

#include <algorithm>
#include <set>

#include "comm/error.hpp"

namespace trainctl::comm {
namespace {

constexpr std::array<Axis, 4> kAxes = {Axis::tp, Axis::ep, Axis::dp, Axis::pp};

[[noreturn]] void layout_error(const std::string& message) {
  throw CommError(CommError::Kind::usage, "layout: " + message, "layout");
}

// The axes of layout.order, fastest first; throws unless it names each axis exactly once.
std::vector<Axis> parse_order(const std::string& order) {
  std::vector<Axis> axes;
  size_t start = 0;
  while (start <= order.size()) {
    const size_t end = std::min(order.find('-', start), order.size());
    const std::string token = order.substr(start, end - start);
    const auto it =
        std::find_if(kAxes.begin(), kAxes.end(), [&](Axis a) { return axis_name(a) == token; });
    if (it == kAxes.end()) {
      layout_error("order '" + order + "' has unknown axis '" + token +
                   "'; use the four axes tp, ep, dp, pp joined by '-', e.g. tp-ep-dp-pp");
    }
    if (std::find(axes.begin(), axes.end(), *it) != axes.end())
      layout_error("order '" + order + "' names axis " + token + " twice");
    axes.push_back(*it);
    start = end + 1;
  }
  for (Axis a : kAxes) {
    if (std::find(axes.begin(), axes.end(), a) == axes.end()) {
      layout_error("order '" + order + "' lacks axis " + std::string(axis_name(a)) +
                   "; name all four, e.g. tp-ep-dp-pp");
    }
  }
  return axes;
}

int stride_of(const Layout& layout, const std::vector<Axis>& order, Axis axis) {
  int stride = 1;
  for (Axis a : order) {
    if (a == axis) return stride;
    stride *= layout.degree(a);
  }
  return stride;
}

}  // namespace

std::string_view axis_name(Axis axis) {
  switch (axis) {
    case Axis::tp:
      return "tp";
    case Axis::ep:
      return "ep";
    case Axis::dp:
      return "dp";
    case Axis::pp:
      return "pp";
  }
  return "?";
}

int Layout::degree(Axis axis) const {
  switch (axis) {
    case Axis::tp:
      return tp;
    case Axis::ep:
      return ep;
    case Axis::dp:
      return dp;
    case Axis::pp:
      return pp;
  }
  return 1;
}

std::string Layout::to_string() const {
  return "tp" + std::to_string(tp) + " ep" + std::to_string(ep) + " dp" + std::to_string(dp) +
         " pp" + std::to_string(pp) + " (order " + order + ")";
}

int Coordinates::of(Axis axis) const {
  switch (axis) {
    case Axis::tp:
      return tp;
    case Axis::ep:
      return ep;
    case Axis::dp:
      return dp;
    case Axis::pp:
      return pp;
  }
  return 0;
}

void validate(const Layout& layout, int world_size) {
  for (Axis a : kAxes) {
    if (layout.degree(a) < 1) {
      layout_error(std::string(axis_name(a)) + " = " + std::to_string(layout.degree(a)) +
                   "; every degree must be at least 1");
    }
  }
  parse_order(layout.order);
  const long long product = 1LL * layout.tp * layout.ep * layout.dp * layout.pp;
  if (product != world_size) {
    layout_error("tp*ep*dp*pp = " + std::to_string(layout.tp) + "*" + std::to_string(layout.ep) +
                 "*" + std::to_string(layout.dp) + "*" + std::to_string(layout.pp) + " = " +
                 std::to_string(product) + " != world size " + std::to_string(world_size) +
                 "; choose degrees whose product is the number of ranks");
  }
}

Coordinates coordinates_of(const Layout& layout, int rank) {
  const std::vector<Axis> order = parse_order(layout.order);
  if (rank < 0 || rank >= layout.world_size()) {
    layout_error("rank " + std::to_string(rank) + " is outside 0.." +
                 std::to_string(layout.world_size() - 1) + " for " + layout.to_string());
  }
  auto coordinate = [&](Axis a) { return (rank / stride_of(layout, order, a)) % layout.degree(a); };
  return Coordinates{coordinate(Axis::tp), coordinate(Axis::ep), coordinate(Axis::dp),
                     coordinate(Axis::pp)};
}

std::vector<int> group_of(const Layout& layout, int rank, const std::vector<Axis>& axes) {
  const std::vector<Axis> order = parse_order(layout.order);
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

RankGroups rank_groups(const Layout& layout, int rank) {
  RankGroups groups;
  groups.rank = rank;
  groups.coordinates = coordinates_of(layout, rank);
  groups.tp = group_of(layout, rank, {Axis::tp});
  groups.ep = group_of(layout, rank, {Axis::ep});
  groups.dp = group_of(layout, rank, {Axis::dp});
  groups.pp = group_of(layout, rank, {Axis::pp});
  groups.dp_ep = group_of(layout, rank, {Axis::dp, Axis::ep});
  return groups;
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

}  // namespace trainctl::comm
