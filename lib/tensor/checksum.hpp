// CRC32C (Castagnoli polynomial, the checksum of iSCSI, ext4 metadata and most storage formats).
// Used by checkpoints to prove every slice and shard file byte-exact. Contract:
//   crc32c(data, n)                 the standard CRC32C (crc32c("123456789") == 0xE3069283)
//   crc32c(b, nb, crc32c(a, na))    == crc32c(a||b): a running checksum extends chunk by chunk
//   crc32c_combine(ca, cb, nb)      == crc32c(a||b) from the two checksums alone (O(log nb))
// The default entry point uses the SSE4.2 crc32 instruction (three interleaved streams, about
// 20 GB/s) when the CPU has it and a slice-by-8 table otherwise; both are exposed for tests.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trainctl::tensor {

uint32_t crc32c(const void* data, size_t bytes, uint32_t seed = 0);

// The checksum of a||b given crc_a = crc32c(a), crc_b = crc32c(b) and the length of b.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b);

// The two implementations behind crc32c(); crc32c_hardware() requires crc32c_hardware_available().
uint32_t crc32c_software(const void* data, size_t bytes, uint32_t seed = 0);
uint32_t crc32c_hardware(const void* data, size_t bytes, uint32_t seed = 0);
bool crc32c_hardware_available();

}  // namespace trainctl::tensor
