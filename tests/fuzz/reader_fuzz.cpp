// libFuzzer target: a real checkpoint whose manifest and/or shard bytes come from the input, read
// through CheckpointReader::open, verify() and read() of every tensor (whole and a sub-box).
// Only CheckpointError may come out; any other exception, a crash, a sanitizer report or a
// timeout is a finding.
//
// Input: byte 0 = flags, bytes 1-2 = manifest length L (little-endian), then L manifest bytes,
// then the shard bytes (missing parts are empty).
//   flags bit 0: write the input's manifest (else the template's)
//         bit 1: write the input's shard (else the template's)
//         bit 2: re-stamp manifest_crc32c (when the manifest is a JSON object)
//         bit 3: set files["rank_0.bin"].bytes to the shard's size (then re-stamp)
//         bit 4: pad or cut the shard to the template's size
// The template (written once per process into a fresh temp directory) holds a tensor split into
// two slices, a bf16 matrix, an i32 vector and a scalar.
// TRAINCTL_FUZZ_WRITE_SEEDS=<dir>: also write seed inputs (manifest/ and reader/) there and exit.
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/ckpt.hpp"

using namespace trainctl::ckpt;
using nlohmann::json;

namespace {

struct Template {
  fs::path root;         // the temp directory, removed at exit
  fs::path step_dir;     // root/work/step_00000007: rewritten for every input
  std::string manifest;  // the template's bytes
  std::string shard;
};
Template g;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void remove_root() {
  std::error_code ec;
  fs::remove_all(g.root, ec);
}

void make_template() {
  std::string pattern = (fs::temp_directory_path() / "trainctl-fuzz-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) std::abort();
  g.root = pattern;
  std::atexit(remove_root);
  std::vector<float> w(8 * 6);
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = 0.5f + static_cast<float>(i);
  std::vector<uint16_t> h(3 * 5);
  for (size_t i = 0; i < h.size(); ++i)
    h[i] = static_cast<uint16_t>(0x3f80 + i);
  std::vector<int32_t> ids = {3, -1, 4, 1, 5, 9, 2};
  const float scalar = 2.5f;
  const std::vector<SliceData> slices = {
      {"model/w", DType::f32, {8, 6}, {{0, 5}, {0, 6}}, w.data()},
      {"model/w", DType::f32, {8, 6}, {{5, 8}, {0, 6}}, w.data() + 5 * 6},
      {"model/h", DType::bf16, {3, 5}, {}, h.data()},
      {"data/ids", DType::i32, {7}, {}, ids.data()},
      {"optim/scale", DType::f32, {}, {}, &scalar},
  };
  ManifestHeader header;
  header.step = 7;
  header.recipe_hash = "fuzz";
  header.layout = {{"tp", 1}, {"dp", 1}, {"world_size", 1}};
  header.state = {{"step", 7}, {"rng", {1, 2, 3}}, {"lr", 0.001}};
  const fs::path saved = save(g.root / "template", header, slices).path;
  g.manifest = read_file(saved / kManifestFile);
  g.shard = read_file(saved / shard_file_name(0));
  g.step_dir = g.root / "work" / step_dir_name(7);
  fs::create_directories(g.step_dir);
}

std::string restamp(const std::string& text, const std::string* shard) {
  int depth = 0;  // the harness's own parse must stay shallow
  for (char c : text)
    if ((c == '[' || c == '{') && ++depth > 64) return text;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return text;
  if (shard) {
    json& files = j["files"];
    if (files.is_object()) {
      json& entry = files["rank_0.bin"];
      if (entry.is_object()) entry["bytes"] = shard->size();
    }
  }
  j[std::string(kManifestChecksumKey)] = manifest_checksum(j);
  return j.dump(1);
}

void read_everything(const CheckpointReader& reader) {
  try {
    reader.verify();
  } catch (const CheckpointError&) {
  }
  for (const TensorEntry& t : reader.manifest().tensors) {
    // Bounded: validated slices cover the tensor and lie inside files of checked sizes.
    uint64_t numel = 1;
    for (int64_t d : t.shape)
      numel *= static_cast<uint64_t>(d);
    std::vector<char> buffer(static_cast<size_t>(numel * trainctl::tensor::dtype_size(t.dtype)));
    try {
      reader.read(t.name, t.dtype, buffer.data());
    } catch (const CheckpointError&) {
    }
    std::vector<Range> region;
    for (int64_t d : t.shape)
      region.push_back({d / 3, d - d / 4});
    try {
      reader.read(t.name, region, t.dtype, buffer.data());
    } catch (const CheckpointError&) {
    }
  }
}

void write_seeds(const fs::path& dir) {
  fs::create_directories(dir / "manifest");
  fs::create_directories(dir / "reader");
  write_file(dir / "manifest" / "template.json", g.manifest);
  json j = json::parse(g.manifest);
  j["state"] = {{"step", 7}, {"sampler", {{"epoch", 0}, {"position", 96}}}, {"scaler", 65536.0}};
  j[std::string(kManifestChecksumKey)] = manifest_checksum(j);
  write_file(dir / "manifest" / "state.json", j.dump());
  auto reader_seed = [&](const char* name, uint8_t flags, const std::string& manifest,
                         const std::string& shard) {
    std::string input(1, static_cast<char>(flags));
    input += static_cast<char>(manifest.size() & 0xff);
    input += static_cast<char>((manifest.size() >> 8) & 0xff);
    write_file(dir / "reader" / name, input + manifest + shard);
  };
  reader_seed("both", 0x03, g.manifest, g.shard);
  reader_seed("both_restamped", 0x07, g.manifest, g.shard);
  reader_seed("manifest_only", 0x05, g.manifest, "");
  reader_seed("shard_only", 0x12, "", g.shard);
  reader_seed("resized", 0x0f, g.manifest, g.shard.substr(0, g.shard.size() / 2));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  make_template();
  if (const char* seeds = std::getenv("TRAINCTL_FUZZ_WRITE_SEEDS")) {
    write_seeds(seeds);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t flags = data[0];
  const size_t wanted = data[1] | (size_t{data[2]} << 8);
  const size_t manifest_bytes = std::min(wanted, size - 3);
  const auto* text = reinterpret_cast<const char*>(data) + 3;
  std::string manifest = (flags & 1) ? std::string(text, manifest_bytes) : g.manifest;
  std::string shard =
      (flags & 2) ? std::string(text + manifest_bytes, size - 3 - manifest_bytes) : g.shard;
  if (flags & 16) shard.resize(g.shard.size(), '\0');
  if (flags & 12) manifest = restamp(manifest, (flags & 8) ? &shard : nullptr);
  write_file(g.step_dir / kManifestFile, manifest);
  write_file(g.step_dir / shard_file_name(0), shard);
  try {
    read_everything(CheckpointReader::open(g.step_dir));
  } catch (const CheckpointError&) {
  }
  return 0;
}
