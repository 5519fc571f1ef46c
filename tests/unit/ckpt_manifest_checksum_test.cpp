// The manifest's self-checksum: a flipped byte anywhere in manifest.json (above all inside the
// free-form layout/model/state JSON that no shard checksum covers) makes the checkpoint corrupt.
#include <catch2/catch.hpp>

#include "ckpt_test_util.hpp"
#include "tensor/checksum.hpp"

using namespace trainctl::ckpt;
using namespace ckpt_test;
using nlohmann::json;

namespace {

fs::path save_with_state(const fs::path& dir) {
  SaveRequest r = simple_request(5);
  r.header.layout = {{"tp", 1}, {"dp", 1}, {"world_size", 1}};
  r.header.state = {{"step", 5},
                    {"consumed_samples", 160},
                    {"lr", 0.000123456789},
                    {"scaler", {{"scale", 65536.0}, {"good_steps", 7}}},
                    {"note", "caf\u00e9 \"quoted\" \\ tab\t"}};
  return save(dir, r.header, r.slices()).path;
}

std::string open_error(const fs::path& step_dir) {
  try {
    CheckpointReader::open(step_dir);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("manifest round trip: the self-checksum is written and accepted", "[ckpt]") {
  TempDir tmp;
  const fs::path dir = save_with_state(tmp.path);
  const json j = json::parse(read_text(dir / "manifest.json"));
  REQUIRE(j.contains(std::string(kManifestChecksumKey)));
  CHECK(j[std::string(kManifestChecksumKey)].get<uint32_t>() == manifest_checksum(j));
  const auto reader = CheckpointReader::open(dir);
  CHECK(reader.manifest().header.state["lr"] == 0.000123456789);
  CHECK(reader.manifest().header.state["note"] == "caf\u00e9 \"quoted\" \\ tab\t");
  reader.verify();
  // Whitespace is not content: the same JSON pretty-printed another way still opens.
  write_text(dir / "manifest.json", j.dump(4));
  CHECK(CheckpointReader::open(dir).step() == 5);
  CHECK(scan(tmp.path).entries.at(0).status == Status::valid);
}

TEST_CASE("manifest_checksum ignores its own key and sees every other byte", "[ckpt]") {
  json a = {{"b", {1, 2.5, "x"}}, {"a", {{"k", nullptr}}}};
  const uint32_t plain = manifest_checksum(a);
  a[std::string(kManifestChecksumKey)] = 12345;
  CHECK(manifest_checksum(a) == plain);
  json copy = a;
  copy.erase(std::string(kManifestChecksumKey));
  const std::string text = copy.dump();
  CHECK(plain == trainctl::tensor::crc32c(text.data(), text.size()));
  a["b"][1] = 2.25;
  CHECK(manifest_checksum(a) != plain);
}

TEST_CASE("a flipped byte inside the manifest's state is corrupt", "[ckpt]") {
  TempDir tmp;
  const fs::path dir = save_with_state(tmp.path);
  const std::string good = read_text(dir / "manifest.json");
  // Each digit of "consumed_samples": 160 -> another valid number: only the checksum can tell.
  const size_t at = good.find("\"consumed_samples\"");
  REQUIRE(at != std::string::npos);
  const size_t digit = good.find("160", at);
  REQUIRE(digit != std::string::npos);
  for (size_t i = digit; i < digit + 3; ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] + 1);  // 260, 170, 161: still valid JSON
    write_text(dir / "manifest.json", bad);
    CHECK_THAT(open_error(dir), Catch::Contains("corrupt: manifest checksum mismatch") &&
                                    Catch::Contains("manifest.json"));
  }
  // A letter of the free-form note.
  std::string bad = good;
  const size_t note = bad.find("caf");
  REQUIRE(note != std::string::npos);
  bad[note] = 'C';
  write_text(dir / "manifest.json", bad);
  CHECK_THAT(open_error(dir), Catch::Contains("manifest checksum mismatch"));
  const ScanReport report = scan(tmp.path);
  REQUIRE(report.entries.size() == 1);
  CHECK(report.entries[0].status == Status::corrupt);
  CHECK_THAT(report.entries[0].reason, Catch::Contains("manifest checksum mismatch"));
}

TEST_CASE("a version 1 manifest without its checksum, or with a bad one, is corrupt", "[ckpt]") {
  TempDir tmp;
  const fs::path dir = save_with_state(tmp.path);
  json j = json::parse(read_text(dir / "manifest.json"));
  j.erase(std::string(kManifestChecksumKey));
  write_text(dir / "manifest.json", j.dump(1));
  CHECK_THAT(open_error(dir), Catch::Contains("corrupt: manifest checksum missing"));
  j[std::string(kManifestChecksumKey)] = "0x1234";
  write_text(dir / "manifest.json", j.dump(1));
  CHECK_THAT(open_error(dir), Catch::Contains("manifest_crc32c: expected a non-negative integer"));
  j[std::string(kManifestChecksumKey)] = uint64_t{1} << 32;
  write_text(dir / "manifest.json", j.dump(1));
  CHECK_THAT(open_error(dir), Catch::Contains("larger than"));
  // The version is checked before the checksum: a future format is named as such.
  j["version"] = 2;
  write_text(dir / "manifest.json", j.dump(1));
  CHECK_THAT(open_error(dir), Catch::Contains("version 2 is not supported"));
}
