// What the TCP store's authentication and non-blocking server cost, against the floor of the same
// socket work without them, in the same run on loopback:
//   - connect: a TcpStore's connect and mutual HMAC handshake, against a plain TCP connect that
//     reads the server's greeting (the same round trips' socket work, without the proofs);
//   - request: one try_get round trip of a 100-byte value, against a 1-byte ping-pong with a
//     blocking echo thread (the kernel's loopback round trip);
//   - rendezvous: N client threads each connect, set their key and wait for all N keys (what a
//     job's ranks do first), wall time.
//
//   store_bench [REQUESTS=20000] [CONNECTS=500] [CLIENTS=64]
//
// Each row is the best of 3. Prints a table; BENCHMARKS.md holds the figures.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "bench_util.hpp"
#include "comm/store.hpp"

namespace {

using namespace trainctl::comm;
using trainctl::bench::best_seconds;

int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) std::abort();
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

void read_n(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t got = ::recv(fd, data, n, 0);
    if (got <= 0) std::abort();
    data += got;
    n -= static_cast<size_t>(got);
  }
}

// A blocking echo server on loopback: the floor of one request's round trip.
struct Echo {
  int listener = -1, port = 0;
  std::thread thread;
  Echo() {
    listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address);
    ::listen(listener, 4);
    socklen_t length = sizeof address;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
    port = ntohs(address.sin_port);
    thread = std::thread([this] {
      const int fd = ::accept(listener, nullptr, nullptr);
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      char byte;
      while (::recv(fd, &byte, 1, 0) == 1)
        ::send(fd, &byte, 1, MSG_NOSIGNAL);
      ::close(fd);
    });
  }
  ~Echo() {
    thread.join();
    ::close(listener);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int requests = argc > 1 ? std::atoi(argv[1]) : 20000;
  const int connects = argc > 2 ? std::atoi(argv[2]) : 500;
  const int clients = argc > 3 ? std::atoi(argv[3]) : 64;
  const StoreSecret secret = StoreSecret::generate();
  TcpStoreServer server("127.0.0.1", 0, secret);

  // connect
  const double handshake_s = best_seconds([&] {
    for (int i = 0; i < connects; ++i)
      TcpStore store("127.0.0.1", server.port(), secret, std::chrono::milliseconds(5000));
  });
  const double plain_connect_s = best_seconds([&] {
    for (int i = 0; i < connects; ++i) {
      const int fd = connect_loopback(server.port());
      char greeting[kStoreMagic.size() + kStoreNonceBytes];
      read_n(fd, greeting, sizeof greeting);
      ::close(fd);
    }
  });

  // request
  TcpStore store("127.0.0.1", server.port(), secret, std::chrono::milliseconds(5000));
  store.set("value", std::string(100, 'v'));
  const double request_s = best_seconds([&] {
    for (int i = 0; i < requests; ++i)
      if (!store.try_get("value")) std::abort();
  });
  double echo_s = 0;
  {
    Echo echo;
    const int fd = connect_loopback(echo.port);
    echo_s = best_seconds([&] {
      for (int i = 0; i < requests; ++i) {
        char byte = 'x';
        ::send(fd, &byte, 1, MSG_NOSIGNAL);
        read_n(fd, &byte, 1);
      }
    });
    ::close(fd);
  }

  // rendezvous
  int round = 0;
  const double rendezvous_s = best_seconds([&] {
    const std::string prefix = "round" + std::to_string(round++) + "/";
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        TcpStore rank("127.0.0.1", server.port(), secret, std::chrono::milliseconds(30000));
        rank.set(prefix + std::to_string(c), "10.0.0.1:" + std::to_string(20000 + c));
        std::vector<std::string> keys;
        for (int k = 0; k < clients; ++k)
          keys.push_back(prefix + std::to_string(k));
        rank.wait(keys, std::chrono::milliseconds(30000));
      });
    }
    for (auto& t : threads)
      t.join();
  });

  fmt::print("TCP store on loopback, best of 3 ({} hardware threads)\n",
             std::thread::hardware_concurrency());
  fmt::print("{:<52} {:>12} {:>12} {:>7}\n", "row", "store", "floor", "ratio");
  fmt::print("{:<52} {:>9.1f} us {:>9.1f} us {:>7.2f}\n",
             "connect + mutual HMAC handshake vs connect + greeting", 1e6 * handshake_s / connects,
             1e6 * plain_connect_s / connects, handshake_s / plain_connect_s);
  fmt::print("{:<52} {:>9.1f} us {:>9.1f} us {:>7.2f}\n",
             "try_get (100 B value) vs 1-byte echo round trip", 1e6 * request_s / requests,
             1e6 * echo_s / requests, request_s / echo_s);
  fmt::print("{:<52} {:>9.1f} ms\n",
             fmt::format("rendezvous: {} clients connect, set, wait for all", clients),
             1e3 * rendezvous_s);
  return 0;
}
