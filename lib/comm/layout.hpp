// The layout (layout/layout.hpp) as the mesh uses it: a check against the world size that throws
// CommError, and the groups one rank belongs to.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "layout/layout.hpp"

namespace trainctl::comm {

using trainctl::all_groups;
using trainctl::Axis;
using trainctl::axis_name;
using trainctl::Coordinates;
using trainctl::coordinates_of;
using trainctl::group_of;
using trainctl::kAxes;
using trainctl::Layout;

// Throws CommError (Kind::usage) when the layout has a problem (Layout::problems) or the product
// of the degrees is not the world size; the message shows the formula:
// "tp*ep*dp*pp = 2*1*2*1 = 4 != world size 8".
void validate(const Layout& layout, int world_size);

// The groups one rank belongs to, as global ranks in group order (a rank's index in a list is its
// rank within that group). dp_ep spans the dp and ep axes: the group over which non-expert
// (replicated across expert-parallel ranks) gradients are summed.
struct RankGroups {
  int rank = 0;
  Coordinates coordinates;
  std::array<std::vector<int>, kAxes.size()> axes;  // one group per axis, indexed by Axis
  std::vector<int> dp_ep;
  // The gradient groups: dp and dp_ep widened by the cp axis (context-parallel ranks hold
  // different tokens of the same sequences, so their gradients are summed like the dp ranks').
  // Equal to dp and dp_ep when cp = 1.
  std::vector<int> dp_cp, dp_cp_ep;
  const std::vector<int>& of(Axis axis) const { return axes[static_cast<size_t>(axis)]; }
};

// The groups of `rank` (coordinates_of and group_of of layout/layout.hpp); throws CommError when
// the layout is invalid or the rank outside it.
RankGroups rank_groups(const Layout& layout, int rank);

}  // namespace trainctl::comm
