// The bytes of a TensorBoard event file, written by hand so trainctl needs neither protobuf nor
// TensorFlow. Exposed (rather than hidden in tensorboard_writer.cpp) so tests can check every byte.
//
// File layout: a sequence of TFRecords, each
//   uint64 length (little endian) | uint32 masked_crc32c(length bytes) | data | uint32
//   masked_crc32c(data)
// where data is one serialized tensorflow.Event protobuf. The first record must be the
// file_version event ("brain.Event:2"), the others carry summaries of scalar values.
//
// The protobuf subset used (field numbers from tensorflow/core/util/event.proto, summary.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trainctl::telemetry {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used by TFRecord.
// crc32c("123456789") == 0xE3069283.
std::uint32_t crc32c(std::string_view bytes);

// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32). The mask keeps a
// CRC of data that itself contains CRCs from being degenerate.
std::uint32_t masked_crc32c(std::string_view bytes);

// One TFRecord (header, payload, footer) around `payload`.
std::string encode_tfrecord(std::string_view payload);

// The first event of every file: wall_time and file_version = "brain.Event:2" (no step).
std::string encode_file_version_event(double wall_time);

// An Event carrying one Summary with one simple_value per (tag, value), in the given order.
// Tags must be non-empty (TensorBoard drops empty tags); throws std::invalid_argument otherwise.
std::string encode_scalars_event(double wall_time, std::int64_t step,
                                 std::span<const std::pair<std::string, float>> scalars);

}  // namespace trainctl::telemetry
