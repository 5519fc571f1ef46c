// TcpStoreServer and TcpStore: a tiny request/response protocol over TCP.
//
// Request:  u8 op ('S' set, 'G' get, 'A' add), u32 key length, key bytes, then
//           for 'S': u32 value length, value bytes; for 'A': i64 delta.
// Response: 'S': u8 1; 'G': u8 found, and if found u32 length + bytes; 'A': i64 new value.
// Integers travel in host byte order: every rank of a job runs on the same architecture.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "dist/error.hpp"
#include "dist/store.hpp"

namespace trainctl::dist {
namespace {

// Request fields are bounded so a stray client cannot make the server allocate gigabytes.
constexpr uint32_t kMaxKeyBytes = 64 * 1024;
constexpr uint32_t kMaxValueBytes = 64 * 1024 * 1024;

bool read_exact(int fd, void* data, size_t bytes) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n == 0) return false;
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool write_exact(int fd, const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool read_string(int fd, std::string& out, uint32_t limit) {
  uint32_t size = 0;
  if (!read_exact(fd, &size, sizeof size) || size > limit) return false;
  out.resize(size);
  return read_exact(fd, out.data(), size);
}

bool write_string(int fd, std::string_view text) {
  const auto size = static_cast<uint32_t>(text.size());
  return write_exact(fd, &size, sizeof size) && write_exact(fd, text.data(), text.size());
}

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const char* node = (host.empty() || host == "0.0.0.0") ? nullptr : host.c_str();
  const int rc = ::getaddrinfo(node, std::to_string(port).c_str(), &hints, &result);
  if (rc != 0) {
    throw DistError(DistError::Kind::usage,
                    "tcp store: cannot resolve '" + host + "': " + ::gai_strerror(rc) +
                        "; give a host name or address every rank can reach",
                    "store.open");
  }
  return result;
}

}  // namespace

// ---- server -------------------------------------------------------------------------------------

struct TcpStoreServer::Impl {
  int listen_fd = -1;
  int wake_pipe[2] = {-1, -1};
  int port = 0;
  std::map<std::string, std::string> data;
  std::thread thread;

  // Answers one request from `fd`; false when the client hung up or spoke nonsense.
  bool serve(int fd) {
    uint8_t op = 0;
    std::string key;
    if (!read_exact(fd, &op, 1) || !read_string(fd, key, kMaxKeyBytes)) return false;
    if (op == 'S') {
      std::string value;
      if (!read_string(fd, value, kMaxValueBytes)) return false;
      data[key] = std::move(value);
      const uint8_t ok = 1;
      return write_exact(fd, &ok, 1);
    }
    if (op == 'G') {
      const auto it = data.find(key);
      const uint8_t found = it != data.end() ? 1 : 0;
      if (!write_exact(fd, &found, 1)) return false;
      return !found || write_string(fd, it->second);
    }
    if (op == 'A') {
      int64_t delta = 0;
      if (!read_exact(fd, &delta, sizeof delta)) return false;
      int64_t value = 0;
      if (const auto it = data.find(key); it != data.end()) {
        try {
          value = std::stoll(it->second);
        } catch (const std::exception&) {
          value = 0;  // not a counter: restart it (the client API never mixes set and add)
        }
      }
      value += delta;
      data[key] = std::to_string(value);
      return write_exact(fd, &value, sizeof value);
    }
    return false;
  }

  void run() {
    std::vector<pollfd> fds;
    fds.push_back({wake_pipe[0], POLLIN, 0});
    fds.push_back({listen_fd, POLLIN, 0});
    while (true) {
      for (auto& p : fds)
        p.revents = 0;
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (fds[0].revents) break;  // destructor asked us to stop
      if (fds[1].revents & POLLIN) {
        const int client = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (client >= 0) {
          const int one = 1;
          ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          fds.push_back({client, POLLIN, 0});
        }
      }
      for (size_t i = 2; i < fds.size();) {
        if (fds[i].revents && !serve(fds[i].fd)) {
          ::close(fds[i].fd);
          fds.erase(fds.begin() + static_cast<std::ptrdiff_t>(i));
          continue;
        }
        ++i;
      }
    }
    for (size_t i = 2; i < fds.size(); ++i)
      ::close(fds[i].fd);
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port)
    : impl_(std::make_unique<Impl>()) {
  addrinfo* addresses = resolve(host, port, true);
  std::string why = "no address";
  for (addrinfo* a = addresses; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      impl_->listen_fd = fd;
      break;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(addresses);
  if (impl_->listen_fd < 0) {
    throw DistError(DistError::Kind::io,
                    "tcp store server: cannot listen on " + host + ":" + std::to_string(port) +
                        ": " + why + "; pick another port or free this one",
                    "store.open");
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&bound), &length);
  impl_->port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (::pipe2(impl_->wake_pipe, O_CLOEXEC) != 0) {
    ::close(impl_->listen_fd);
    throw DistError(DistError::Kind::io, "tcp store server: pipe failed", "store.open");
  }
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  const char stop = 1;
  [[maybe_unused]] const ssize_t n = ::write(impl_->wake_pipe[1], &stop, 1);
  impl_->thread.join();
  ::close(impl_->listen_fd);
  ::close(impl_->wake_pipe[0]);
  ::close(impl_->wake_pipe[1]);
}

int TcpStoreServer::port() const {
  return impl_->port;
}

// ---- client -------------------------------------------------------------------------------------

struct TcpStore::Impl {
  std::string host;
  int port = 0;
  int fd = -1;
  std::mutex mutex;  // one request at a time on the one connection

  [[noreturn]] void lost(const char* op) const {
    throw DistError(DistError::Kind::io,
                    std::string(op) + ": lost the connection to the tcp store at " + host + ":" +
                        std::to_string(port) + " (did rank 0, which runs the server, exit?)",
                    op);
  }
};

TcpStore::TcpStore(std::string host, int port, Milliseconds connect_timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = std::move(host);
  impl_->port = port;
  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  Milliseconds delay(5);
  std::string why;
  while (true) {
    addrinfo* addresses = resolve(impl_->host, port, false);
    for (addrinfo* a = addresses; a != nullptr && impl_->fd < 0; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        impl_->fd = fd;
      } else {
        why = std::strerror(errno);
        ::close(fd);
      }
    }
    ::freeaddrinfo(addresses);
    if (impl_->fd >= 0) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      throw DistError(DistError::Kind::timeout,
                      "tcp store: cannot connect to " + impl_->host + ":" + std::to_string(port) +
                          " within " + std::to_string(connect_timeout.count()) + " ms (" + why +
                          "); is rank 0 running the store server at that address?",
                      "store.connect");
    }
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, Milliseconds(200));
  }
  const int one = 1;
  ::setsockopt(impl_->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

TcpStore::~TcpStore() {
  if (impl_->fd >= 0) ::close(impl_->fd);
}

std::string TcpStore::describe() const {
  return "tcp store " + impl_->host + ":" + std::to_string(impl_->port);
}

void TcpStore::set(const std::string& key, std::string_view value) {
  std::lock_guard<std::mutex> guard(impl_->mutex);
  const uint8_t op = 'S';
  uint8_t ok = 0;
  if (!write_exact(impl_->fd, &op, 1) || !write_string(impl_->fd, key) ||
      !write_string(impl_->fd, value) || !read_exact(impl_->fd, &ok, 1))
    impl_->lost("store.set");
}

std::optional<std::string> TcpStore::try_get(const std::string& key) {
  std::lock_guard<std::mutex> guard(impl_->mutex);
  const uint8_t op = 'G';
  uint8_t found = 0;
  if (!write_exact(impl_->fd, &op, 1) || !write_string(impl_->fd, key) ||
      !read_exact(impl_->fd, &found, 1))
    impl_->lost("store.get");
  if (!found) return std::nullopt;
  std::string value;
  if (!read_string(impl_->fd, value, kMaxValueBytes)) impl_->lost("store.get");
  return value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> guard(impl_->mutex);
  const uint8_t op = 'A';
  int64_t value = 0;
  if (!write_exact(impl_->fd, &op, 1) || !write_string(impl_->fd, key) ||
      !write_exact(impl_->fd, &delta, sizeof delta) || !read_exact(impl_->fd, &value, sizeof value))
    impl_->lost("store.add");
  return value;
}

}  // namespace trainctl::dist
