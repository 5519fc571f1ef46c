// libFuzzer target: bytes -> parse_manifest (+ validate_manifest). Each input is tried twice:
// as given (almost every mutation then stops at the self-checksum), and, when it is a JSON object,
// with "manifest_crc32c" re-stamped, so the mutations reach the field and consistency checks
// behind the checksum. Findings: any exception other than CheckpointError, a crash, a sanitizer
// report, a timeout, or a broken invariant (abort):
//   - a manifest parse_manifest accepts passes validate_manifest again;
//   - manifest_to_json of it parses back to the same manifest (the writer's output is readable).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ckpt/format.hpp"

using namespace trainctl::ckpt;
using nlohmann::json;

namespace {

[[noreturn]] void broken(const char* what, const std::string& detail) {
  std::fprintf(stderr, "manifest_fuzz: invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

// Upper bound of the bracket depth (brackets inside strings count too): the harness's own
// json::parse must not recurse deeper than parse_manifest would allow.
bool shallow(std::string_view text) {
  int depth = 0;
  for (char c : text) {
    if (c == '[' || c == '{') {
      if (++depth > 64) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

void check(std::string_view text) {
  Manifest m;
  try {
    m = parse_manifest(text, "fuzz/manifest.json");
  } catch (const CheckpointError&) {
    return;  // refused: the expected outcome for damaged input
  }
  try {
    validate_manifest(m, "fuzz/manifest.json");
  } catch (const CheckpointError& e) {
    broken("accepted manifest fails validate_manifest", e.what());
  }
  const std::string again = manifest_to_json(m).dump(1);
  Manifest back;
  try {
    back = parse_manifest(again, "fuzz/round-trip.json");
  } catch (const CheckpointError& e) {
    broken("manifest_to_json output refused", e.what());
  }
  if (manifest_to_json(back) != manifest_to_json(m))
    broken("round trip changed the manifest", again.substr(0, 2000));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check(text);
  if (!shallow(text)) return 0;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return 0;
  j[std::string(kManifestChecksumKey)] = manifest_checksum(j);
  check(j.dump());
  return 0;
}
