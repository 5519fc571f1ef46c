// trainctl::ckpt: sharded checkpoints that are either complete and verified or ignored.
//   format.hpp        the on-disk format, manifest types, strict manifest parser
//   shard_writer.hpp  write_shard / write_manifest / commit (many ranks) and save() (one process)
//   writer.hpp        CheckpointWriter (async saves, retention) and SaveRequest
//   reader.hpp        CheckpointReader (open, verify, resharding reads)
//   scan.hpp          scan(): every checkpoint in a directory with its status
// See docs/checkpoints.md for the format and the guarantees.
#pragma once

#include "ckpt/format.hpp"
#include "ckpt/reader.hpp"
#include "ckpt/scan.hpp"
#include "ckpt/shard_writer.hpp"
#include "ckpt/writer.hpp"
