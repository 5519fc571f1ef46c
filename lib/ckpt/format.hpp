// The checkpoint format, version 1: one directory per step,
//   checkpoints/step_<8 digits>/manifest.json   what every tensor is and where its slices live
//   checkpoints/step_<8 digits>/rank_<N>.bin    the raw bytes each rank owns
// A shard file starts with a 64-byte header ("TCKPT001", u32 version, u32 rank, zeros) followed by
// slices, each the row-major little-endian bytes of one box of a logical tensor, 64-byte aligned.
// The manifest maps every logical tensor (name, dtype, global shape) to its slices (file, offset,
// length, index ranges, crc32c) and lists every file with its size and whole-file crc32c, so a
// reader can assemble any region of a tensor from any saving layout. See docs/checkpoints.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensor/dtype.hpp"

namespace trainctl::ckpt {

namespace fs = std::filesystem;
using tensor::DType;

// Every problem with writing or reading a checkpoint: the message names the path (and tensor)
// and what to do. A corrupt checkpoint is an error of the data, never a crash.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr std::string_view kFormatName = "trainctl-checkpoint";
inline constexpr int kFormatVersion = 1;
inline constexpr char kShardMagic[8] = {'T', 'C', 'K', 'P', 'T', '0', '0', '1'};
inline constexpr uint64_t kShardHeaderBytes = 64;
inline constexpr uint64_t kSliceAlignment = 64;
inline constexpr std::string_view kManifestFile = "manifest.json";
inline constexpr std::string_view kLatestFile = "latest";
// Size limits of what a reader reads, checked before a byte is parsed (docs/checkpoints.md,
// "Limits"). A manifest is parsed into an nlohmann::json tree that costs up to ~37 bytes of memory
// per byte of JSON (measured: an array of empty objects), so 16 MiB bounds a parse to ~0.6 GiB;
// the compact manifest of a real run takes ~100 bytes per slice, so 16 MiB holds ~160k slices
// (a 1024-rank MoE run has well under 150k). The writer refuses to commit a larger manifest, so
// a run that would outgrow the limit fails at its first save, not at resume.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{16} << 20;
inline constexpr uint64_t kMaxShardIndexBytes = kMaxManifestBytes;   // rank_<N>.index.json
inline constexpr uint64_t kMaxShardErrorBytes = uint64_t{64} << 10;  // rank_<N>.error
inline constexpr uint64_t kMaxLatestBytes = 4096;                    // checkpoints/latest
// The most dimensions of a tensor along which its slices may be split (trainctl's tensors have at
// most 4 dimensions): the tiling check costs 2^(split dimensions) per slice.
inline constexpr size_t kMaxSplitDims = 4;
// The manifest's self-checksum key (see manifest_checksum). Required in version 1.
inline constexpr std::string_view kManifestChecksumKey = "manifest_crc32c";

// [begin, end) along one dimension of a tensor.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// Where one box of a logical tensor lives.
struct SliceRecord {
  std::string file;          // shard file name inside the step directory ("rank_0.bin")
  uint64_t offset = 0;       // byte offset in that file
  uint64_t length = 0;       // bytes = product of index extents * dtype size
  std::vector<Range> index;  // one range per dimension of the global shape
  uint32_t crc32c = 0;
};

struct TensorEntry {
  std::string name;  // the caller's ("model/embed.wte", "adam_m/...")
  DType dtype = DType::f32;
  std::vector<int64_t> shape;  // global shape
  std::vector<SliceRecord> slices;
};

struct FileEntry {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// What the caller supplies for a save. layout/model/state are free JSON objects whose content the
// caller owns (layout: tp/ep/dp/pp/zero/world_size; model: shape facts; state: step, sampler, rng,
// lr position, loss scaler, optimizer step count...).
struct ManifestHeader {
  int64_t step = 0;
  std::string recipe_hash;
  nlohmann::json layout = nlohmann::json::object();
  nlohmann::json model = nlohmann::json::object();
  nlohmann::json state = nlohmann::json::object();
  // The run's provenance.json (lib/run/provenance.hpp) as it was at the save; null: not recorded
  // (checkpoints of older versions, tests).
  nlohmann::json provenance;
};

struct Manifest {
  ManifestHeader header;
  std::string created;  // UTC, ISO 8601 ("2025-01-31T12:00:00Z")
  std::vector<TensorEntry> tensors;
  std::map<std::string, FileEntry> files;

  const TensorEntry* find(std::string_view name) const;
};

// The byte at which JSON `text` nests deeper than `max_depth` arrays/objects (nlohmann's parser
// recurses per level: check untrusted text first), or std::string_view::npos.
size_t json_too_deep(std::string_view text, int max_depth = 64);

// "f32", "bf16", ... (tensor::dtype_name) back to the enum; nullopt for an unknown name.
std::optional<DType> parse_dtype(std::string_view name);

// "step_00000042"; and back: the step of a "step_<digits>" name, nullopt for any other name.
std::string step_dir_name(int64_t step);
std::optional<int64_t> parse_step_dir_name(std::string_view name);
// "rank_3.bin"
std::string shard_file_name(int rank);

// The manifest as JSON, with "manifest_crc32c" set (manifest_checksum of the rest).
nlohmann::json manifest_to_json(const Manifest& manifest);

// The self-checksum of a manifest: CRC32C of the compact JSON serialisation (nlohmann dump():
// keys sorted, no whitespace) of the top-level object without the "manifest_crc32c" key. Shard
// checksums cannot see the free JSON (layout/model/state), so a flipped byte there would
// otherwise go unnoticed. A serialisation rather than the file bytes, so whitespace or a
// pretty-printer never matters; dump(parse(dump(x))) == dump(x) makes it stable.
uint32_t manifest_checksum(const nlohmann::json& manifest);

// Parses manifest.json text strictly: format and version first, then the self-checksum (missing or
// different: "corrupt: manifest checksum mismatch"), then every field present and typed, every
// number in range, every tensor's slices inside its shape, non-overlapping and covering it, names
// unique, every slice inside a listed file. `source` names the file in messages. Total: any input
// either yields a consistent Manifest or throws CheckpointError (never allocates by what the text
// claims).
Manifest parse_manifest(std::string_view text, const std::string& source);

// The consistency checks parse_manifest runs after reading the fields (also used by the writer
// before it commits a manifest built from the ranks' shard indices).
void validate_manifest(const Manifest& manifest, const std::string& source);

// "[[0,4),[0,6)]" for messages.
std::string format_index(const std::vector<Range>& index);

}  // namespace trainctl::ckpt
