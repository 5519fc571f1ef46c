#include "telemetry/tfrecord.hpp"

#include <array>
#include <bit>
#include <cstring>
#include <stdexcept>

namespace trainctl::telemetry {
namespace {

constexpr std::array<std::uint32_t, 256> make_crc32c_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit)
      crc = (crc & 1U) ? (crc >> 1) ^ 0x82F63B78U : crc >> 1;
    table[i] = crc;
  }
  return table;
}

constexpr std::array<std::uint32_t, 256> kCrc32cTable = make_crc32c_table();

// Protobuf wire types.
constexpr std::uint32_t kWireVarint = 0;
constexpr std::uint32_t kWireFixed64 = 1;
constexpr std::uint32_t kWireLengthDelimited = 2;
constexpr std::uint32_t kWireFixed32 = 5;

void put_varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, std::uint32_t field, std::uint32_t wire_type) {
  put_varint(out, (static_cast<std::uint64_t>(field) << 3) | wire_type);
}

// Little-endian fixed-width integer (protobuf fixed32/fixed64 and the TFRecord header).
template <typename T>
void put_little_endian(std::string& out, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<char>((static_cast<std::uint64_t>(value) >> (8 * i)) & 0xFF));
  }
}

void put_bytes_field(std::string& out, std::uint32_t field, std::string_view bytes) {
  put_key(out, field, kWireLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

void put_double_field(std::string& out, std::uint32_t field, double value) {
  put_key(out, field, kWireFixed64);
  put_little_endian(out, std::bit_cast<std::uint64_t>(value));
}

}  // namespace

std::uint32_t crc32c(std::string_view bytes) {
  std::uint32_t crc = 0xFFFFFFFFU;
  for (const char c : bytes) {
    crc = kCrc32cTable[(crc ^ static_cast<unsigned char>(c)) & 0xFF] ^ (crc >> 8);
  }
  return crc ^ 0xFFFFFFFFU;
}

std::uint32_t masked_crc32c(std::string_view bytes) {
  const std::uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8U;
}

std::string encode_tfrecord(std::string_view payload) {
  std::string header;
  put_little_endian(header, static_cast<std::uint64_t>(payload.size()));
  std::string record = header;
  put_little_endian(record, masked_crc32c(header));
  record.append(payload);
  put_little_endian(record, masked_crc32c(payload));
  return record;
}

std::string encode_file_version_event(double wall_time) {
  std::string event;
  put_double_field(event, 1, wall_time);
  put_bytes_field(event, 3, "brain.Event:2");
  return event;
}

std::string encode_scalars_event(double wall_time, std::int64_t step,
                                 std::span<const std::pair<std::string, float>> scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    if (tag.empty()) {
      throw std::invalid_argument(
          "TensorBoard scalar with an empty tag: give every scalar a name such as 'train/loss'");
    }
    std::string value_message;
    put_bytes_field(value_message, 1, tag);
    put_key(value_message, 2, kWireFixed32);
    put_little_endian(value_message, std::bit_cast<std::uint32_t>(value));
    put_bytes_field(summary, 1, value_message);
  }
  std::string event;
  put_double_field(event, 1, wall_time);
  put_key(event, 2, kWireVarint);
  put_varint(event, static_cast<std::uint64_t>(step));  // int64: negatives take 10 bytes
  put_bytes_field(event, 5, summary);
  return event;
}

}  // namespace trainctl::telemetry
