// The corruption matrix: every damaged checkpoint is refused with a message naming the file (and
// tensor), never read out of bounds, never allocated by what the manifest claims.
#include <catch2/catch.hpp>

#include <random>

#include "ckpt_test_util.hpp"

using namespace trainctl::ckpt;
using namespace ckpt_test;
using nlohmann::json;

namespace {

// A valid two-tensor checkpoint at dir/step_00000001; returns the step directory.
fs::path make_checkpoint(const fs::path& dir) {
  SaveRequest r = simple_request(1);
  const auto values = iota_floats(100);
  r.add("adam_m/w", DType::f32, {100}, {}, values.data());
  return save(dir, r.header, r.slices()).path;
}

void flip_byte(const fs::path& path, std::streamoff offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  const char c = static_cast<char>(f.get());
  f.seekp(offset);
  f.put(static_cast<char>(c ^ 0x20));
}

// Rewrites the manifest through `edit` (re-stamping its self-checksum, so the lie reaches the
// checks behind it) and returns the error open() gives.
template <class Edit>
std::string open_error_after(const fs::path& step_dir, Edit edit) {
  json j = json::parse(read_text(step_dir / "manifest.json"));
  edit(j);
  j[std::string(kManifestChecksumKey)] = manifest_checksum(j);
  write_text(step_dir / "manifest.json", j.dump());
  try {
    CheckpointReader::open(step_dir);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("a flipped byte in a shard: verify and read name the file and tensor", "[ckpt]") {
  TempDir tmp;
  const fs::path dir = make_checkpoint(tmp.path);
  const auto reader = CheckpointReader::open(dir);
  const SliceRecord& slice = reader.tensor("adam_m/w").slices[0];
  flip_byte(dir / "rank_0.bin", static_cast<std::streamoff>(slice.offset + 17));
  const auto damaged = CheckpointReader::open(dir);  // sizes unchanged: opens
  CHECK_THROWS_WITH(damaged.verify(), Catch::Contains("rank_0.bin") &&
                                          Catch::Contains("tensor 'adam_m/w'") &&
                                          Catch::Contains("checksum mismatch"));
  std::vector<float> out(100);
  CHECK_THROWS_WITH(damaged.read("adam_m/w", DType::f32, out.data()),
                    Catch::Contains("tensor 'adam_m/w'"));
  std::vector<float> fine(48);
  damaged.read("model/w", DType::f32, fine.data());  // the other tensor is intact
  CHECK(fine == iota_floats(48));
}

TEST_CASE("a flipped byte outside any tensor fails the whole-file checksum", "[ckpt]") {
  TempDir tmp;
  const fs::path dir = make_checkpoint(tmp.path);
  flip_byte(dir / "rank_0.bin", 40);  // header padding
  CHECK_THROWS_WITH(CheckpointReader::open(dir).verify(),
                    Catch::Contains("rank_0.bin") && Catch::Contains("outside any tensor"));
  flip_byte(dir / "rank_0.bin", 40);
  flip_byte(dir / "rank_0.bin", 2);  // the magic
  CHECK_THROWS_WITH(CheckpointReader::open(dir).verify(), Catch::Contains("bad magic"));
}

TEST_CASE("a truncated or missing shard is refused at open", "[ckpt]") {
  TempDir tmp;
  const fs::path dir = make_checkpoint(tmp.path);
  const auto size = fs::file_size(dir / "rank_0.bin");
  fs::resize_file(dir / "rank_0.bin", size - 10);
  CHECK_THROWS_WITH(CheckpointReader::open(dir),
                    Catch::Contains("rank_0.bin has") && Catch::Contains("truncated"));
  fs::remove(dir / "rank_0.bin");
  CHECK_THROWS_WITH(CheckpointReader::open(dir),
                    Catch::Contains("rank_0.bin") && Catch::Contains("missing"));
  CHECK(scan(tmp.path).entries[0].status == Status::corrupt);
}

TEST_CASE("a corrupt, truncated or empty manifest is refused naming it", "[ckpt]") {
  TempDir tmp;
  const fs::path dir = make_checkpoint(tmp.path);
  const std::string text = read_text(dir / "manifest.json");
  for (const std::string& bad :
       {text.substr(0, text.size() / 2), std::string(), std::string("{\"format\": 1}"),
        std::string(100000, '['), "x" + text}) {
    write_text(dir / "manifest.json", bad);
    CHECK_THROWS_WITH(CheckpointReader::open(dir), Catch::Contains("manifest.json"));
  }
  fs::remove(dir / "manifest.json");
  CHECK_THROWS_WITH(CheckpointReader::open(dir), Catch::Contains("manifest.json is missing"));
}

TEST_CASE("manifest lies are refused: offsets, overlaps, shapes, names, types", "[ckpt]") {
  TempDir tmp;
  const fs::path dir = make_checkpoint(tmp.path);
  const std::string good = read_text(dir / "manifest.json");
  auto check = [&](auto edit, const std::string& expected) {
    write_text(dir / "manifest.json", good);
    CHECK_THAT(open_error_after(dir, edit), Catch::Contains(expected));
  };
  const auto w = "/tensors/0"_json_pointer;
  check([&](json& j) { j[w]["slices"][0]["offset"] = 1u << 30; }, "outside the file");
  check([&](json& j) { j[w]["slices"][0]["offset"] = uint64_t{1} << 63; }, "larger than");
  check([&](json& j) { j[w]["slices"][0]["offset"] = -64; }, "negative");
  check([&](json& j) { j[w]["slices"][0]["length"] = 4; }, "length 4");
  check([&](json& j) { j[w]["shape"] = {int64_t{1} << 40, int64_t{1} << 40}; }, "shape too large");
  check([&](json& j) { j[w]["shape"] = {1 << 20, 1 << 20}; }, "cover");
  check([&](json& j) { j[w]["slices"][0]["index"][0] = {0, 9}; }, "outside dimension 0");
  check([&](json& j) { j[w]["slices"][0]["index"] = {{0, 8}}; }, "1 ranges");
  check([&](json& j) { j[w]["slices"].push_back(j[w]["slices"][0]); }, "overlap");
  check([&](json& j) { j[w]["slices"] = json::array(); }, "cover 0 of its 48");
  check([&](json& j) { j["tensors"][1]["name"] = "model/w"; }, "appears twice");
  check([&](json& j) { j[w]["dtype"] = "f128"; }, "unknown dtype");
  check([&](json& j) { j[w]["slices"][0]["file"] = "../../etc/passwd"; }, "not listed");
  check([&](json& j) { j["files"]["../x"] = j["files"]["rank_0.bin"]; }, "not allowed");
  check([&](json& j) { j["files"]["rank_0.bin"]["bytes"] = 1u << 20; }, "1048576");
  check([&](json& j) { j["files"]["rank_7.bin"] = j["files"]["rank_0.bin"]; }, "rank_7.bin");
  check([&](json& j) { j["version"] = 2; }, "version 2 is not supported");
  check([&](json& j) { j["format"] = "other"; }, "\"other\"");
  check([&](json& j) { j["step"] = "1"; }, "expected a non-negative integer");
  check([&](json& j) { j.erase("state"); }, "missing \"state\"");
  check([&](json& j) { j[w]["slices"][0]["crc32c"] = 1.5; }, "crc32c");
  check([&](json& j) { j["tensors"][1]["slices"][0]["offset"] = 64; }, "share bytes");
}

TEST_CASE("random damage to a manifest never escapes as anything but CheckpointError", "[ckpt]") {
  TempDir tmp;
  const fs::path dir = make_checkpoint(tmp.path);
  const std::string good = read_text(dir / "manifest.json");
  std::mt19937 rng(3);
  int refused = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string text = good;
    const int edits = 1 + trial % 4;
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % text.size();
      switch (rng() % 3) {
        case 0:
          text[at] = "0123456789[]{}\",:-e"[rng() % 19];
          break;
        case 1:
          text.erase(at, 1 + rng() % 8);
          break;
        default:
          text.insert(at, 1, "9-[{\"0"[rng() % 6]);
      }
    }
    write_text(dir / "manifest.json", text);
    try {
      const auto reader = CheckpointReader::open(dir);
      std::vector<char> buffer(1 << 16);
      for (const TensorEntry& t : reader.manifest().tensors) {  // sizes are validated: bounded
        uint64_t bytes = trainctl::tensor::dtype_size(t.dtype);
        for (int64_t d : t.shape)
          bytes *= static_cast<uint64_t>(d);
        if (bytes <= buffer.size()) {
          try {
            reader.read(t.name, t.dtype, buffer.data());
          } catch (const CheckpointError&) {
          }
        }
      }
    } catch (const CheckpointError&) {
      ++refused;
    }
  }
  CHECK(refused > 200);
}
