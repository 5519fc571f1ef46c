// What this binary was built from: the version, the source commit and whether the tree was
// dirty (tracked files that differed from the commit), and the build type. Captured at every
// build by lib/run/build_info.cmake, so a binary never claims a commit it was not built from.
#pragma once

namespace trainctl::run {

struct BuildInfo {
  const char* version;     // "0.1.0" (CMake's project version)
  const char* commit;      // the full hash, or "unknown" outside a git checkout
  const char* tree;        // "clean" | "dirty" | "unknown"
  const char* build_type;  // "Release", "Debug", ...
};

const BuildInfo& build_info();

}  // namespace trainctl::run
