// Reading checkpoints. open() trusts nothing: the manifest is parsed strictly (see
// parse_manifest) and every listed file must exist with the listed size. verify() re-reads every
// byte and checks every slice and whole-file checksum. read() assembles any box of a logical
// tensor from whichever slices intersect it, so a run may load a checkpoint saved with another
// sharding; each slice's checksum is checked as it is read. No read ever leaves a file or buffer,
// whatever the manifest says. Not thread-safe (one reader per thread).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/file_io.hpp"
#include "ckpt/format.hpp"

namespace trainctl::ckpt {

class CheckpointReader {
 public:
  // step_dir: a checkpoints/step_<N> directory. Throws CheckpointError naming the file (and the
  // tensor) for a missing, malformed or inconsistent manifest or a missing/resized shard file.
  static CheckpointReader open(const fs::path& step_dir);

  const fs::path& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }
  int64_t step() const { return manifest_.header.step; }
  // The tensor's entry; throws CheckpointError naming the checkpoint when it has no such tensor.
  const TensorEntry& tensor(std::string_view name) const;

  // Re-reads every file: shard headers, every slice checksum, every whole-file checksum. Throws
  // CheckpointError naming the bad file and tensor.
  void verify() const;

  // Writes the box `region` (one [begin, end) per dimension) of tensor `name` to dst, row-major
  // with the box's extents; dst must hold product(extents) * dtype_size(dtype) bytes. dtype must
  // be the stored dtype (no conversion).
  void read(std::string_view name, const std::vector<Range>& region, DType dtype, void* dst) const;
  // The whole tensor.
  void read(std::string_view name, DType dtype, void* dst) const;

 private:
  const io::File& file(const std::string& name) const;
  void read_slice(const TensorEntry& t, const SliceRecord& s, void* dst) const;

  fs::path dir_;
  Manifest manifest_;
  mutable std::map<std::string, io::File> files_;
};

}  // namespace trainctl::ckpt
