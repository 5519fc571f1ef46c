// Checkpoint round trips, manifest content, resharded reads, atomic commit and scan statuses.
#include <catch2/catch.hpp>

#include <cstring>

#include "ckpt_test_util.hpp"
#include "tensor/dtype.hpp"

using namespace trainctl::ckpt;
using namespace ckpt_test;
namespace tensor = trainctl::tensor;

namespace {

// Saves the [8,6] f32 matrix iota(0.5) as two row blocks written by two "ranks".
fs::path save_two_ranks(const fs::path& dir, int64_t step, bool by_columns) {
  const auto full = iota_floats(48);
  std::vector<float> part0, part1;
  std::vector<Range> index0, index1;
  if (by_columns) {
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 6; ++c)
        (c < 2 ? part0 : part1).push_back(full[static_cast<size_t>(r * 6 + c)]);
    index0 = {{0, 8}, {0, 2}};
    index1 = {{0, 8}, {2, 6}};
  } else {
    part0.assign(full.begin(), full.begin() + 24);
    part1.assign(full.begin() + 24, full.end());
    index0 = {{0, 4}, {0, 6}};
    index1 = {{4, 8}, {0, 6}};
  }
  const fs::path tmp = begin_save(dir, step);
  const SliceData s0{"model/w", DType::f32, {8, 6}, index0, part0.data()};
  const SliceData s1{"model/w", DType::f32, {8, 6}, index1, part1.data()};
  std::vector<ShardIndex> indices{write_shard(tmp, 0, {&s0, 1}), write_shard(tmp, 1, {&s1, 1})};
  // Rank 1's index crosses the wire as JSON.
  indices[1] = shard_index_from_json(shard_index_to_json(indices[1]));
  ManifestHeader header;
  header.step = step;
  header.layout = {{"dp", 2}, {"world_size", 2}};
  write_manifest(tmp, header, indices);
  return commit(dir, tmp, step);
}

}  // namespace

TEST_CASE("round trip of f32/bf16/f16/i32 tensors with odd shapes", "[ckpt]") {
  TempDir tmp;
  const auto f32 = iota_floats(3 * 5 * 7);
  std::vector<tensor::bf16> b16(13);
  std::vector<tensor::f16> h16(6);
  std::vector<int32_t> i32(9);
  for (size_t i = 0; i < b16.size(); ++i)
    b16[i] = tensor::to_bf16(static_cast<float>(i) * -1.5f);
  for (size_t i = 0; i < h16.size(); ++i)
    h16[i] = tensor::to_f16(static_cast<float>(i) + 0.125f);
  for (size_t i = 0; i < i32.size(); ++i)
    i32[i] = static_cast<int32_t>(i * 1000003) - 7;
  const float scalar = 42.25f;

  SaveRequest request;
  request.header.step = 7;
  request.header.recipe_hash = "feed";
  request.add("model/a", DType::f32, {3, 5, 7}, {}, f32.data());
  request.add("master/b", DType::bf16, {13}, {}, b16.data());
  request.add("adam_m/c", DType::f16, {2, 3}, {}, h16.data());
  request.add("state/d", DType::i32, {1, 1, 9}, {}, i32.data());
  request.add("state/scalar", DType::f32, {}, {}, &scalar);
  const SaveStats stats = save(tmp.path, request.header, request.slices());
  CHECK(stats.path == tmp.path / "step_00000007");
  CHECK(stats.bytes == fs::file_size(stats.path / "rank_0.bin"));

  const auto reader = CheckpointReader::open(stats.path);
  reader.verify();
  std::vector<float> f32_back(f32.size());
  reader.read("model/a", DType::f32, f32_back.data());
  CHECK(f32_back == f32);
  std::vector<tensor::bf16> b16_back(b16.size());
  reader.read("master/b", DType::bf16, b16_back.data());
  CHECK(std::memcmp(b16_back.data(), b16.data(), b16.size() * 2) == 0);
  std::vector<tensor::f16> h16_back(h16.size());
  reader.read("adam_m/c", DType::f16, h16_back.data());
  CHECK(std::memcmp(h16_back.data(), h16.data(), h16.size() * 2) == 0);
  std::vector<int32_t> i32_back(i32.size());
  reader.read("state/d", DType::i32, i32_back.data());
  CHECK(i32_back == i32);
  float scalar_back = 0;
  reader.read("state/scalar", DType::f32, &scalar_back);
  CHECK(scalar_back == scalar);
  for (const TensorEntry& t : reader.manifest().tensors)
    for (const SliceRecord& s : t.slices)
      CHECK(s.offset % kSliceAlignment == 0);
  CHECK_THROWS_WITH(reader.read("model/a", DType::bf16, f32_back.data()),
                    Catch::Contains("stored as f32, not bf16"));
  CHECK_THROWS_WITH(reader.read("model/missing", DType::f32, f32_back.data()),
                    Catch::Contains("no tensor 'model/missing'"));
}

TEST_CASE("manifest records format, header, layout, state, tensors and files", "[ckpt]") {
  TempDir tmp;
  SaveRequest request = simple_request(12);
  request.header.layout = {{"tp", 1}, {"dp", 1}, {"world_size", 1}};
  request.header.model = {{"n_layer", 2}};
  request.header.state = {{"step", 12}, {"consumed_samples", 384}, {"rng", {1, 2}}};
  save(tmp.path, request.header, request.slices());
  const auto j = nlohmann::json::parse(read_text(tmp.path / "step_00000012" / "manifest.json"));
  CHECK(j["format"] == "trainctl-checkpoint");
  CHECK(j["version"] == 1);
  CHECK(j["step"] == 12);
  CHECK(j["recipe_hash"] == "abc123");
  const std::string created = j["created"];
  CHECK(created.size() == 20);
  CHECK(created.back() == 'Z');
  CHECK(j["layout"]["world_size"] == 1);
  CHECK(j["model"]["n_layer"] == 2);
  CHECK(j["state"]["consumed_samples"] == 384);
  REQUIRE(j["tensors"].size() == 1);
  const auto& t = j["tensors"][0];
  CHECK(t["name"] == "model/w");
  CHECK(t["dtype"] == "f32");
  CHECK(t["shape"] == nlohmann::json({8, 6}));
  CHECK(t["slices"][0]["file"] == "rank_0.bin");
  CHECK(t["slices"][0]["offset"] == 64);
  CHECK(t["slices"][0]["length"] == 8 * 6 * 4);
  CHECK(t["slices"][0]["index"] == nlohmann::json({{0, 8}, {0, 6}}));
  const auto bin = tmp.path / "step_00000012" / "rank_0.bin";
  CHECK(j["files"]["rank_0.bin"]["bytes"] == fs::file_size(bin));
  CHECK(read_text(bin).substr(0, 8) == "TCKPT001");
}

TEST_CASE("a tensor saved by two ranks is read whole and by a different sharding", "[ckpt]") {
  TempDir tmp;
  const auto full = iota_floats(48);
  for (bool by_columns : {false, true}) {
    const fs::path dir = save_two_ranks(tmp.path, by_columns ? 2 : 1, by_columns);
    const auto reader = CheckpointReader::open(dir);
    reader.verify();
    CHECK(reader.manifest().files.size() == 2);
    std::vector<float> whole(48);
    reader.read("model/w", DType::f32, whole.data());
    CHECK(whole == full);
    // A column block crossing the row split: rows 1..6, columns 2..4.
    std::vector<float> block(6 * 3);
    reader.read("model/w", {{1, 7}, {2, 5}}, DType::f32, block.data());
    for (int r = 0; r < 6; ++r)
      for (int c = 0; c < 3; ++c)
        CHECK(block[static_cast<size_t>(r * 3 + c)] ==
              full[static_cast<size_t>((r + 1) * 6 + c + 2)]);
    // A row block as a new layout would load it.
    std::vector<float> rows(2 * 6);
    reader.read("model/w", {{3, 5}, {0, 6}}, DType::f32, rows.data());
    CHECK(std::equal(rows.begin(), rows.end(), full.begin() + 18));
    CHECK_THROWS_WITH(reader.read("model/w", {{0, 9}, {0, 6}}, DType::f32, rows.data()),
                      Catch::Contains("outside dimension 0"));
  }
}

TEST_CASE("write_manifest refuses slices that overlap or leave a hole", "[ckpt]") {
  TempDir tmp;
  const auto data = iota_floats(48);
  const fs::path dir = begin_save(tmp.path, 3);
  const SliceData a{"model/w", DType::f32, {8, 6}, {{0, 5}, {0, 6}}, data.data()};
  const SliceData b{"model/w", DType::f32, {8, 6}, {{4, 8}, {0, 6}}, data.data()};
  const SliceData c{"model/w", DType::f32, {8, 6}, {{5, 8}, {0, 6}}, data.data()};
  auto ia = write_shard(dir, 0, {&a, 1});
  CHECK_THROWS_WITH(write_manifest(dir, {}, {ia, write_shard(dir, 1, {&b, 1})}),
                    Catch::Contains("overlap"));
  CHECK_THROWS_WITH(write_manifest(dir, {}, {ia}), Catch::Contains("cover 30 of its 48"));
  write_manifest(dir, {}, {ia, write_shard(dir, 1, {&c, 1})});
  CHECK(fs::exists(dir / "manifest.json"));
}

TEST_CASE("commit renames the tmp dir into place, moves latest last, never overwrites", "[ckpt]") {
  TempDir tmp;
  SaveRequest first = simple_request(1);
  save(tmp.path, first.header, first.slices());
  CHECK(read_text(tmp.path / "latest") == "step_00000001\n");

  const fs::path dir = begin_save(tmp.path, 2);
  CHECK(dir.filename().string().starts_with(".tmp-step_00000002."));
  const auto values = iota_floats(48);
  const SliceData s{"model/w", DType::f32, {8, 6}, {}, values.data()};
  ManifestHeader header;
  header.step = 2;
  write_manifest(dir, header, {write_shard(dir, 0, {&s, 1})});
  // Everything is written but not committed: no step_ name, latest unchanged, scan says partial.
  CHECK_FALSE(fs::exists(tmp.path / "step_00000002"));
  CHECK(read_text(tmp.path / "latest") == "step_00000001\n");
  ScanReport report = scan(tmp.path);
  REQUIRE(report.entries.size() == 2);
  CHECK(report.entries[0].status == Status::partial);
  CHECK(report.newest_valid()->name == "step_00000001");
  commit(tmp.path, dir, 2);
  CHECK(read_text(tmp.path / "latest") == "step_00000002\n");
  CHECK_FALSE(fs::exists(dir));
  CHECK_FALSE(fs::exists(tmp.path / "latest.tmp"));

  SaveRequest again = simple_request(2);
  CHECK_THROWS_WITH(save(tmp.path, again.header, again.slices()),
                    Catch::Contains("step_00000002 already exists"));
  for (const auto& entry : fs::directory_iterator(tmp.path))  // the failed attempt left nothing
    CHECK_FALSE(entry.path().filename().string().starts_with(".tmp-"));
}

TEST_CASE("scan reports valid, partial and corrupt entries, newest first", "[ckpt]") {
  TempDir tmp;
  for (int64_t step : {1, 2, 3}) {
    SaveRequest r = simple_request(step);
    save(tmp.path, r.header, r.slices());
  }
  fs::create_directory(tmp.path / "step_00000004");  // no manifest
  fs::create_directory(tmp.path / ".tmp-step_00000005.424242");
  write_text(tmp.path / "step_00000003" / "manifest.json", "{ not json");
  // step 2: one flipped byte inside the tensor: only a full scan sees it.
  {
    std::fstream f(tmp.path / "step_00000002" / "rank_0.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  fs::create_directory(tmp.path / "unrelated");

  ScanReport quick = scan(tmp.path);
  REQUIRE(quick.entries.size() == 5);
  CHECK(quick.entries[0].name == ".tmp-step_00000005.424242");
  CHECK(quick.entries[0].status == Status::partial);
  CHECK(quick.entries[1].status == Status::partial);
  CHECK_THAT(quick.entries[1].reason, Catch::Contains("no manifest.json"));
  CHECK(quick.entries[2].status == Status::corrupt);
  CHECK_THAT(quick.entries[2].reason, Catch::Contains("not valid JSON"));
  CHECK(quick.entries[3].status == Status::valid);
  CHECK(quick.newest_valid()->step == 2);
  CHECK(quick.latest == "step_00000003");

  ScanReport full = scan(tmp.path, Verify::full);
  CHECK(full.entries[3].status == Status::corrupt);
  CHECK_THAT(full.entries[3].reason, Catch::Contains("checksum mismatch"));
  CHECK(full.newest_valid()->step == 1);
  CHECK(status_name(Status::corrupt) == "corrupt");
  CHECK(scan(tmp.path / "does-not-exist").entries.empty());
}
