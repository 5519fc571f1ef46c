// The TCP store's wire protocol, and its server side as a state machine on bytes (no sockets, no
// clock), so that the parser is unit-tested and fuzzed on bytes alone (tests/fuzz).
//
// Handshake: a mutual HMAC-SHA256 challenge-response keyed by the job's secret (OpenSSL).
//   server -> client  "TCS2", server nonce (32 random bytes)
//   client -> server  client nonce (32 random bytes),
//                     HMAC(secret, "trainctl store client" | server nonce | client nonce)
//   server -> client  u8 1, HMAC(secret, "trainctl store server" | client nonce | server nonce)
//                     or u8 0 (wrong secret), and the server closes the connection.
// Each side proves it holds the secret over the other side's fresh nonce, so a captured handshake
// is worthless on a new connection (replay), and a rank that reaches another job's server (the
// same port on a shared node) finds out at once instead of reading that job's keys. Proofs are
// compared in constant time (CRYPTO_memcmp).
//
// Requests, once the handshake is done:
//   u8 op ('S' set, 'G' get, 'A' add), u32 key length, key bytes, then
//   for 'S': u32 value length, value bytes; for 'A': i64 delta.
// Replies: 'S': u8 status; 'G': u8 found, and if found u32 length + bytes; 'A': u8 status, i64.
// A status is kOk or kFull (the store holds its byte bound: nothing was changed).
// Integers travel in host byte order: every rank of a job runs on the same architecture.
//
// What an attacker who can reach the port but lacks the secret can do: open connections (bounded,
// each closed after the handshake deadline or when a newer one needs its slot) and send up to one
// handshake's bytes on each. Nothing it sends is stored, and it reads nothing but a nonce.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace trainctl::comm {

inline constexpr std::string_view kStoreMagic = "TCS2";
inline constexpr size_t kStoreNonceBytes = 32;
inline constexpr size_t kStoreProofBytes = 32;  // HMAC-SHA256
inline constexpr size_t kStoreSecretBytes = 32;
// Request fields are bounded so that no client can make the server allocate without limit.
inline constexpr uint32_t kStoreMaxKeyBytes = 64 * 1024;
inline constexpr uint32_t kStoreMaxValueBytes = 64 * 1024 * 1024;
inline constexpr uint8_t kStoreOk = 1;
inline constexpr uint8_t kStoreFull = 2;

using StoreNonce = std::array<uint8_t, kStoreNonceBytes>;
using StoreProof = std::array<uint8_t, kStoreProofBytes>;

// The job's shared secret: 32 bytes, written as 64 hexadecimal digits in the environment
// (TRAINCTL_STORE_SECRET). Never printed: describe() and error messages leave it out.
class StoreSecret {
 public:
  // Throws CommError (usage) when `hex` is not exactly 64 hexadecimal digits; the message says
  // what was wrong (length, position of a bad digit) without repeating the text.
  static StoreSecret from_hex(std::string_view hex);
  // 32 bytes from the kernel's random source (getrandom).
  static StoreSecret generate();
  std::string hex() const;
  const std::array<uint8_t, kStoreSecretBytes>& bytes() const { return bytes_; }

 private:
  std::array<uint8_t, kStoreSecretBytes> bytes_{};
};

// Fresh random bytes from the kernel (getrandom); throws CommError when it fails.
StoreNonce random_nonce();

// HMAC(secret, label | first | second) with label "trainctl store client" or "... server".
enum class StoreRole { client, server };
StoreProof store_proof(const StoreSecret& secret, StoreRole role, const StoreNonce& first,
                       const StoreNonce& second);
// Constant-time equality of two proofs.
bool same_proof(const StoreProof& a, const StoreProof& b);

// The keys and values, with a bound on the bytes they hold (keys + values + a fixed overhead per
// entry, kStoreEntryOverhead, for the map's own memory).
inline constexpr size_t kStoreEntryOverhead = 64;
class StoreData {
 public:
  explicit StoreData(size_t max_bytes) : max_bytes_(max_bytes) {}
  // False, and nothing changes, when the write would take the store past its bound.
  bool set(const std::string& key, std::string value);
  const std::string* find(const std::string& key) const;
  // The counter's new value; nullopt (nothing changed) when the bound is reached. A value that is
  // not a number counts as 0.
  std::optional<int64_t> add(const std::string& key, int64_t delta);
  size_t bytes() const { return bytes_; }
  size_t max_bytes() const { return max_bytes_; }
  size_t keys() const { return map_.size(); }

 private:
  size_t max_bytes_;
  size_t bytes_ = 0;
  std::map<std::string, std::string, std::less<>> map_;
};

// One client connection on the server side. The server writes greeting() first, then hands every
// received chunk to receive() and sends what out() holds. receive() answers complete requests
// until out() holds kStoreOutHighWater bytes; the rest stays buffered, and the server reads no
// more from the socket until it has sent out() and called receive({}) again. So one connection
// holds at most one request's bytes plus one reply in memory.
inline constexpr size_t kStoreOutHighWater = 64 * 1024;
class StoreConnection {
 public:
  StoreConnection(const StoreSecret& secret, const StoreNonce& server_nonce, StoreData& data);

  std::string greeting() const;
  // False when the connection must close: reason() says why (wrong secret, malformed request).
  bool receive(std::string_view bytes);
  std::string& out() { return out_; }
  bool authenticated() const { return authenticated_; }
  // Whether a message has begun and is not complete: the server's per-request deadline runs.
  bool mid_message() const { return !in_.empty(); }
  bool refused_secret() const { return refused_secret_; }
  const std::string& reason() const { return reason_; }
  size_t buffered() const { return in_.size() + out_.size(); }

 private:
  bool handshake();
  // 1: answered one request; 0: waits for more bytes; -1: close (reason_ set).
  int request();
  bool fail(std::string why);

  const StoreSecret& secret_;
  StoreNonce server_nonce_;
  StoreData& data_;
  bool authenticated_ = false;
  bool refused_secret_ = false;
  bool closed_ = false;
  std::string in_;
  size_t consumed_ = 0;  // bytes of in_ already parsed (compacted after each call)
  std::string out_;
  std::string reason_;
};

}  // namespace trainctl::comm
