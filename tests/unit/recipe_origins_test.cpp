// Origins: where each key of a loaded recipe came from (file position, --set, preset, default), and
// problems located there; plus the data-file checks that need real files and format_report.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "recipe/recipe.hpp"

namespace {

using namespace trainctl::recipe;

// A folder for this test's files, removed when the tests end.
const std::filesystem::path& temp_dir() {
  struct Dir {
    std::filesystem::path path = std::filesystem::temp_directory_path() /
                                 ("trainctl_recipe_origins_test_" + std::to_string(::getpid()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

std::string write_temp(const std::string& name, const std::string& text) {
  auto path = temp_dir() / name;
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
  return path.string();
}

// Line 3 sets model.hidden at column 17 and model.heads at column 28.
const std::string kRecipe =
    "name: o\n"
    "data: {source: synthetic}\n"
    "model: {hidden: 64, heads: 4}\n"
    "training:\n"
    "  global_batch: 16\n";

}  // namespace

namespace trainctl::recipe {
// So that Catch prints a Problem that differs.
std::ostream& operator<<(std::ostream& out, const Problem& p) {
  return out << "{\"" << p.file << "\", " << p.line << ", " << p.col << ", \"" << p.message
             << "\"}";
}
}  // namespace trainctl::recipe

TEST_CASE("origins name the file position, the last --set, the preset or the default") {
  std::string path = write_temp("o.yaml", kRecipe);
  LoadedRecipe loaded =
      load_recipe_with_origins(path, {"model.hidden=128", "training.steps=50", "model.hidden=96"});
  const Origins& o = loaded.origins;
  CHECK(loaded.recipe.model.hidden == 96);
  CHECK(o.file() == path);

  KeyOrigin heads = o.of("model.heads");
  CHECK(heads.source == KeyOrigin::Source::file);
  CHECK(heads.line == 3);
  CHECK(heads.col == 28);
  CHECK(o.describe("model.heads") == path + ":3:28");
  CHECK(o.describe("training.global_batch") == path + ":5:17");

  KeyOrigin hidden = o.of("model.hidden");  // the file, then two --set: the last one counts
  CHECK(hidden.source == KeyOrigin::Source::set);
  CHECK(hidden.set_arg == "model.hidden=96");
  CHECK(hidden.set_index == 2);
  CHECK(o.describe("model.hidden") == "--set model.hidden=96");
  CHECK(o.describe("training.steps") == "--set training.steps=50");

  CHECK(o.describe("model.kv_heads") == "preset");
  CHECK(o.describe("model.norm") == "preset");
  CHECK(o.describe("parallel.dp") == "default");
  CHECK_FALSE(o.of("parallel.dp").user_set());
  CHECK(o.of("name").user_set());
  CHECK_THROWS_AS(o.of("model.hiden"), std::invalid_argument);
  CHECK_THROWS_AS(o.describe("model"), std::invalid_argument);
}

TEST_CASE("Origins::problem locates a key's problem where the user set it") {
  std::string path = write_temp("o.yaml", kRecipe);
  Origins o = load_recipe_with_origins(path, {"parallel.dp=2"}).origins;
  CHECK(o.problem("model.heads", "too many") == Problem{path, 3, 28, "model.heads: too many"});
  CHECK(o.problem("parallel.dp", "one rank only") ==
        Problem{"", 0, 0, "--set parallel.dp=2: one rank only"});
  CHECK(o.problem("parallel.tp", "x") == Problem{path, 0, 0, "parallel.tp: x"});
  CHECK(format_problem(o.problem("model.heads", "too many")) ==
        path + ":3:28: error: model.heads: too many");
}

TEST_CASE("rule problems go to the latest --set, else the first key the file sets") {
  std::string path = write_temp("o.yaml", kRecipe);
  Origins file_only = load_recipe_with_origins(path).origins;
  CHECK(file_only.locate({"parallel.tp", "model.heads", "model.hidden"}) == "model.heads");
  CHECK(file_only.locate({"parallel.tp", "parallel.dp"}).empty());
  CHECK(file_only.rule_problem({"parallel.tp", "model.hidden", "model.heads"}, "a % b") ==
        Problem{path, 3, 17, "a % b"});
  CHECK(file_only.rule_problem({"parallel.tp"}, "a % b") == Problem{path, 0, 0, "a % b"});

  Origins with_set =
      load_recipe_with_origins(path, {"training.micro_batch=2", "parallel.dp=2"}).origins;
  std::vector<std::string_view> batch_keys{"training.global_batch", "training.micro_batch",
                                           "parallel.dp", "parallel.ep"};
  CHECK(with_set.locate(batch_keys) == "parallel.dp");  // the later of the two --set
  CHECK(with_set.locate({"training.global_batch", "training.micro_batch"}) ==
        "training.micro_batch");  // a --set beats the file's more specific key
  CHECK(with_set.rule_problem(batch_keys, "16 % 8") ==
        Problem{"", 0, 0, "--set parallel.dp=2: 16 % 8"});
  CHECK_THROWS_AS(with_set.locate({"training.batch"}), std::invalid_argument);
}

TEST_CASE("parse_recipe_with_origins keeps the label as the file") {
  LoadedRecipe loaded = parse_recipe_with_origins(kRecipe, "memory");
  CHECK(loaded.origins.describe("model.hidden") == "memory:3:17");
  CHECK(loaded.recipe == parse_recipe(kRecipe, "memory"));
  CHECK(Origins().describe("model.hidden") == "default");
}

TEST_CASE("existing data files and matching llmc globs load") {
  std::string text = write_temp("data/corpus.txt", "hello\n");
  std::string shard = write_temp("shards/train_000.bin", "not checked here");
  write_temp("shards/val_000.bin", "x");
  std::string shards = (temp_dir() / "shards" / "train_*.bin").string();
  Recipe r = parse_recipe(
      "name: d\ndata: {source: text, path: " + text + ", val_path: " + text + "}\n", "d.yaml");
  CHECK(r.data.path == text);
  Recipe glob = parse_recipe("name: d\ndata: {source: llmc, path: '" + shards + "'}\n", "d.yaml");
  CHECK(glob.data.path == shards);
  Recipe one = parse_recipe("name: d\ndata: {source: llmc, path: " + shard + "}\n", "d.yaml");
  CHECK(one.data.path == shard);
  // A glob that matches only a directory matches no file.
  std::filesystem::create_directories(temp_dir() / "dirs" / "a.bin");
  std::string dirs = (temp_dir() / "dirs" / "*.bin").string();
  try {
    parse_recipe("name: d\ndata: {source: llmc, path: '" + dirs + "'}\n", "d.yaml");
    FAIL("a glob matching only a directory was accepted");
  } catch (const RecipeError& e) {
    REQUIRE(e.problems().size() == 1);
    CHECK(e.problems()[0].message == "data.path: '" + dirs + "' matches no file");
  }
}

TEST_CASE("format_report lists every problem and the summary line") {
  std::vector<Problem> two{{"r.yaml", 3, 4, "model.layers: must be >= 1, got 0"},
                           {"", 0, 0, "--set x=1: unknown key 'x'"}};
  CHECK(format_report(two, "r.yaml") ==
        "r.yaml:3:4: error: model.layers: must be >= 1, got 0\n"
        "error: --set x=1: unknown key 'x'\n"
        "2 problems in r.yaml\n");
  CHECK(format_report({two[1]}, "r.yaml") ==
        "error: --set x=1: unknown key 'x'\n1 problem in r.yaml\n");
}
