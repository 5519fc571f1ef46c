// CRC32C: the known vector, both implementations against each other, extension and combine.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "tensor/checksum.hpp"

using namespace trainctl::tensor;

TEST_CASE("crc32c matches the standard check value on both paths", "[ckpt][checksum]") {
  const char* digits = "123456789";
  CHECK(crc32c_software(digits, 9) == 0xE3069283u);
  CHECK(crc32c(digits, 9) == 0xE3069283u);
  CHECK(crc32c_hardware(digits, 9) == 0xE3069283u);
  CHECK(crc32c(digits, 0) == 0u);
  // 32 bytes of zeros: the iSCSI (RFC 3720) test vector.
  const std::vector<unsigned char> zeros(32, 0);
  CHECK(crc32c_software(zeros.data(), zeros.size()) == 0x8A9136AAu);
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
}

TEST_CASE("crc32c hardware and software agree on random data, lengths and alignments",
          "[ckpt][checksum]") {
  if (!crc32c_hardware_available()) WARN("no SSE4.2 here: only the software path is tested");
  std::mt19937_64 rng(7);
  std::vector<unsigned char> data(200000 + 64);
  for (auto& b : data)
    b = static_cast<unsigned char>(rng());
  std::uniform_int_distribution<size_t> length(0, 200000);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t offset = static_cast<size_t>(trial % 17);
    // Many short lengths, some past the 3-stream block size (24 KiB).
    const size_t n = trial < 150 ? static_cast<size_t>(trial) : length(rng);
    const uint32_t seed = static_cast<uint32_t>(rng());
    const uint32_t soft = crc32c_software(data.data() + offset, n, seed);
    REQUIRE(crc32c_hardware(data.data() + offset, n, seed) == soft);
    REQUIRE(crc32c(data.data() + offset, n, seed) == soft);
  }
}

TEST_CASE("crc32c extends chunk by chunk and combines from checksums alone", "[ckpt][checksum]") {
  std::mt19937 rng(11);
  std::vector<unsigned char> data(100003);
  for (auto& b : data)
    b = static_cast<unsigned char>(rng());
  const uint32_t whole = crc32c(data.data(), data.size());
  for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{77777}, data.size()}) {
    const uint32_t a = crc32c(data.data(), split);
    const uint32_t b = crc32c(data.data() + split, data.size() - split);
    CHECK(crc32c(data.data() + split, data.size() - split, a) == whole);
    CHECK(crc32c_combine(a, b, data.size() - split) == whole);
  }
  data[5000] ^= 1;
  CHECK(crc32c(data.data(), data.size()) != whole);
}
