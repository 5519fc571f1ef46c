// libFuzzer target: the TCP store's wire protocol (lib/comm/store_protocol.hpp), driving the
// server's StoreConnection with a fixed secret and server nonce, the bytes cut into chunks at
// positions taken from the input (so partial messages and partial handshakes are exercised).
// After each chunk the harness does what the server does (tcp_store.cpp): it "sends" out(), clears
// it and calls receive({}) again until no reply is left.
//
// Input: byte 0 = flags, byte 1 = handshake split, byte 2 = number of cuts N (mod 32), then N
// little-endian u16 cut offsets (each taken mod the body's size + 1), then the body.
//   flags bit 0: mode b: a correct handshake first (client nonce fixed, proof from store_proof),
//                split after (byte 1 mod 64) bytes, then the body as requests; else mode a: the
//                body goes straight into receive() with no handshake (the seeds hold a valid
//                handshake for the fixed nonces, so mode a can also get past it)
//         bits 1-2: the store's byte bound: 1 MiB, 4 KiB, 512 B, 100 B (one small entry)
//         bit 3: no draining between chunks (receive() while out() holds replies; drained at end)
//         bit 4: mode b: the handshake's last piece carries the body's first chunk (a client that
//                does not wait for the handshake's reply: the server must close)
//         bit 5: mode b: one byte of the client's proof flipped (the server must refuse)
// Findings: a crash, a sanitizer report, an exception, a timeout, or a broken invariant (abort):
//   - before authentication: buffered() <= nonce + proof + 1 (the refusal byte), nothing stored;
//   - data.bytes() <= data.max_bytes();
//   - one receive() never takes out() past max(its size before, high water - 1 + one reply);
//   - once receive() returned false it always does, and nothing changes any more;
//   - the server's handshake reply is u8 1 + its proof, a wrong proof gets exactly u8 0;
//   - mode b: the replies, the outcome and the data do not depend on how the body was cut, nor
//     on draining between chunks (the same body sent as one chunk is the reference);
//   - mode b: the connection closes exactly when the body holds a malformed request (read by a
//     small parser written from the header's wire format: an unknown op, a key or value over its
//     limit, or an entry larger than the store's whole bound), and otherwise, once drained, buffers
//     exactly the body's incomplete last request: no complete request is left unanswered.
// TRAINCTL_FUZZ_WRITE_SEEDS=<dir>: write seed inputs to <dir>/store and exit.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "comm/store_protocol.hpp"

using namespace trainctl::comm;

namespace {

constexpr size_t kHandshakeBytes = kStoreNonceBytes + kStoreProofBytes;
constexpr size_t kBounds[4] = {size_t{1} << 20, 4096, 512, 100};

[[noreturn]] void broken(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "store_fuzz: invariant broken: %s%s%s\n", what, detail.empty() ? "" : ": ",
               detail.c_str());
  std::abort();
}

StoreNonce fixed_nonce(uint8_t first) {
  StoreNonce nonce;
  for (size_t i = 0; i < nonce.size(); ++i)
    nonce[i] = static_cast<uint8_t>(first + i);
  return nonce;
}

const StoreSecret& secret() {
  static const StoreSecret s =
      StoreSecret::from_hex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f");
  return s;
}
const StoreNonce& server_nonce() {
  static const StoreNonce n = fixed_nonce(0x40);
  return n;
}
const StoreNonce& client_nonce() {
  static const StoreNonce n = fixed_nonce(0x80);
  return n;
}

// What a correct client sends: its nonce and its proof over the server's nonce.
const std::string& client_handshake() {
  static const std::string bytes = [] {
    const StoreProof proof =
        store_proof(secret(), StoreRole::client, server_nonce(), client_nonce());
    std::string b(reinterpret_cast<const char*>(client_nonce().data()), client_nonce().size());
    b.append(reinterpret_cast<const char*>(proof.data()), proof.size());
    return b;
  }();
  return bytes;
}

// What the server must answer to it.
const std::string& server_reply() {
  static const std::string bytes = [] {
    const StoreProof proof =
        store_proof(secret(), StoreRole::server, client_nonce(), server_nonce());
    std::string b(1, static_cast<char>(kStoreOk));
    b.append(reinterpret_cast<const char*>(proof.data()), proof.size());
    return b;
  }();
  return bytes;
}

// One connection on a fresh store, driven as tcp_store.cpp's server loop drives it.
class Session {
 public:
  // `largest_value`: no stored value is longer (the harness knows from its input).
  Session(size_t max_bytes, size_t largest_value)
      : data_(max_bytes), conn_(secret(), server_nonce(), data_), largest_value_(largest_value) {
    conn_.out() = conn_.greeting();
    if (conn_.out().size() != kStoreMagic.size() + kStoreNonceBytes ||
        conn_.out().compare(0, kStoreMagic.size(), kStoreMagic) != 0 ||
        std::memcmp(conn_.out().data() + kStoreMagic.size(), server_nonce().data(),
                    kStoreNonceBytes) != 0)
      broken("greeting is not the magic and the server's nonce");
    conn_.out().clear();  // sent
  }

  // receive(chunk) with the invariants checked around it; false once the connection is closed.
  bool push(std::string_view chunk) {
    if (!open_) {
      const std::string out = conn_.out();
      const size_t bytes = data_.bytes(), keys = data_.keys();
      if (conn_.receive(chunk)) broken("receive() succeeded after it returned false");
      if (conn_.out() != out || data_.bytes() != bytes || data_.keys() != keys)
        broken("a closed connection changed its replies or the data");
      return false;
    }
    const size_t out_before = conn_.out().size();
    const bool was_authenticated = conn_.authenticated();
    open_ = conn_.receive(chunk);
    if (!open_ && conn_.reason().empty()) broken("closed without a reason");
    if (was_authenticated && !conn_.authenticated()) broken("lost its authentication");
    if (!conn_.authenticated()) {
      if (conn_.buffered() > kHandshakeBytes + 1)
        broken("buffers more than a handshake before authentication",
               std::to_string(conn_.buffered()));
      if (data_.keys() != 0 || data_.bytes() != 0) broken("stored data before authentication");
      if (!conn_.out().empty() && !(conn_.refused_secret() && conn_.out() == std::string(1, '\0')))
        broken("replied to an unauthenticated client with more than the refusal byte");
    }
    if (conn_.refused_secret() && (open_ || conn_.authenticated()))
      broken("refused the secret but stays open");
    if (data_.bytes() > data_.max_bytes())
      broken("data holds more than its bound",
             std::to_string(data_.bytes()) + " > " + std::to_string(data_.max_bytes()));
    // One reply: G answers u8 found, u32 length and the value (at most the largest value the
    // input holds, or a counter's 20 digits); A answers u8 and i64; S answers u8; the handshake's
    // reply is u8 and a proof. (Looser and always true: kStoreMaxValueBytes + 5.)
    const size_t one_reply =
        std::max(kStoreProofBytes + 1, 5 + std::min({size_t{kStoreMaxValueBytes}, data_.max_bytes(),
                                                     std::max<size_t>(20, largest_value_)}));
    if (conn_.out().size() > std::max(out_before, kStoreOutHighWater - 1 + one_reply))
      broken("out() grew past the high water plus one reply",
             std::to_string(out_before) + " -> " + std::to_string(conn_.out().size()));
    return open_;
  }

  // Sends out() and calls receive({}) until no reply is left (or the connection closes).
  void drain() {
    while (open_ && !conn_.out().empty()) {
      sent_ += conn_.out();
      conn_.out().clear();
      push({});
    }
  }

  // After the last chunk: sends what is left (the refusal byte of a closed connection too) and,
  // when closed, checks it stays closed.
  void finish() {
    drain();
    if (!open_) {
      push("S");
      push({});
      sent_ += conn_.out();
      conn_.out().clear();
    }
  }

  StoreConnection& conn() { return conn_; }
  const StoreData& data() const { return data_; }
  const std::string& sent() const { return sent_; }
  bool open() const { return open_; }
  void take_sent() {
    sent_ += conn_.out();
    conn_.out().clear();
  }

 private:
  StoreData data_;
  StoreConnection conn_;
  size_t largest_value_;
  std::string sent_;  // every reply byte "sent" to the client, in order
  bool open_ = true;
};

struct Input {
  uint8_t flags = 0;
  size_t handshake_split = 0;
  std::vector<size_t> cuts;  // sorted, unique, inside [0, body.size()]
  std::string_view body;
};

Input parse(const uint8_t* data, size_t size) {
  Input in;
  if (size < 3) return in;
  in.flags = data[0];
  in.handshake_split = data[1] % kHandshakeBytes;  // the last piece is never empty
  const size_t wanted = data[2] % 32;
  const size_t count = std::min(wanted, (size - 3) / 2);
  const size_t body_at = 3 + 2 * count;
  in.body = std::string_view(reinterpret_cast<const char*>(data) + body_at, size - body_at);
  for (size_t i = 0; i < count; ++i) {
    const size_t raw = data[3 + 2 * i] | (size_t{data[4 + 2 * i]} << 8);
    in.cuts.push_back(raw % (in.body.size() + 1));
  }
  std::sort(in.cuts.begin(), in.cuts.end());
  in.cuts.erase(std::unique(in.cuts.begin(), in.cuts.end()), in.cuts.end());
  return in;
}

// What the server must make of a request stream, from the wire format in store_protocol.hpp.
struct Expect {
  bool closes = false;       // a malformed request (unknown op, key or value over its limit)
  size_t tail = 0;           // else: the bytes of the incomplete last request
  size_t largest_value = 0;  // of the complete S requests
};

Expect expect(std::string_view in, size_t bound) {
  const auto u32_at = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, in.data() + at, sizeof v);
    return size_t{v};
  };
  Expect e;
  while (!in.empty()) {
    const char op = in[0];
    if (op != 'S' && op != 'G' && op != 'A') return {true, 0, e.largest_value};
    if (in.size() < 5) return {false, in.size(), e.largest_value};
    const size_t key = u32_at(1);
    if (key > kStoreMaxKeyBytes) return {true, 0, e.largest_value};
    size_t length = 5 + key;
    size_t value = 0;
    if (op == 'S') {
      if (in.size() < length + 4) return {false, in.size(), e.largest_value};
      value = u32_at(length);
      if (value > kStoreMaxValueBytes) return {true, 0, e.largest_value};
      // An entry larger than the whole store is refused from its length.
      if (kStoreEntryOverhead + key + value > bound) return {true, 0, e.largest_value};
      length += 4 + value;
    } else if (op == 'A') {
      length += 8;
    }
    if (in.size() < length) return {false, in.size(), e.largest_value};
    e.largest_value = std::max(e.largest_value, value);
    in.remove_prefix(length);
  }
  return e;
}

std::vector<std::string_view> chunks(std::string_view body, const std::vector<size_t>& cuts) {
  std::vector<std::string_view> out;
  size_t at = 0;
  for (const size_t cut : cuts) {
    out.push_back(body.substr(at, cut - at));
    at = cut;
  }
  out.push_back(body.substr(at));
  return out;
}

// Feeds the chunks, draining after each one unless `hold` (then only at the end).
void feed(Session& s, const std::vector<std::string_view>& parts, bool hold) {
  for (const std::string_view part : parts) {
    s.push(part);
    if (!hold) s.drain();
  }
  s.finish();
}

void mode_a(const Input& in, size_t bound) {
  Session s(bound, in.body.size());
  feed(s, chunks(in.body, in.cuts), in.flags & 8);
}

void mode_b(const Input& in, size_t bound) {
  const bool pipeline = in.flags & 16;
  const bool corrupt = in.flags & 32;
  std::string handshake = client_handshake();
  if (corrupt) handshake[kStoreNonceBytes + in.handshake_split % kStoreProofBytes] ^= 0x01;
  const std::vector<std::string_view> parts = chunks(in.body, in.cuts);
  // Requests after the handshake: the body, less its first chunk when that was pipelined (and
  // refused; nothing of it is stored).
  const std::string_view requests = in.body.substr(pipeline ? parts[0].size() : 0);
  const Expect e = expect(requests, bound);

  Session s(bound, e.largest_value);
  const std::string_view first(handshake.data(), in.handshake_split);
  std::string last = handshake.substr(in.handshake_split);
  if (!s.push(first)) broken("closed during the first part of a handshake");
  if (s.conn().authenticated() || !s.conn().out().empty())
    broken("answered an incomplete handshake");
  if (s.conn().buffered() != first.size()) broken("does not buffer a partial handshake");
  size_t next = 0;
  if (pipeline) last += parts[next++];
  const bool open = s.push(last);
  if (corrupt) {
    if (open || !s.conn().refused_secret() || s.conn().out() != std::string(1, '\0'))
      broken("a wrong proof is not refused with u8 0");
    for (; next < parts.size(); ++next)
      s.push(parts[next]);
    s.finish();
    return;
  }
  if (!s.conn().authenticated()) broken("refused the correct proof", s.conn().reason());
  if (pipeline && last.size() > handshake.size() - in.handshake_split) {
    if (open) broken("accepted a request sent before the handshake's reply");
    if (s.data().keys() != 0) broken("stored a request sent before the handshake's reply");
    if (!s.conn().out().empty()) broken("sent the handshake's reply to a connection it closes");
  } else if (s.conn().out().compare(0, server_reply().size(), server_reply()) != 0) {
    broken("the handshake's reply is not u8 1 and the server's proof");
  }
  if (!open) {
    s.finish();
    return;
  }
  if (s.conn().out() != server_reply()) broken("replied more than the handshake");
  s.take_sent();

  std::vector<std::string_view> rest(parts.begin() + static_cast<ptrdiff_t>(next), parts.end());
  feed(s, rest, in.flags & 8);

  // The reference: the same body in one chunk (what follows the pipelined part, if any).
  Session ref(bound, e.largest_value);
  ref.push(handshake);
  ref.take_sent();
  feed(ref, {requests}, false);
  if (s.open() == e.closes)
    broken(e.closes ? "a malformed request did not close the connection"
                    : "closed on a well-formed request stream",
           s.conn().reason());
  if (s.open() && s.conn().buffered() != e.tail)
    broken("after draining, what stays buffered is not the incomplete last request",
           std::to_string(s.conn().buffered()) + " bytes, expected " + std::to_string(e.tail));
  if (ref.sent() != s.sent() || ref.open() != s.open() ||
      ref.conn().reason() != s.conn().reason() || ref.data().bytes() != s.data().bytes() ||
      ref.data().keys() != s.data().keys() ||
      (s.open() && (ref.conn().buffered() != s.conn().buffered() ||
                    ref.conn().mid_message() != s.conn().mid_message())))
    broken("the outcome depends on how the requests were cut into chunks",
           "replies " + std::to_string(s.sent().size()) + " vs " +
               std::to_string(ref.sent().size()) + " bytes; reason '" + s.conn().reason() +
               "' vs '" + ref.conn().reason() + "'");
}

// ---- seeds --------------------------------------------------------------------------------------

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

std::string set_request(std::string_view key, std::string_view value) {
  std::string r = "S";
  put(r, static_cast<uint32_t>(key.size()));
  r += key;
  put(r, static_cast<uint32_t>(value.size()));
  r += value;
  return r;
}

std::string get_request(std::string_view key) {
  std::string r = "G";
  put(r, static_cast<uint32_t>(key.size()));
  r += key;
  return r;
}

std::string add_request(std::string_view key, int64_t delta) {
  std::string r = "A";
  put(r, static_cast<uint32_t>(key.size()));
  r += key;
  put(r, delta);
  return r;
}

std::string seed(uint8_t flags, uint8_t split, const std::vector<uint16_t>& cuts,
                 const std::string& body) {
  std::string input;
  input += static_cast<char>(flags);
  input += static_cast<char>(split);
  input += static_cast<char>(cuts.size());
  for (const uint16_t cut : cuts)
    put(input, cut);
  return input + body;
}

void write_seeds(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir / "store");
  const auto write = [&](const char* name, const std::string& bytes) {
    std::ofstream out(dir / "store" / name, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  const std::string session = set_request("rank/0", "10.0.0.1:29500") + get_request("rank/0") +
                              add_request("barrier", 1) + add_request("barrier", -3) +
                              get_request("missing") + get_request("barrier");
  write("session", seed(0x01, 20, {3, 9, 30, 31}, session));
  write("session_held", seed(0x09, 0, {1}, session));
  write("session_small_bound",
        seed(0x07, 0, {}, session + set_request("big", std::string(90, 'x'))));
  write("pipelined", seed(0x11, 40, {7}, session));
  write("wrong_proof", seed(0x21, 5, {}, session));
  write("truncated", seed(0x01, 0, {}, set_request("rank/1", "10.0.0.2:29500").substr(0, 17)));
  std::string oversized = "S";
  put(oversized, uint32_t{kStoreMaxKeyBytes + 1});
  write("oversized_key", seed(0x01, 0, {2}, oversized + "key"));
  std::string big_value = set_request("v", "");
  const uint32_t too_big = kStoreMaxValueBytes + 1;
  std::memcpy(big_value.data() + 6, &too_big, sizeof too_big);
  write("oversized_value", seed(0x01, 0, {}, big_value));
  write("unknown_op", seed(0x01, 0, {}, get_request("a") + "X"));
  // 40 replies of 2005 bytes each: past the high water after 33, so receive({}) answers the rest.
  std::string flood = set_request("k", std::string(2000, 'v'));
  for (int i = 0; i < 40; ++i)
    flood += get_request("k");
  write("high_water", seed(0x01, 0, {100, 2010}, flood));
  // Mode a: raw bytes, a valid handshake (the nonces are fixed) cut in two, then requests in the
  // same chunk (refused), or alone.
  write("raw_handshake", seed(0x00, 0, {30, 64}, client_handshake() + session));
  write("raw_pipelined", seed(0x00, 0, {}, client_handshake() + session));
  write("raw_garbage", seed(0x00, 0, {10}, std::string(70, 'G')));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* seeds = std::getenv("TRAINCTL_FUZZ_WRITE_SEEDS")) {
    write_seeds(seeds);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Input in = parse(data, size);
  const size_t bound = kBounds[(in.flags >> 1) & 3];
  if (in.flags & 1)
    mode_b(in, bound);
  else
    mode_a(in, bound);
  return 0;
}
