// The bytes of TensorBoard event files: CRC32C, TFRecord framing and the hand-encoded protobuf
// Event, each checked against values computed independently of this code.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "telemetry/tfrecord.hpp"

using namespace trainctl::telemetry;

namespace {

// Builds a byte string from hex pairs ("0a 01 61" -> "\x0a\x01\x61").
std::string bytes_from_hex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i < hex.size(); ++i) {
    if (hex[i] == ' ') continue;
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    ++i;
  }
  return out;
}

}  // namespace

TEST_CASE("crc32c matches the Castagnoli check value and RFC 3720 vectors") {
  CHECK(crc32c("123456789") == 0xE3069283U);
  CHECK(crc32c("abc") == 0x364B3FB7U);
  CHECK(crc32c("") == 0U);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAU);
  CHECK(crc32c(std::string(32, '\xff')) == 0x62A8AB43U);
  std::string ascending;
  for (int i = 0; i < 32; ++i)
    ascending.push_back(static_cast<char>(i));
  CHECK(crc32c(ascending) == 0x46DD794EU);
}

TEST_CASE("masked_crc32c rotates right by 15 and adds 0xa282ead8") {
  CHECK(masked_crc32c("123456789") == 0xC78AB0E5U);
  CHECK(masked_crc32c("abc") == 0x21F1576EU);
}

TEST_CASE("encode_tfrecord frames a payload with length, masked CRCs and payload") {
  const std::string expected = bytes_from_hex("03 00 00 00 00 00 00 00  b0 99 49 0e") + "abc" +
                               bytes_from_hex("6e 57 f1 21");
  CHECK(encode_tfrecord("abc") == expected);
  CHECK(encode_tfrecord("").size() == 16);
}

TEST_CASE("file_version event is wall_time (field 1) and 'brain.Event:2' (field 3)") {
  const std::string expected =
      bytes_from_hex("09 00 00 00 00 00 00 f8 3f  1a 0d") + "brain.Event:2";
  CHECK(encode_file_version_event(1.5) == expected);
}

TEST_CASE("scalar event encodes byte-exact: wall_time, step, summary{value{tag, simple_value}}") {
  const std::vector<std::pair<std::string, float>> one = {{"a", 1.0f}};
  // 09 <double 1.5> | 10 03 (step 3) | 2a 0a (summary, 10 bytes) | 0a 08 (value, 8 bytes)
  // | 0a 01 'a' (tag) | 15 <float 1.0>
  CHECK(
      encode_scalars_event(1.5, 3, one) ==
      bytes_from_hex("09 00 00 00 00 00 00 f8 3f  10 03  2a 0a  0a 08  0a 01 61  15 00 00 80 3f"));

  const std::vector<std::pair<std::string, float>> two = {{"train/loss", 0.1f}, {"b", -2.0f}};
  const std::string expected =
      bytes_from_hex("09 00 00 00 00 00 00 00 00  10 ac 02  2a 1d  0a 11  0a 0a") + "train/loss" +
      bytes_from_hex("15 cd cc cc 3d  0a 08  0a 01 62  15 00 00 00 c0");
  CHECK(encode_scalars_event(0.0, 300, two) == expected);
}

TEST_CASE("scalar event encodes a negative step as a 10-byte varint") {
  const std::vector<std::pair<std::string, float>> one = {{"a", 1.0f}};
  const std::string event = encode_scalars_event(1.5, -1, one);
  CHECK(event.substr(9, 11) == bytes_from_hex("10 ff ff ff ff ff ff ff ff ff 01"));
}

TEST_CASE("scalar event rejects an empty tag") {
  const std::vector<std::pair<std::string, float>> empty_tag = {{"", 1.0f}};
  CHECK_THROWS_WITH(encode_scalars_event(0.0, 1, empty_tag), Catch::Contains("empty tag"));
}
