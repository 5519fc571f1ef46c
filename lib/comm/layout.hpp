// Layout and rank groups: which ranks form the tp, ep, dp, pp (and dp*ep) groups of a job, as plain
// data. Megatron's RankGenerator idea without its globals: an order string lists the axes from
// fastest-varying to slowest ("tp-ep-dp-pp": consecutive ranks share a tp group, so tensor
// parallel stays inside a node's NVLink domain; pp varies slowest).
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace trainctl::comm {

enum class Axis { tp, ep, dp, pp };
std::string_view axis_name(Axis axis);

struct Layout {
  int tp = 1;
  int ep = 1;
  int dp = 1;
  int pp = 1;
  std::string order = "tp-ep-dp-pp";

  int degree(Axis axis) const;
  int world_size() const { return tp * ep * dp * pp; }
  std::string to_string() const;  // "tp2 ep1 dp2 pp1 (order tp-ep-dp-pp)"
};

// Throws CommError (Kind::usage) when a degree is < 1, the order is not a permutation of the four
// axes, or the product is not the world size; the message shows the formula:
// "tp*ep*dp*pp = 2*1*2*1 = 4 != world size 8".
void validate(const Layout& layout, int world_size);

struct Coordinates {
  int tp = 0;
  int ep = 0;
  int dp = 0;
  int pp = 0;
  int of(Axis axis) const;
};

// The groups one rank belongs to, as global ranks in group order (a rank's index in a list is its
// rank within that group). dp_ep spans the dp and ep axes: the group over which non-expert
// (replicated across expert-parallel ranks) gradients are summed.
struct RankGroups {
  int rank = 0;
  Coordinates coordinates;
  std::vector<int> tp, ep, dp, pp, dp_ep;
};

// Layout must be valid (validate() first); rank in [0, world_size).
Coordinates coordinates_of(const Layout& layout, int rank);
RankGroups rank_groups(const Layout& layout, int rank);
// The group of `rank` spanning `axes` (e.g. {Axis::dp, Axis::ep}); members vary fastest along the
// axis that comes first in layout.order.
std::vector<int> group_of(const Layout& layout, int rank, const std::vector<Axis>& axes);
// Every group spanning `axes`, ordered by first member: the whole partition of the world.
std::vector<std::vector<int>> all_groups(const Layout& layout, const std::vector<Axis>& axes);

}  // namespace trainctl::comm
