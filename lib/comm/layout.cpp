#include "comm/layout.hpp"

#include <stdexcept>

#include "comm/error.hpp"

namespace trainctl::comm {
namespace {

[[noreturn]] void layout_error(const std::string& message) {
  throw CommError(CommError::Kind::usage, "layout: " + message, "layout");
}

// The layout library's answer, or its std::invalid_argument as a CommError.
template <class F>
auto checked(F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    layout_error(e.what());
  }
}

}  // namespace

void validate(const Layout& layout, int world_size) {
  if (const std::vector<std::string> problems = layout.problems(); !problems.empty())
    layout_error(problems.front());
  if (layout.world_size() != world_size)
    layout_error(layout.world_formula() + " != world size " + std::to_string(world_size) +
                 "; choose degrees whose product is the number of ranks");
}

RankGroups rank_groups(const Layout& layout, int rank) {
  return checked([&] {
    RankGroups groups;
    groups.rank = rank;
    groups.coordinates = coordinates_of(layout, rank);
    for (const Layout::AxisInfo& axis : kAxes)
      groups.axes[static_cast<size_t>(axis.axis)] = group_of(layout, rank, {axis.axis});
    groups.dp_ep = group_of(layout, rank, {Axis::dp, Axis::ep});
    groups.dp_cp = group_of(layout, rank, {Axis::dp, Axis::cp});
    groups.dp_cp_ep = group_of(layout, rank, {Axis::dp, Axis::cp, Axis::ep});
    return groups;
  });
}

}  // namespace trainctl::comm
