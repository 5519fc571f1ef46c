// The TCP store's protocol: secret, proofs, bounded data and the server's connection state
// machine. See store_protocol.hpp for the wire format.
#include "comm/store_protocol.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "comm/error.hpp"

namespace trainctl::comm {
namespace {

constexpr std::string_view kClientLabel = "trainctl store client";
constexpr std::string_view kServerLabel = "trainctl store server";

void fill_random(uint8_t* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t got = ::getrandom(data, bytes, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw CommError(
          CommError::Kind::io,
          std::string("tcp store: the kernel's random source failed: ") + std::strerror(errno),
          "store.secret");
    }
    data += got;
    bytes -= static_cast<size_t>(got);
  }
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

template <class T>
T read_raw(std::string_view bytes, size_t at) {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof value);
  return value;
}

template <class T>
void append_raw(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

}  // namespace

// ---- secret and proofs --------------------------------------------------------------------------

StoreSecret StoreSecret::from_hex(std::string_view hex) {
  if (hex.size() != 2 * kStoreSecretBytes) {
    throw CommError(CommError::Kind::usage,
                    "the store secret has " + std::to_string(hex.size()) + " characters, not " +
                        std::to_string(2 * kStoreSecretBytes) + " hexadecimal digits",
                    "store.secret");
  }
  StoreSecret secret;
  for (size_t i = 0; i < kStoreSecretBytes; ++i) {
    const int high = hex_digit(hex[2 * i]);
    const int low = hex_digit(hex[2 * i + 1]);
    if (high < 0 || low < 0) {
      throw CommError(CommError::Kind::usage,
                      "the store secret has a character that is not a hexadecimal digit at "
                      "position " +
                          std::to_string(2 * i + (high < 0 ? 1 : 2)),
                      "store.secret");
    }
    secret.bytes_[i] = static_cast<uint8_t>(high << 4 | low);
  }
  return secret;
}

StoreSecret StoreSecret::generate() {
  StoreSecret secret;
  fill_random(secret.bytes_.data(), secret.bytes_.size());
  return secret;
}

std::string StoreSecret::hex() const {
  static constexpr char digits[] = "0123456789abcdef";
  std::string text;
  for (const uint8_t byte : bytes_) {
    text += digits[byte >> 4];
    text += digits[byte & 15];
  }
  return text;
}

StoreNonce random_nonce() {
  StoreNonce nonce;
  fill_random(nonce.data(), nonce.size());
  return nonce;
}

StoreProof store_proof(const StoreSecret& secret, StoreRole role, const StoreNonce& first,
                       const StoreNonce& second) {
  const std::string_view label = role == StoreRole::client ? kClientLabel : kServerLabel;
  std::string message(label);
  message.append(reinterpret_cast<const char*>(first.data()), first.size());
  message.append(reinterpret_cast<const char*>(second.data()), second.size());
  StoreProof proof{};
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), secret.bytes().data(), static_cast<int>(secret.bytes().size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), proof.data(),
           &length) == nullptr ||
      length != proof.size()) {
    throw CommError(CommError::Kind::io, "tcp store: OpenSSL's HMAC-SHA256 failed",
                    "store.handshake");
  }
  return proof;
}

bool same_proof(const StoreProof& a, const StoreProof& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// ---- data ---------------------------------------------------------------------------------------

bool StoreData::set(const std::string& key, std::string value) {
  const auto it = map_.find(key);
  const size_t old_bytes =
      it == map_.end() ? 0 : kStoreEntryOverhead + key.size() + it->second.size();
  const size_t new_bytes = kStoreEntryOverhead + key.size() + value.size();
  if (bytes_ - old_bytes + new_bytes > max_bytes_) return false;
  bytes_ = bytes_ - old_bytes + new_bytes;
  if (it == map_.end())
    map_.emplace(key, std::move(value));
  else
    it->second = std::move(value);
  return true;
}

const std::string* StoreData::find(const std::string& key) const {
  const auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

std::optional<int64_t> StoreData::add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  if (const std::string* old = find(key)) {
    // Exactly a decimal int64, else not a counter: restart it (the client API never mixes set and
    // add). from_chars takes no whitespace and no '+'.
    const auto [end, error] = std::from_chars(old->data(), old->data() + old->size(), value);
    if (error != std::errc() || end != old->data() + old->size()) value = 0;
  }
  // Wraps like the two's-complement counters it models, without signed overflow.
  value = static_cast<int64_t>(static_cast<uint64_t>(value) + static_cast<uint64_t>(delta));
  if (!set(key, std::to_string(value))) return std::nullopt;
  return value;
}

// ---- server connection --------------------------------------------------------------------------

StoreConnection::StoreConnection(const StoreSecret& secret, const StoreNonce& server_nonce,
                                 StoreData& data)
    : secret_(secret), server_nonce_(server_nonce), data_(data) {}

std::string StoreConnection::greeting() const {
  std::string text(kStoreMagic);
  text.append(reinterpret_cast<const char*>(server_nonce_.data()), server_nonce_.size());
  return text;
}

bool StoreConnection::fail(std::string why) {
  closed_ = true;
  reason_ = std::move(why);
  return false;
}

bool StoreConnection::receive(std::string_view bytes) {
  if (closed_) return false;
  if (!authenticated_) {
    // Before the handshake a client may send the handshake's bytes and nothing more: no more is
    // ever buffered for a client that has not proven it holds the secret.
    const size_t take = std::min(bytes.size(), kStoreNonceBytes + kStoreProofBytes - in_.size());
    in_.append(bytes.substr(0, take));
    bytes.remove_prefix(take);
    if (!handshake()) return false;
    if (!bytes.empty()) {
      out_.clear();  // the handshake's reply is not sent: the connection closes
      return fail("sent a request before the handshake's reply");
    }
  } else {
    in_.append(bytes);
  }
  while (authenticated_ && out_.size() < kStoreOutHighWater) {
    const int done = request();
    if (done < 0) return false;
    if (done == 0) break;
  }
  in_.erase(0, consumed_);
  consumed_ = 0;
  return true;
}

bool StoreConnection::handshake() {
  constexpr size_t need = kStoreNonceBytes + kStoreProofBytes;
  if (in_.size() - consumed_ < need) return true;  // waits for the rest
  StoreNonce client_nonce;
  StoreProof proof;
  std::memcpy(client_nonce.data(), in_.data() + consumed_, client_nonce.size());
  std::memcpy(proof.data(), in_.data() + consumed_ + client_nonce.size(), proof.size());
  consumed_ += need;
  if (!same_proof(proof, store_proof(secret_, StoreRole::client, server_nonce_, client_nonce))) {
    refused_secret_ = true;
    out_.push_back(0);
    return fail("wrong secret");
  }
  authenticated_ = true;
  out_.push_back(static_cast<char>(kStoreOk));
  const StoreProof mine = store_proof(secret_, StoreRole::server, client_nonce, server_nonce_);
  out_.append(reinterpret_cast<const char*>(mine.data()), mine.size());
  return true;
}

int StoreConnection::request() {
  const std::string_view in = std::string_view(in_).substr(consumed_);
  if (in.empty()) return 0;
  const char op = in[0];
  if (op != 'S' && op != 'G' && op != 'A') {
    fail("unknown request " + std::to_string(static_cast<uint8_t>(op)));
    return -1;
  }
  size_t at = 1;
  if (in.size() < at + sizeof(uint32_t)) return 0;
  const auto key_size = read_raw<uint32_t>(in, at);
  if (key_size > kStoreMaxKeyBytes) {
    fail("a key of " + std::to_string(key_size) + " bytes (the limit is " +
         std::to_string(kStoreMaxKeyBytes) + ")");
    return -1;
  }
  at += sizeof(uint32_t);
  if (in.size() < at + key_size) return 0;
  const std::string key(in.substr(at, key_size));
  at += key_size;
  if (op == 'S') {
    if (in.size() < at + sizeof(uint32_t)) return 0;
    const auto value_size = read_raw<uint32_t>(in, at);
    if (value_size > kStoreMaxValueBytes) {
      fail("a value of " + std::to_string(value_size) + " bytes (the limit is " +
           std::to_string(kStoreMaxValueBytes) + ")");
      return -1;
    }
    // An entry larger than the whole store can never be stored: refuse it before buffering it.
    if (kStoreEntryOverhead + key_size + value_size > data_.max_bytes()) {
      fail("a value of " + std::to_string(value_size) +
           " bytes can never fit the store's bound of " + std::to_string(data_.max_bytes()) +
           " bytes");
      return -1;
    }
    at += sizeof(uint32_t);
    if (in.size() < at + value_size) return 0;
    const bool stored = data_.set(key, std::string(in.substr(at, value_size)));
    at += value_size;
    out_.push_back(static_cast<char>(stored ? kStoreOk : kStoreFull));
  } else if (op == 'G') {
    const std::string* value = data_.find(key);
    out_.push_back(value != nullptr ? 1 : 0);
    if (value != nullptr) {
      append_raw(out_, static_cast<uint32_t>(value->size()));
      out_ += *value;
    }
  } else {
    if (in.size() < at + sizeof(int64_t)) return 0;
    const auto delta = read_raw<int64_t>(in, at);
    at += sizeof(int64_t);
    const std::optional<int64_t> value = data_.add(key, delta);
    out_.push_back(static_cast<char>(value ? kStoreOk : kStoreFull));
    append_raw(out_, value.value_or(0));
  }
  consumed_ += at;
  return 1;
}

}  // namespace trainctl::comm
