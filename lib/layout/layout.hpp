// The parallel layout of a job: one value, used alike by the recipe (parallel.*), the planner (the
// layouts it scores), the mesh (the groups of a rank) and the model (what a rank holds). It
// depends on nothing but the standard library, so every module can take it.
//
// An axis is one row of kAxes and one degree field; the rank order (`order`) lists the axes from
// fastest-varying to slowest ("tp-cp-ep-dp-pp": consecutive ranks share a tp group, so tensor
// parallel stays inside a node's NVLink domain, context parallel next to it; pp varies slowest),
// Megatron's default order. Megatron's RankGenerator
// idea, torchtitan's ParallelDims value, without globals.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace trainctl {

enum class Axis { tp, cp, ep, dp, pp };

// Activation recomputation in backward: none, the attention core only, or whole blocks.
enum class Recompute { none, selective, full };
inline constexpr std::array<std::string_view, 3> kRecomputeNames{"none", "selective", "full"};

// A rank's index along each axis.
struct Coordinates {
  int tp = 0, cp = 0, ep = 0, dp = 0, pp = 0;
  int of(Axis axis) const;
};

struct Layout {
  int tp = 1;    // tensor parallel: each layer's heads and ffn columns split
  int cp = 1;    // context parallel: each sequence's tokens split (attention passes keys and
                 // values around a ring); the cp ranks of a dp rank share its data and sum their
                 // gradients with the dp ranks'
  int ep = 1;    // expert parallel: the experts of an MoE layer split
  int dp = 1;    // data parallel: the batch split, gradients summed
  int pp = 1;    // pipeline parallel: the layers split into stages
  int zero = 0;  // 1: optimizer state (master weights, moments) sharded over the dp ranks; 2: and
                 // the gradients (reduce-scattered per block as backward goes); 3: and the
                 // parameters (each block's gathered before its forward and its backward)
  // Megatron's sequence parallelism (tp > 1): the norms, residual adds and the rest between the
  // tensor-parallel GEMMs hold 1/tp of the micro-batch's tokens; the tp all-reduces become an
  // all-gather before each column-parallel GEMM and a reduce-scatter after each row-parallel one.
  bool sequence_parallel = false;
  Recompute recompute = Recompute::none;
  std::string order = "tp-cp-ep-dp-pp";  // the rank order, fastest axis first

  int degree(Axis axis) const { return this->*field(axis); }
  int& degree(Axis axis) { return this->*field(axis); }
  int world_size() const;
  // "tp2 cp1 ep1 dp2 pp1"
  std::string degrees() const;
  // "tp2 cp1 ep1 dp2 pp1 (order tp-cp-ep-dp-pp)"
  std::string to_string() const;
  // The world size as a formula: "tp*cp*ep*dp*pp = 2*1*1*2*1 = 4".
  std::string world_formula() const;
  // What makes this layout impossible by itself, one message per problem (a degree below 1, zero
  // outside 0..3, sequence parallel without tp, an order that is not a permutation of the axes);
  // empty when valid.
  std::vector<std::string> problems() const;
  bool operator==(const Layout&) const = default;

  struct AxisInfo {
    Axis axis;
    std::string_view name;
    int Layout::*degree;
    int Coordinates::*coordinate;
  };
  static const AxisInfo& info(Axis axis);

 private:
  static int Layout::*field(Axis axis) { return info(axis).degree; }
};

// Every axis, in the default rank order (fastest first). A new axis is an Axis value, a degree
// in Layout, an index in Coordinates and one row here; the mesh, the planner and the recipe's
// layout checks take it from this table.
inline constexpr std::array<Layout::AxisInfo, 5> kAxes{{
    {Axis::tp, "tp", &Layout::tp, &Coordinates::tp},
    {Axis::cp, "cp", &Layout::cp, &Coordinates::cp},
    {Axis::ep, "ep", &Layout::ep, &Coordinates::ep},
    {Axis::dp, "dp", &Layout::dp, &Coordinates::dp},
    {Axis::pp, "pp", &Layout::pp, &Coordinates::pp},
}};
inline const Layout::AxisInfo& Layout::info(Axis axis) {
  return kAxes[static_cast<size_t>(axis)];
}
inline std::string_view axis_name(Axis axis) {
  return Layout::info(axis).name;
}
inline int Coordinates::of(Axis axis) const {
  return this->*Layout::info(axis).coordinate;
}

// The axes of layout.order, fastest first. Throws std::invalid_argument (the message names the
// order and the fix) unless it names each axis exactly once.
std::vector<Axis> rank_order(const Layout& layout);

// Where `rank` sits in `layout` (valid: problems() empty; rank in [0, world_size)); throws
// std::invalid_argument otherwise.
Coordinates coordinates_of(const Layout& layout, int rank);
// The group of `rank` spanning `axes` (e.g. {Axis::dp, Axis::ep}) as global ranks; members vary
// fastest along the axis that comes first in layout.order. A rank's index in the list is its rank
// within the group.
std::vector<int> group_of(const Layout& layout, int rank, const std::vector<Axis>& axes);
// The index of the rank at `at` in its group spanning `axes`: its position in group_of's list.
int group_rank(const Layout& layout, const Coordinates& at, const std::vector<Axis>& axes);
// Every group spanning `axes`, ordered by first member: the whole partition of the world.
std::vector<std::vector<int>> all_groups(const Layout& layout, const std::vector<Axis>& axes);

}  // namespace trainctl
