// The TCP store against a client on the same network without the job's secret, or with it and bad
// manners: the handshake refuses wrong and replayed proofs and impostor servers, nothing a client
// without the secret sends is buffered or stored, and no client, silent or flooding, delays the
// job's own ranks. Byte-level cases drive StoreConnection directly; the others run a real server
// and real client processes on loopback.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include <catch2/catch.hpp>

#include "comm/error.hpp"
#include "comm/store.hpp"
#include "comm/store_protocol.hpp"
#include "comm_test_util.hpp"

using namespace trainctl::comm;
using comm_test::expect;
using Clock = std::chrono::steady_clock;

namespace {

std::string bytes_of(const auto& array) {
  return std::string(reinterpret_cast<const char*>(array.data()), array.size());
}

StoreNonce nonce_of(uint8_t fill) {
  StoreNonce nonce;
  nonce.fill(fill);
  return nonce;
}

// What a client sends for its handshake: its nonce and its proof over the server's nonce.
std::string client_hello(const StoreSecret& secret, const StoreNonce& server_nonce,
                         const StoreNonce& client_nonce) {
  return bytes_of(client_nonce) +
         bytes_of(store_proof(secret, StoreRole::client, server_nonce, client_nonce));
}

template <class T>
std::string raw(const T& value) {
  return std::string(reinterpret_cast<const char*>(&value), sizeof value);
}

std::string get_request(const std::string& key) {
  std::string out(1, 'G');
  out += raw(static_cast<uint32_t>(key.size()));
  out += key;
  return out;
}

std::string set_request(const std::string& key, const std::string& value) {
  std::string out = get_request(key);
  out[0] = 'S';
  out += raw(static_cast<uint32_t>(value.size()));
  out += value;
  return out;
}

// ---- raw sockets: what an attacker's own program would do
// ----------------------------------------

int connect_raw(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
    throw std::runtime_error(std::string("connect: ") + std::strerror(errno));
  return fd;
}

void send_all(int fd, const std::string& bytes) {
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) throw std::runtime_error(std::string("send: ") + std::strerror(errno));
    at += static_cast<size_t>(n);
  }
}

// Up to `bytes` bytes, fewer when the peer closes; throws when nothing comes within `timeout`.
std::string read_some(int fd, size_t bytes, Milliseconds timeout) {
  std::string out;
  const auto deadline = Clock::now() + timeout;
  while (out.size() < bytes) {
    pollfd p{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0)
      throw std::runtime_error("read: nothing within the timeout");
    char buffer[4096];
    const ssize_t n = ::recv(fd, buffer, std::min(sizeof buffer, bytes - out.size()), 0);
    if (n <= 0) break;  // closed (or reset) by the server
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

// Whether the server has closed `fd`: reading what it sent (its greeting, say) reaches the end
// of the stream (or a reset) within `timeout`.
bool closed_by_server(int fd, Milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now()).count();
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 0))) <= 0) return false;
    char buffer[4096];
    if (::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT) <= 0) return true;
  }
}

// A connection that has passed the handshake with `secret`, as TcpStore does it.
int authenticated_raw(int port, const StoreSecret& secret) {
  const int fd = connect_raw(port);
  const std::string greeting =
      read_some(fd, kStoreMagic.size() + kStoreNonceBytes, Milliseconds(5000));
  StoreNonce server_nonce;
  std::memcpy(server_nonce.data(), greeting.data() + kStoreMagic.size(), server_nonce.size());
  send_all(fd, client_hello(secret, server_nonce, random_nonce()));
  const std::string answer = read_some(fd, 1 + kStoreProofBytes, Milliseconds(5000));
  if (answer.size() != 1 + kStoreProofBytes || answer[0] != static_cast<char>(kStoreOk))
    throw std::runtime_error("handshake refused");
  return fd;
}

// The server's log lines, collected.
struct Log {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> guard(mutex);
      lines.push_back(line);
    };
  }
  std::string text() {
    std::lock_guard<std::mutex> guard(mutex);
    std::string all;
    for (const auto& line : lines)
      all += line + "\n";
    return all;
  }
};

// Four ranks of a job meet through the store: each publishes a key, waits for all four, counts
// itself in; every rank checks the others' values. Returns the ranks' exit statuses.
// Four ranks meet through the store, each on a thread of this process: each rank's status, 0 or 1
// (the reason printed). Threads, not forked children: a child forked while the server's thread is
// inside OpenSSL inherits the lock it held and hangs in its first HMAC (trainctl itself forks only
// to exec, and its ranks are separate programs).
std::vector<int> four_ranks_meet(int port, const StoreSecret& secret, const std::string& tag) {
  std::vector<int> status(4, -1);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 4; ++rank)
    ranks.emplace_back([&, rank] {
      try {
        TcpStore store("127.0.0.1", port, secret, Milliseconds(20000));
        store.set(tag + "/addr/" + std::to_string(rank), "address of rank " + std::to_string(rank));
        std::vector<std::string> keys;
        for (int r = 0; r < 4; ++r)
          keys.push_back(tag + "/addr/" + std::to_string(r));
        store.wait(keys, Milliseconds(20000));
        for (int r = 0; r < 4; ++r)
          expect(*store.try_get(keys[static_cast<size_t>(r)]) ==
                     "address of rank " + std::to_string(r),
                 "rank " + std::to_string(r) + "'s value");
        store.add(tag + "/arrived", 1);
        while (store.add(tag + "/arrived", 0) < 4)
          std::this_thread::sleep_for(Milliseconds(1));
        status[static_cast<size_t>(rank)] = 0;
      } catch (const std::exception& error) {
        std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
        status[static_cast<size_t>(rank)] = 1;
      }
    });
  for (std::thread& rank : ranks)
    rank.join();
  return status;
}

}  // namespace

// ---- bytes --------------------------------------------------------------------------------------

TEST_CASE("store secret: 64 hexadecimal digits, fresh each time, never repeated in an error",
          "[comm][store][security]") {
  const StoreSecret a = StoreSecret::generate();
  const StoreSecret b = StoreSecret::generate();
  CHECK(a.hex() != b.hex());
  CHECK(a.hex().size() == 64);
  CHECK(StoreSecret::from_hex(a.hex()).bytes() == a.bytes());
  std::string upper = a.hex();
  for (char& c : upper)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  CHECK(StoreSecret::from_hex(upper).bytes() == a.bytes());
  const std::string short_one = a.hex().substr(0, 40);
  try {
    StoreSecret::from_hex(short_one);
    FAIL("a 40-digit secret was taken");
  } catch (const CommError& error) {
    CHECK_THAT(error.what(), Catch::Contains("40 characters, not 64"));
    CHECK_THAT(error.what(), !Catch::Contains(short_one));
  }
  std::string bad = a.hex();
  bad[10] = 'g';
  try {
    StoreSecret::from_hex(bad);
    FAIL("a secret with a 'g' was taken");
  } catch (const CommError& error) {
    CHECK_THAT(error.what(), Catch::Contains("position 11"));
    CHECK_THAT(error.what(), !Catch::Contains(bad.substr(0, 10)));
  }
}

TEST_CASE("store handshake: the right proof gets the server's own; a wrong one one zero byte",
          "[comm][store][security]") {
  const StoreSecret secret = StoreSecret::generate();
  StoreData data(1 << 20);
  const StoreNonce server_nonce = nonce_of(7), client_nonce = nonce_of(9);
  StoreConnection good(secret, server_nonce, data);
  CHECK(good.greeting() == std::string(kStoreMagic) + bytes_of(server_nonce));
  const std::string hello = client_hello(secret, server_nonce, client_nonce);
  // Byte by byte: a handshake split anywhere is still one handshake.
  for (size_t i = 0; i + 1 < hello.size(); ++i)
    REQUIRE(good.receive(hello.substr(i, 1)));
  REQUIRE(good.receive(hello.substr(hello.size() - 1)));
  REQUIRE(good.authenticated());
  CHECK(good.out() ==
        std::string(1, static_cast<char>(kStoreOk)) +
            bytes_of(store_proof(secret, StoreRole::server, client_nonce, server_nonce)));
  // The two proofs differ: a server's proof cannot be played back as a client's.
  CHECK_FALSE(same_proof(store_proof(secret, StoreRole::client, server_nonce, client_nonce),
                         store_proof(secret, StoreRole::server, server_nonce, client_nonce)));

  StoreConnection wrong(secret, server_nonce, data);
  CHECK_FALSE(wrong.receive(client_hello(StoreSecret::generate(), server_nonce, client_nonce)));
  CHECK(wrong.refused_secret());
  CHECK(wrong.reason() == "wrong secret");
  CHECK(wrong.out() == std::string(1, '\0'));
  CHECK_FALSE(wrong.receive(set_request("k", "v")));  // closed for good
  CHECK(data.keys() == 0);
}

TEST_CASE("store handshake: a handshake recorded on one connection is refused on the next",
          "[comm][store][security]") {
  const StoreSecret secret = StoreSecret::generate();
  StoreData data(1 << 20);
  StoreConnection first(secret, random_nonce(), data);
  StoreNonce first_nonce;
  std::memcpy(first_nonce.data(), first.greeting().data() + kStoreMagic.size(), first_nonce.size());
  const std::string recorded = client_hello(secret, first_nonce, random_nonce());
  REQUIRE(first.receive(recorded));
  REQUIRE(first.authenticated());
  StoreConnection second(secret, random_nonce(), data);  // a fresh nonce, as the server makes
  CHECK_FALSE(second.receive(recorded));
  CHECK(second.refused_secret());
}

TEST_CASE("store: before its handshake a client can make the server hold no more than one",
          "[comm][store][security]") {
  const StoreSecret secret = StoreSecret::generate();
  StoreData data(1 << 20);
  StoreConnection flood(secret, random_nonce(), data);
  const std::string chunk(40, 'x');  // under a handshake's 64 bytes: buffered, then refused
  CHECK(flood.receive(chunk));
  CHECK(flood.buffered() == 40);
  CHECK_FALSE(flood.receive(std::string(10 << 20, 'x')));  // 10 MiB more: 24 bytes are read
  CHECK(flood.buffered() <= kStoreNonceBytes + kStoreProofBytes + 1);
  CHECK(flood.reason() == "wrong secret");

  // A client with the secret that sends a request before the server's reply breaks the protocol.
  const StoreNonce server_nonce = random_nonce();
  StoreConnection eager(secret, server_nonce, data);
  CHECK_FALSE(
      eager.receive(client_hello(secret, server_nonce, random_nonce()) + set_request("k", "v")));
  CHECK_THAT(eager.reason(), Catch::Contains("before the handshake's reply"));
  CHECK(eager.out().empty());  // no success sent to a connection that is closing
  CHECK(data.keys() == 0);
}

TEST_CASE("store: a length past the limits closes the connection before anything is allocated",
          "[comm][store][security]") {
  const StoreSecret secret = StoreSecret::generate();
  StoreData data(1 << 20);
  auto connected = [&](StoreConnection& c, const StoreNonce& nonce) {
    REQUIRE(c.receive(client_hello(secret, nonce, random_nonce())));
    c.out().clear();
  };
  const StoreNonce nonce = random_nonce();
  StoreConnection key(secret, nonce, data);
  connected(key, nonce);
  std::string huge_key(1, 'G');
  huge_key += raw(uint32_t{0xFFFFFFFF});
  CHECK_FALSE(key.receive(huge_key));
  CHECK_THAT(key.reason(), Catch::Contains("4294967295 bytes") && Catch::Contains("65536"));
  CHECK(key.buffered() < 64);

  StoreConnection value(secret, nonce, data);
  connected(value, nonce);
  std::string huge_value = set_request("k", "");
  huge_value.resize(huge_value.size() - sizeof(uint32_t));
  huge_value += raw(kStoreMaxValueBytes + 1);
  CHECK_FALSE(value.receive(huge_value));
  CHECK_THAT(value.reason(), Catch::Contains("a value of 67108865 bytes"));

  StoreConnection op(secret, nonce, data);
  connected(op, nonce);
  CHECK_FALSE(op.receive("X"));
  CHECK_THAT(op.reason(), Catch::Contains("unknown request 88"));
}

TEST_CASE("store: a write past the byte bound is refused and changes nothing",
          "[comm][store][security]") {
  StoreData data(4096);
  const std::string kilobyte(1000, 'v');
  int stored = 0;
  while (data.set("key/" + std::to_string(stored), kilobyte))
    ++stored;
  CHECK(stored == 3);  // 3 x (1000 + 5 + 64) fits 4096; a fourth does not
  CHECK(data.bytes() <= data.max_bytes());
  const size_t before = data.bytes();
  StoreData small(100);
  CHECK(small.add("c", 1) == 1);                    // 64 + 1 + 1 bytes
  CHECK_FALSE(small.add(std::string(40, 'k'), 1));  // 64 + 40 + 1 more would pass 100
  CHECK(small.keys() == 1);
  CHECK(data.set("key/0", "short"));  // overwriting with less is always possible
  CHECK(data.bytes() < before);
  CHECK(*data.find("key/1") == kilobyte);

  // Through the protocol: the reply says kStoreFull.
  const StoreSecret secret = StoreSecret::generate();
  const StoreNonce nonce = random_nonce();
  StoreConnection c(secret, nonce, data);
  REQUIRE(c.receive(client_hello(secret, nonce, random_nonce())));
  c.out().clear();
  REQUIRE(c.receive(set_request("big", std::string(2000, 'b'))));  // fits an empty store only
  CHECK(c.out() == std::string(1, static_cast<char>(kStoreFull)));
  CHECK(data.find("big") == nullptr);
  // A value that could never fit the bound is refused from its length, before it is buffered.
  c.out().clear();
  CHECK_FALSE(c.receive(set_request("huge", "").substr(0, 9) + raw(uint32_t{5000}) + "bbbb"));
  CHECK_THAT(c.reason(), Catch::Contains("5000 bytes can never fit the store's bound of 4096"));
  CHECK(c.buffered() < 64);

  // Counters: exactly a decimal int64, anything else starts again from 0.
  StoreData counters(1 << 20);
  REQUIRE(counters.set("spaced", " 5"));
  REQUIRE(counters.set("plus", "+5"));
  REQUIRE(counters.set("plain", "-5"));
  CHECK(counters.add("spaced", 1) == 1);
  CHECK(counters.add("plus", 1) == 1);
  CHECK(counters.add("plain", 1) == -4);
}

TEST_CASE("store: replies wait past the high water, so many gets cannot pile up memory",
          "[comm][store][security]") {
  const StoreSecret secret = StoreSecret::generate();
  StoreData data(8 << 20);
  REQUIRE(data.set("big", std::string(1 << 20, 'b')));
  const StoreNonce nonce = random_nonce();
  StoreConnection c(secret, nonce, data);
  REQUIRE(c.receive(client_hello(secret, nonce, random_nonce())));
  c.out().clear();
  std::string gets;
  for (int i = 0; i < 50; ++i)
    gets += get_request("big");
  REQUIRE(c.receive(gets));
  size_t replies = 0;
  while (!c.out().empty()) {
    CHECK(c.out().size() <= kStoreOutHighWater + (1 << 20) + 5);
    replies += c.out().size() / ((1 << 20) + 5);
    c.out().clear();  // sent
    REQUIRE(c.receive({}));
  }
  CHECK(replies == 50);
}

// ---- sockets and processes ----------------------------------------------------------------------

TEST_CASE("tcp store: clients without the job's secret are refused while four ranks meet",
          "[comm][store][security]") {
  const StoreSecret secret = StoreSecret::generate();
  Log log;
  TcpStoreServer server("127.0.0.1", 0, secret, {.log = log.sink()});
  // An attacker that keeps trying with its own secret while the job meets (a thread, for the
  // reason four_ranks_meet gives).
  int attacker_refused = 0;
  bool attacker_let_in = false;
  std::thread attacker([&] {
    const StoreSecret guess = StoreSecret::generate();
    for (int i = 0; i < 20; ++i) {
      try {
        TcpStore intruder("127.0.0.1", server.port(), guess, Milliseconds(5000));
        attacker_let_in = true;
        return;
      } catch (const CommError& error) {
        attacker_refused +=
            std::string(error.what()).find("refused this rank's secret") != std::string::npos;
      }
    }
  });
  CHECK(four_ranks_meet(server.port(), secret, "job") == std::vector<int>{0, 0, 0, 0});
  attacker.join();
  CHECK_FALSE(attacker_let_in);
  CHECK(attacker_refused == 20);
  CHECK(server.refused() == 20);
  const std::string text = log.text();
  CHECK_THAT(text, Catch::Contains("(wrong secret); 1 refused so far") &&
                       Catch::Contains("the job goes on"));
  CHECK_THAT(text, !Catch::Contains(secret.hex()));
}

TEST_CASE("tcp store: a rank finds out at once when the server is not its job's",
          "[comm][store][security]") {
  // Another job's store on the same port: it refuses this rank's secret.
  TcpStoreServer other("127.0.0.1", 0, StoreSecret::generate());
  const auto start = Clock::now();
  try {
    TcpStore store("127.0.0.1", other.port(), StoreSecret::generate(), Milliseconds(10000));
    FAIL("connected to another job's store");
  } catch (const CommError& error) {
    CHECK(error.kind() == CommError::Kind::usage);
    CHECK_THAT(error.what(), Catch::Contains("refused this rank's secret") &&
                                 Catch::Contains("TRAINCTL_STORE_SECRET"));
  }
  CHECK(Clock::now() - start < Milliseconds(5000));  // not after the 10 s connect timeout

  // An impostor that greets like a store and says yes to any proof: the rank checks its proof.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  socklen_t length = sizeof address;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
  std::thread impostor([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    send_all(fd, std::string(kStoreMagic) + bytes_of(random_nonce()));
    read_some(fd, kStoreNonceBytes + kStoreProofBytes, Milliseconds(5000));
    send_all(fd, std::string(1, static_cast<char>(kStoreOk)) + std::string(kStoreProofBytes, 'p'));
    closed_by_server(fd, Milliseconds(5000));
    ::close(fd);
  });
  try {
    TcpStore store("127.0.0.1", ntohs(address.sin_port), StoreSecret::generate(),
                   Milliseconds(5000));
    FAIL("trusted an impostor");
  } catch (const CommError& error) {
    CHECK_THAT(error.what(), Catch::Contains("did not prove that it holds this job's secret"));
  }
  impostor.join();
  ::close(listener);
}

TEST_CASE("tcp store: a handshake captured on the wire cannot be replayed",
          "[comm][store][security]") {
  const StoreSecret secret = StoreSecret::generate();
  TcpStoreServer server("127.0.0.1", 0, secret);
  // The first connection's bytes, as a sniffer would see them.
  const int first = connect_raw(server.port());
  const std::string greeting =
      read_some(first, kStoreMagic.size() + kStoreNonceBytes, Milliseconds(5000));
  StoreNonce nonce;
  std::memcpy(nonce.data(), greeting.data() + kStoreMagic.size(), nonce.size());
  const std::string captured = client_hello(secret, nonce, random_nonce());
  send_all(first, captured);
  CHECK(read_some(first, 1 + kStoreProofBytes, Milliseconds(5000))[0] ==
        static_cast<char>(kStoreOk));
  // Replayed on a new connection: the server's nonce differs, the proof no longer fits.
  const int second = connect_raw(server.port());
  const std::string fresh =
      read_some(second, kStoreMagic.size() + kStoreNonceBytes, Milliseconds(5000));
  CHECK(fresh.substr(kStoreMagic.size()) != greeting.substr(kStoreMagic.size()));
  send_all(second, captured);
  CHECK(read_some(second, 1 + kStoreProofBytes, Milliseconds(5000)) == std::string(1, '\0'));
  CHECK(closed_by_server(second, Milliseconds(5000)));
  CHECK(server.refused() == 1);
  ::close(first);
  ::close(second);
}

TEST_CASE("tcp store: a client that goes silent mid-handshake or mid-request stalls no one",
          "[comm][store][security]") {
  const StoreSecret secret = StoreSecret::generate();
  Log log;
  // Deadlines far beyond the test: the ranks must get through while both stallers still hold
  // their connections, not because the server dropped them.
  TcpStoreServer server("127.0.0.1", 0, secret,
                        {.handshake_timeout = Milliseconds(600000),
                         .request_timeout = Milliseconds(600000),
                         .log = log.sink()});
  const int half_handshake = connect_raw(server.port());
  read_some(half_handshake, kStoreMagic.size() + kStoreNonceBytes, Milliseconds(5000));
  send_all(half_handshake, std::string(20, 'h'));
  const int half_request = authenticated_raw(server.port(), secret);
  send_all(half_request, set_request("stalled", std::string(1000, 'v')).substr(0, 600));

  CHECK(four_ranks_meet(server.port(), secret, "job") == std::vector<int>{0, 0, 0, 0});
  CHECK_FALSE(closed_by_server(half_handshake, Milliseconds(0)));
  CHECK_FALSE(closed_by_server(half_request, Milliseconds(0)));
  ::close(half_handshake);
  ::close(half_request);

  // With short deadlines the server closes such connections itself, and logs it.
  Log short_log;
  TcpStoreServer strict("127.0.0.1", 0, secret,
                        {.handshake_timeout = Milliseconds(300),
                         .request_timeout = Milliseconds(300),
                         .log = short_log.sink()});
  const int silent = connect_raw(strict.port());
  const int stalled = authenticated_raw(strict.port(), secret);
  send_all(stalled, set_request("stalled", "value").substr(0, 7));
  CHECK(closed_by_server(silent, Milliseconds(20000)));
  CHECK(closed_by_server(stalled, Milliseconds(20000)));
  ::close(silent);
  ::close(stalled);
  TcpStore store("127.0.0.1", strict.port(), secret, Milliseconds(5000));
  CHECK_FALSE(store.try_get("stalled"));  // the half request stored nothing
  CHECK(strict.refused() == 2);
  CHECK_THAT(short_log.text(), Catch::Contains("no correct handshake within 300 ms"));
}

TEST_CASE("tcp store: a flood of silent connections cannot lock a rank out",
          "[comm][store][security]") {
  const StoreSecret secret = StoreSecret::generate();
  TcpStoreServerOptions options;
  options.max_pending = 8;
  TcpStoreServer server("127.0.0.1", 0, secret, options);
  std::vector<int> silent;
  for (int i = 0; i < 32; ++i)
    silent.push_back(connect_raw(server.port()));
  // The server made room for each newer one by closing the oldest: 24 are gone already or go
  // when the rank connects.
  TcpStore store("127.0.0.1", server.port(), secret, Milliseconds(10000));
  store.set("k", "v");
  CHECK(store.get("k", Milliseconds(1000)) == "v");
  int closed = 0;
  for (const int fd : silent) {
    closed += closed_by_server(fd, Milliseconds(100)) ? 1 : 0;
    ::close(fd);
  }
  CHECK(closed >= 24);
  CHECK(server.refused() >= 24);
}

TEST_CASE(
    "tcp store: a client that floods without the secret, or fills the store with it, is "
    "refused and the job's keys stay",
    "[comm][store][security]") {
  const StoreSecret secret = StoreSecret::generate();
  TcpStoreServerOptions options;
  options.max_bytes = 1 << 20;
  TcpStoreServer server("127.0.0.1", 0, secret, options);
  TcpStore job("127.0.0.1", server.port(), secret, Milliseconds(5000));
  job.set("rank/0", "10.0.0.1:1234");

  // Without the secret: 64 MiB of set requests; the server reads one handshake's worth and
  // closes, so the sender's writes fail long before the end.
  const pid_t flooder = ::fork();
  if (flooder == 0) {
    const int fd = connect_raw(server.port());
    const std::string request = set_request("flood", std::string(1 << 20, 'f'));
    size_t sent = 0;
    while (sent < (size_t{64} << 20)) {
      const ssize_t n = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
      if (n <= 0) ::_exit(0);  // refused: the server closed the connection
      sent += static_cast<size_t>(n);
    }
    ::_exit(1);  // the server took it all
  }
  int status = 0;
  REQUIRE(::waitpid(flooder, &status, 0) == flooder);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK_FALSE(job.try_get("flood"));

  // With the secret, past the bound (1 MiB): refused with a clear error, nothing lost.
  const std::string chunk(100 << 10, 'c');
  int stored = 0;
  try {
    for (; stored < 100; ++stored)
      job.set("fill/" + std::to_string(stored), chunk);
    FAIL("100 x 100 KiB went into a 1 MiB store");
  } catch (const CommError& error) {
    CHECK_THAT(error.what(), Catch::Contains("is full") && Catch::Contains("fill/"));
  }
  CHECK(stored >= 9);
  CHECK(job.get("rank/0", Milliseconds(1000)) == "10.0.0.1:1234");
  CHECK(job.get("fill/0", Milliseconds(1000)) == chunk);
}
