// Layout validation and rank groups: pure functions, no processes.
#include <catch2/catch.hpp>
#include <set>

#include "comm/error.hpp"
#include "comm/layout.hpp"

using namespace trainctl::comm;
using Ranks = std::vector<int>;

namespace {

std::string layout_error(const Layout& layout, int world_size) {
  try {
    validate(layout, world_size);
  } catch (const CommError& error) {
    CHECK(error.kind() == CommError::Kind::usage);
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("layout errors show the formula and the fix", "[comm][layout]") {
  Layout layout{.tp = 2, .ep = 1, .dp = 2, .pp = 1};
  CHECK_NOTHROW(validate(layout, 4));
  const std::string mismatch = layout_error(layout, 8);
  CHECK_THAT(mismatch, Catch::Contains("tp*cp*ep*dp*pp = 2*1*1*2*1 = 4 != world size 8"));
  layout.dp = 0;
  CHECK_THAT(layout_error(layout, 0), Catch::Contains("dp = 0"));
  Layout bad_order{.tp = 2, .order = "tp-dp-pp"};
  CHECK_THAT(layout_error(bad_order, 2), Catch::Contains("lacks axis cp"));
  bad_order.order = "tp-ep-dp-xx";
  CHECK_THAT(layout_error(bad_order, 2), Catch::Contains("unknown axis 'xx'"));
  bad_order.order = "tp-tp-dp-pp";
  CHECK_THAT(layout_error(bad_order, 2), Catch::Contains("names axis tp twice"));
  CHECK_THROWS_AS(rank_groups(Layout{.dp = 2}, 2), CommError);
}

TEST_CASE("tp2 x dp2: tp is the fastest axis", "[comm][layout]") {
  const Layout layout{.tp = 2, .dp = 2};
  const RankGroups r3 = rank_groups(layout, 3);
  CHECK(r3.coordinates.tp == 1);
  CHECK(r3.coordinates.dp == 1);
  CHECK(r3.of(Axis::tp) == Ranks{2, 3});
  CHECK(r3.of(Axis::dp) == Ranks{1, 3});
  CHECK(r3.of(Axis::ep) == Ranks{3});
  CHECK(r3.of(Axis::pp) == Ranks{3});
  CHECK(r3.dp_ep == Ranks{1, 3});
  CHECK(all_groups(layout, {Axis::tp}) == std::vector<Ranks>{{0, 1}, {2, 3}});
  CHECK(all_groups(layout, {Axis::dp}) == std::vector<Ranks>{{0, 2}, {1, 3}});
}

TEST_CASE("tp2 x ep2 x dp2 x pp2: every group, and dp*ep for non-expert weights",
          "[comm][layout]") {
  const Layout layout{.tp = 2, .ep = 2, .dp = 2, .pp = 2};
  // rank = tp + 2*ep + 4*dp + 8*pp
  const RankGroups g = rank_groups(layout, 13);  // tp1 ep0 dp1 pp1
  CHECK(g.coordinates.tp == 1);
  CHECK(g.coordinates.ep == 0);
  CHECK(g.coordinates.dp == 1);
  CHECK(g.coordinates.pp == 1);
  CHECK(g.of(Axis::tp) == Ranks{12, 13});
  CHECK(g.of(Axis::ep) == Ranks{13, 15});
  CHECK(g.of(Axis::dp) == Ranks{9, 13});
  CHECK(g.of(Axis::pp) == Ranks{5, 13});
  CHECK(g.dp_ep == Ranks{9, 11, 13, 15});  // ep varies fastest inside the group
  // Each kind of group partitions the world: every rank exactly once.
  for (const auto& axes : std::vector<std::vector<Axis>>{
           {Axis::tp}, {Axis::ep}, {Axis::dp}, {Axis::pp}, {Axis::dp, Axis::ep}}) {
    std::multiset<int> seen;
    for (const auto& group : all_groups(layout, axes))
      seen.insert(group.begin(), group.end());
    CHECK(seen.size() == 16);
    CHECK(std::set<int>(seen.begin(), seen.end()).size() == 16);
  }
  CHECK(all_groups(layout, {Axis::dp, Axis::ep}).size() == 4);
  // Group membership agrees from every member's point of view.
  for (int rank = 0; rank < 16; ++rank) {
    const RankGroups mine = rank_groups(layout, rank);
    for (int member : mine.dp_ep)
      CHECK(rank_groups(layout, member).dp_ep == mine.dp_ep);
    for (int member : mine.of(Axis::tp))
      CHECK(rank_groups(layout, member).of(Axis::tp) == mine.of(Axis::tp));
  }
}

TEST_CASE("pp4 and dp3: odd and single-axis layouts", "[comm][layout]") {
  const Layout pp{.pp = 4};
  CHECK(rank_groups(pp, 2).of(Axis::pp) == Ranks{0, 1, 2, 3});
  CHECK(rank_groups(pp, 2).coordinates.pp == 2);
  CHECK(rank_groups(pp, 2).of(Axis::dp) == Ranks{2});
  const Layout dp3{.tp = 2, .dp = 3};
  CHECK(rank_groups(dp3, 5).of(Axis::dp) == Ranks{1, 3, 5});
  CHECK(rank_groups(dp3, 5).of(Axis::tp) == Ranks{4, 5});
}

TEST_CASE("another order string changes which axis is fastest", "[comm][layout]") {
  const Layout layout{.tp = 2, .dp = 2, .order = "dp-tp-cp-ep-pp"};
  CHECK(rank_groups(layout, 0).of(Axis::dp) == Ranks{0, 1});
  CHECK(rank_groups(layout, 0).of(Axis::tp) == Ranks{0, 2});
  CHECK(rank_groups(layout, 3).coordinates.dp == 1);
  CHECK(rank_groups(layout, 2).coordinates.tp == 1);
}
