// `parallel: auto`: the planner chooses the parallel layout. The recipe records the request
// (Recipe::parallel.automatic), keeps the parallel keys at their defaults, refuses parallel.* keys
// given beside it, and dumps/reads back as `parallel: auto`.
#include <catch2/catch.hpp>

#include <string>

#include "recipe/recipe.hpp"

namespace {

using trainctl::recipe::parse_recipe;
using trainctl::recipe::RecipeError;

const std::string kOk = "name: t\ndata: {source: synthetic}\n";  // lines 1-2

}  // namespace

TEST_CASE("parallel: auto sets parallel.automatic and keeps the defaults") {
  const auto r = parse_recipe(kOk + "parallel: auto\n", "r.yaml");
  CHECK(r.parallel.automatic);
  CHECK(r.parallel.tp == 1);
  CHECK(r.parallel.pp == 1);
  CHECK(r.parallel.dp == 1);
  CHECK(r.parallel.ep == 1);
  CHECK_FALSE(parse_recipe(kOk, "r.yaml").parallel.automatic);
  CHECK_FALSE(trainctl::recipe::default_recipe().parallel.automatic);
}

TEST_CASE("parallel=auto given with --set asks for the planner too") {
  const auto r = parse_recipe(kOk, "r.yaml", {"parallel=auto"});
  CHECK(r.parallel.automatic);
  // It replaces the file's parallel section.
  const auto replaced =
      parse_recipe(kOk + "parallel: {tp: 2, recompute: full}\n", "r.yaml", {"parallel=auto"});
  CHECK(replaced.parallel.automatic);
  CHECK(replaced.parallel.tp == 1);
  CHECK(replaced.parallel.recompute == trainctl::Recompute::none);
}

TEST_CASE("parallel: auto with a parallel key is a problem at that key") {
  try {
    parse_recipe(kOk + "parallel: auto\n", "r.yaml", {"parallel.tp=2"});
    FAIL("expected RecipeError");
  } catch (const RecipeError& e) {
    REQUIRE(e.problems().size() == 1);
    CHECK(trainctl::recipe::format_problem(e.problems()[0]) ==
          "error: --set parallel.tp=2: `parallel: auto` lets the planner choose every parallel.* "
          "key; remove this key or the `auto`");
  }
}

TEST_CASE("a parallel scalar other than auto names the two spellings") {
  try {
    parse_recipe(kOk + "parallel: fast\n", "r.yaml");
    FAIL("expected RecipeError");
  } catch (const RecipeError& e) {
    REQUIRE(e.problems().size() == 1);
    CHECK(trainctl::recipe::format_problem(e.problems()[0]) ==
          "r.yaml:3:11: error: section 'parallel' must be a map of keys, e.g. `parallel: {key: "
          "value}`, or `parallel: auto` to let the planner choose");
  }
}

TEST_CASE("parallel: auto dumps as itself and reads back equal") {
  const auto r = parse_recipe(kOk + "parallel: auto\n", "r.yaml");
  const std::string dumped = trainctl::recipe::dump_recipe(r);
  CHECK(dumped.find("parallel: auto\n") != std::string::npos);
  CHECK(dumped.find("  tp:") == std::string::npos);
  CHECK(parse_recipe(dumped, "dump.yaml") == r);
  CHECK(trainctl::recipe::recipe_hash(r) !=
        trainctl::recipe::recipe_hash(parse_recipe(kOk, "r.yaml")));
}
