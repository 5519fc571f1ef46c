#include "tensor/checksum.hpp"

#include <array>
#include <bit>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define TRAINCTL_CRC32C_X86 1
#endif

namespace trainctl::tensor {
namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // Castagnoli, bit-reflected

// tables[k][b]: the CRC of byte b followed by k zero bytes (slice-by-8).
constexpr std::array<std::array<uint32_t, 256>, 8> make_tables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i)
      c = (c & 1u) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; ++b)
    for (size_t k = 1; k < 8; ++k)
      t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
  return t;
}
constexpr auto kTables = make_tables();

uint64_t load_le64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

// Multiply two polynomials modulo the CRC polynomial (bit-reflected), as zlib's multmodp.
uint32_t multiply_mod_poly(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1u) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8 * bytes) modulo the polynomial: the operator that shifts a CRC over `bytes` zero bytes.
uint32_t shift_operator(uint64_t bytes) {
  uint32_t power = 1u << 30;  // x^1, squared each round: x^(2^k)
  uint32_t p = 1u << 31;      // x^0
  uint64_t n = bytes * 8;
  while (n) {
    if (n & 1u) p = multiply_mod_poly(power, p);
    power = multiply_mod_poly(power, power);
    n >>= 1;
  }
  return p;
}

#ifdef TRAINCTL_CRC32C_X86
// Each of the three streams covers kStreamBytes per round; the shift over one stream is a constant.
constexpr size_t kStreamBytes = 8192;

__attribute__((target("sse4.2"))) uint32_t hardware_run(uint32_t state, const unsigned char* p,
                                                        size_t n) {
  uint64_t c = state;
  for (; n >= 8; n -= 8, p += 8)
    c = _mm_crc32_u64(c, load_le64(p));
  auto c32 = static_cast<uint32_t>(c);
  for (; n; --n, ++p)
    c32 = _mm_crc32_u8(c32, *p);
  return c32;
}

__attribute__((target("sse4.2"))) uint32_t hardware_impl(const void* data, size_t bytes,
                                                         uint32_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = seed;
  // Align to 8 bytes so the 64-bit loads below are aligned.
  size_t head = (8 - reinterpret_cast<uintptr_t>(p) % 8) % 8;
  if (head > bytes) head = bytes;
  crc = ~hardware_run(~crc, p, head);
  p += head;
  bytes -= head;
  if (bytes >= 3 * kStreamBytes) {
    static const uint32_t shift = shift_operator(kStreamBytes);
    while (bytes >= 3 * kStreamBytes) {
      uint64_t a = ~crc, b = 0xffffffffu, c = 0xffffffffu;
      const unsigned char* pa = p;
      const unsigned char* pb = p + kStreamBytes;
      const unsigned char* pc = p + 2 * kStreamBytes;
      for (size_t i = 0; i < kStreamBytes; i += 8) {
        a = _mm_crc32_u64(a, load_le64(pa + i));
        b = _mm_crc32_u64(b, load_le64(pb + i));
        c = _mm_crc32_u64(c, load_le64(pc + i));
      }
      const uint32_t crc_a = ~static_cast<uint32_t>(a);
      const uint32_t crc_b = ~static_cast<uint32_t>(b);
      const uint32_t crc_c = ~static_cast<uint32_t>(c);
      crc = multiply_mod_poly(shift, multiply_mod_poly(shift, crc_a) ^ crc_b) ^ crc_c;
      p += 3 * kStreamBytes;
      bytes -= 3 * kStreamBytes;
    }
  }
  return ~hardware_run(~crc, p, bytes);
}

bool detect_hardware() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}
#endif

using Impl = uint32_t (*)(const void*, size_t, uint32_t);
Impl choose_impl() {
#ifdef TRAINCTL_CRC32C_X86
  if (detect_hardware()) return hardware_impl;
#endif
  return crc32c_software;
}

}  // namespace

uint32_t crc32c_software(const void* data, size_t bytes, uint32_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~seed;
  for (; bytes >= 8; bytes -= 8, p += 8) {
    const uint64_t word = load_le64(p) ^ c;
    c = kTables[7][word & 0xff] ^ kTables[6][(word >> 8) & 0xff] ^ kTables[5][(word >> 16) & 0xff] ^
        kTables[4][(word >> 24) & 0xff] ^ kTables[3][(word >> 32) & 0xff] ^
        kTables[2][(word >> 40) & 0xff] ^ kTables[1][(word >> 48) & 0xff] ^ kTables[0][word >> 56];
  }
  for (; bytes; --bytes, ++p)
    c = (c >> 8) ^ kTables[0][(c ^ *p) & 0xffu];
  return ~c;
}

bool crc32c_hardware_available() {
#ifdef TRAINCTL_CRC32C_X86
  static const bool available = detect_hardware();
  return available;
#else
  return false;
#endif
}

uint32_t crc32c_hardware(const void* data, size_t bytes, uint32_t seed) {
#ifdef TRAINCTL_CRC32C_X86
  if (crc32c_hardware_available()) return hardware_impl(data, bytes, seed);
#endif
  return crc32c_software(data, bytes, seed);
}

uint32_t crc32c(const void* data, size_t bytes, uint32_t seed) {
  static const Impl impl = choose_impl();
  return impl(data, bytes, seed);
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b) {
  return multiply_mod_poly(shift_operator(bytes_b), crc_a) ^ crc_b;
}

}  // namespace trainctl::tensor
