// TcpStoreServer and TcpStore: the sockets around store_protocol.hpp's handshake and requests.
//
// The server is one thread polling non-blocking sockets. Each connection has a StoreConnection
// (its buffers, bounded) and a deadline: the handshake's from accept, a request's from its first
// byte until its reply is sent. A connection that misses its deadline, fails the handshake or
// speaks nonsense is closed; the others never wait for it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <mutex>
#include <optional>
#include <thread>

#include "comm/error.hpp"
#include "comm/store.hpp"

namespace trainctl::comm {
namespace {

using Clock = std::chrono::steady_clock;

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const char* node = (host.empty() || host == "0.0.0.0") ? nullptr : host.c_str();
  const int rc = ::getaddrinfo(node, std::to_string(port).c_str(), &hints, &result);
  if (rc != 0) {
    throw CommError(CommError::Kind::usage,
                    "tcp store: cannot resolve '" + host + "': " + ::gai_strerror(rc) +
                        "; give a host name or address every rank can reach",
                    "store.open");
  }
  return result;
}

void set_nonblocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// "10.0.0.7:41234" for the log.
std::string peer_name(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (address.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&address);
    ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
    port = ntohs(in->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

int millis_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

}  // namespace

// ---- server -------------------------------------------------------------------------------------

struct TcpStoreServer::Impl {
  struct Client {
    int fd = -1;
    std::string peer;
    StoreConnection connection;
    size_t sent = 0;  // bytes of connection.out() already sent
    Clock::time_point accepted;
    Clock::time_point busy_since;  // when a message began or a reply became due; see deadline()
    bool busy = false;

    Client(int fd, std::string peer, const StoreSecret& secret, StoreData& data)
        : fd(fd),
          peer(std::move(peer)),
          connection(secret, random_nonce(), data),
          accepted(Clock::now()) {}
  };

  StoreSecret secret;
  TcpStoreServerOptions options;
  StoreData data;
  int listen_fd = -1;
  int wake_pipe[2] = {-1, -1};
  int port = 0;
  std::list<Client> clients;
  std::thread thread;
  std::atomic<uint64_t> refused{0};
  // The log's rate limit: the first refusal is logged at once, later ones at most every 10 s.
  std::optional<Clock::time_point> last_log;
  uint64_t unlogged = 0;

  Impl(const StoreSecret& secret, TcpStoreServerOptions options)
      : secret(secret), options(std::move(options)), data(this->options.max_bytes) {}

  size_t pending = 0;  // clients still in their handshake
  // Out of file descriptors (EMFILE): the listening socket stays readable, so it is left out of
  // poll until then instead of spinning a core.
  Clock::time_point accept_resume{};

  void note_refusal(const std::string& peer, const std::string& why) {
    const uint64_t total = ++refused;
    const auto now = Clock::now();
    if (last_log && now - *last_log < std::chrono::seconds(10)) {
      ++unlogged;
      return;
    }
    if (options.log) {
      std::string line = "tcp store: closed the connection from " + peer + " (" + why + "); " +
                         std::to_string(total) + " refused so far";
      if (unlogged > 0)
        line += " (" + std::to_string(unlogged) + " not logged since the last line)";
      options.log(line + "; the job goes on");
    }
    last_log = now;
    unlogged = 0;
  }

  Clock::time_point deadline(const Client& c) const {
    if (!c.connection.authenticated()) return c.accepted + options.handshake_timeout;
    if (c.busy) return c.busy_since + options.request_timeout;
    return Clock::time_point::max();
  }

  void close_client(std::list<Client>::iterator it, const std::string& why) {
    if (!why.empty()) note_refusal(it->peer, why);
    if (!it->connection.authenticated()) --pending;
    ::close(it->fd);
    clients.erase(it);
  }

  void accept_all() {
    while (true) {
      sockaddr_storage address{};
      socklen_t length = sizeof address;
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&address), &length,
                               SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {  // EAGAIN: none left
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
          accept_resume = Clock::now() + Milliseconds(100);
        return;
      }
      set_nodelay(fd);
      const std::string peer = peer_name(address);
      if (clients.size() - pending >= options.max_clients) {
        note_refusal(
            peer, "the store already serves " + std::to_string(options.max_clients) + " clients");
        ::close(fd);
        continue;
      }
      if (pending >= options.max_pending) {  // the oldest connection still in its handshake
        const auto oldest = std::find_if(clients.begin(), clients.end(), [](const Client& c) {
          return !c.connection.authenticated();
        });
        close_client(oldest, "no handshake yet and " + std::to_string(options.max_pending) +
                                 " newer connections waiting");
      }
      clients.emplace_back(fd, peer, secret, data);
      ++pending;
      Client& c = clients.back();
      c.connection.out() = c.connection.greeting();
      write_some(c);
    }
  }

  // Sends what it can of c's reply; false when the connection is lost.
  bool write_some(Client& c) {
    std::string& out = c.connection.out();
    while (c.sent < out.size()) {
      const ssize_t n = ::send(c.fd, out.data() + c.sent, out.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      c.sent += static_cast<size_t>(n);
    }
    out.clear();
    c.sent = 0;
    return true;
  }

  // Handles readiness on c; false (with *why set, empty for a plain hang-up) when it must close.
  bool serve(Client& c, short revents, std::string* why) {
    const bool was_authenticated = c.connection.authenticated();
    const bool open = serve_io(c, revents, why);
    if (!was_authenticated && c.connection.authenticated()) --pending;
    return open;
  }

  // serve() without the count of pending handshakes.
  bool serve_io(Client& c, short revents, std::string* why) {
    if (revents & POLLOUT) {
      if (!write_some(c)) return false;
      // The reply is out: answer what the client sent meanwhile (held back by the high water).
      if (c.connection.out().empty() && !c.connection.receive({})) {
        *why = c.connection.reason();
        return false;
      }
    } else if (revents & (POLLIN | POLLHUP | POLLERR)) {
      char buffer[64 * 1024];
      const ssize_t n = ::recv(c.fd, buffer, sizeof buffer, 0);
      if (n == 0) {
        if (!c.connection.authenticated()) *why = "hung up during the handshake";
        return false;
      }
      if (n < 0) return errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK;
      if (!c.connection.receive(std::string_view(buffer, static_cast<size_t>(n)))) {
        *why = c.connection.reason();
        write_some(c);  // the refusal byte, if the socket takes it now
        return false;
      }
    }
    const bool busy = c.connection.mid_message() || !c.connection.out().empty();
    if (busy && !c.busy) c.busy_since = Clock::now();
    c.busy = busy;
    return c.connection.out().empty() || write_some(c);
  }

  void run() {
    std::vector<pollfd> fds;
    std::vector<std::list<Client>::iterator> owners;
    while (true) {
      fds.clear();
      owners.clear();
      fds.push_back({wake_pipe[0], POLLIN, 0});
      const bool accepting = Clock::now() >= accept_resume;
      fds.push_back({listen_fd, static_cast<short>(accepting ? POLLIN : 0), 0});
      auto next = accepting ? Clock::time_point::max() : accept_resume;
      for (auto it = clients.begin(); it != clients.end(); ++it) {
        const short events = it->connection.out().empty() ? POLLIN : POLLOUT;
        fds.push_back({it->fd, events, 0});
        owners.push_back(it);
        next = std::min(next, deadline(*it));
      }
      const int wait = next == Clock::time_point::max() ? -1 : millis_until(next);
      if (::poll(fds.data(), fds.size(), wait) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (fds[0].revents) break;  // the destructor asks us to stop
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        std::string why;
        if (!serve(*owners[i - 2], fds[i].revents, &why)) close_client(owners[i - 2], why);
      }
      const auto now = Clock::now();
      for (auto it = clients.begin(); it != clients.end();) {
        const auto next_it = std::next(it);
        if (deadline(*it) <= now) {
          close_client(it, it->connection.authenticated()
                               ? "a request took longer than " +
                                     std::to_string(options.request_timeout.count()) + " ms"
                               : "no correct handshake within " +
                                     std::to_string(options.handshake_timeout.count()) + " ms");
        }
        it = next_it;
      }
      if (fds[1].revents & POLLIN) accept_all();
    }
    for (Client& c : clients)
      ::close(c.fd);
    clients.clear();
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port, const StoreSecret& secret,
                               TcpStoreServerOptions options)
    : impl_(std::make_unique<Impl>(secret, std::move(options))) {
  addrinfo* addresses = resolve(host, port, true);
  std::string why = "no address";
  for (addrinfo* a = addresses; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      impl_->listen_fd = fd;
      break;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(addresses);
  if (impl_->listen_fd < 0) {
    throw CommError(CommError::Kind::io,
                    "tcp store server: cannot listen on " + host + ":" + std::to_string(port) +
                        ": " + why + "; pick another port or free this one",
                    "store.open");
  }
  set_nonblocking(impl_->listen_fd);
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&bound), &length);
  impl_->port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (::pipe2(impl_->wake_pipe, O_CLOEXEC) != 0) {
    ::close(impl_->listen_fd);
    throw CommError(CommError::Kind::io, "tcp store server: pipe failed", "store.open");
  }
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  const char stop = 1;
  [[maybe_unused]] const ssize_t n = ::write(impl_->wake_pipe[1], &stop, 1);
  impl_->thread.join();
  if (impl_->refused.load() > 0 && impl_->options.log) {
    impl_->options.log("tcp store: refused " + std::to_string(impl_->refused.load()) +
                       " connection(s) in all while it served this job");
  }
  ::close(impl_->listen_fd);
  ::close(impl_->wake_pipe[0]);
  ::close(impl_->wake_pipe[1]);
}

int TcpStoreServer::port() const {
  return impl_->port;
}

uint64_t TcpStoreServer::refused() const {
  return impl_->refused.load();
}

// ---- client -------------------------------------------------------------------------------------

namespace {

// Why a client read or write stopped: the peer closed, the deadline passed, or another error.
enum class Io { ok, closed, timeout, error };

Io wait_for(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, millis_until(deadline));
    if (rc > 0) return Io::ok;
    if (rc == 0) return Io::timeout;
    if (errno != EINTR) return Io::error;
  }
}

Io read_exact(int fd, void* data, size_t bytes, Clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (n == 0) return Io::closed;
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Io::error;
      if (const Io w = wait_for(fd, POLLIN, deadline); w != Io::ok) return w;
      continue;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return Io::ok;
}

Io write_exact(int fd, const void* data, size_t bytes, Clock::time_point deadline) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Io::error;
      if (const Io w = wait_for(fd, POLLOUT, deadline); w != Io::ok) return w;
      continue;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return Io::ok;
}

// A connected socket to host:port, or -1 with *why set; gives up at `deadline`.
int connect_once(const std::string& host, int port, Clock::time_point deadline, std::string* why) {
  addrinfo* addresses = resolve(host, port, false);
  int connected = -1;
  for (addrinfo* a = addresses; a != nullptr && connected < 0; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      if (wait_for(fd, POLLOUT, deadline) == Io::ok) {
        int error = 0;
        socklen_t length = sizeof error;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
        errno = error;
        rc = error == 0 ? 0 : -1;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      connected = fd;
    } else {
      *why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(addresses);
  return connected;
}

}  // namespace

struct TcpStore::Impl {
  std::string host;
  int port = 0;
  StoreSecret secret;
  Milliseconds timeout;
  int fd = -1;
  std::mutex mutex;  // one request at a time on the one connection

  std::string where() const { return host + ":" + std::to_string(port); }

  [[noreturn]] void failed(const char* op, Io io) const {
    if (io == Io::timeout) {
      throw CommError(CommError::Kind::timeout,
                      std::string(op) + ": the tcp store at " + where() +
                          " did not answer within " + std::to_string(timeout.count()) +
                          " ms (is rank 0, which runs the server, stopped or overloaded?)",
                      op);
    }
    throw CommError(CommError::Kind::io,
                    std::string(op) + ": lost the connection to the tcp store at " + where() +
                        " (did rank 0, which runs the server, exit?)",
                    op);
  }

  void send_request(const char* op, const std::string& request) {
    const Io io = write_exact(fd, request.data(), request.size(), Clock::now() + timeout);
    if (io != Io::ok) failed(op, io);
  }

  template <class T>
  T receive(const char* op) {
    T value{};
    const Io io = read_exact(fd, &value, sizeof value, Clock::now() + timeout);
    if (io != Io::ok) failed(op, io);
    return value;
  }

  // The handshake on a fresh connection: true when both sides proved the secret; false when the
  // server closed the connection before answering (it may have dropped us to make room: retry).
  // Throws CommError when the server refuses the secret or does not prove it holds it.
  bool handshake(int socket, Clock::time_point deadline, std::string* why) {
    char greeting[kStoreMagic.size() + kStoreNonceBytes];
    Io io = read_exact(socket, greeting, sizeof greeting, deadline);
    if (io != Io::ok) {
      *why = io == Io::timeout ? "the server sent no greeting" : "the connection closed";
      return false;
    }
    if (std::string_view(greeting, kStoreMagic.size()) != kStoreMagic) {
      throw CommError(CommError::Kind::usage,
                      "tcp store: " + where() +
                          " is not a trainctl store of this version (it greets with other "
                          "bytes); another service holds the port: set TRAINCTL_STORE_PORT",
                      "store.connect");
    }
    StoreNonce server_nonce;
    std::memcpy(server_nonce.data(), greeting + kStoreMagic.size(), server_nonce.size());
    const StoreNonce client_nonce = random_nonce();
    const StoreProof proof = store_proof(secret, StoreRole::client, server_nonce, client_nonce);
    std::string hello(reinterpret_cast<const char*>(client_nonce.data()), client_nonce.size());
    hello.append(reinterpret_cast<const char*>(proof.data()), proof.size());
    if (write_exact(socket, hello.data(), hello.size(), deadline) != Io::ok) {
      *why = "the connection closed during the handshake";
      return false;
    }
    uint8_t status = 0;
    io = read_exact(socket, &status, 1, deadline);
    if (io != Io::ok) {
      *why = "the server closed the connection during the handshake";
      return false;
    }
    if (status != kStoreOk) {
      throw CommError(CommError::Kind::usage,
                      "tcp store: the store at " + where() +
                          " refused this rank's secret: every rank of a job must get the same "
                          "TRAINCTL_STORE_SECRET (trainctl submit's batch script sets it once "
                          "for the job), or this is another job's store on the same port (set "
                          "TRAINCTL_STORE_PORT)",
                      "store.connect");
    }
    StoreProof server_proof;
    io = read_exact(socket, server_proof.data(), server_proof.size(), deadline);
    if (io != Io::ok) {
      *why = "the server closed the connection during the handshake";
      return false;
    }
    if (!same_proof(server_proof,
                    store_proof(secret, StoreRole::server, client_nonce, server_nonce))) {
      throw CommError(CommError::Kind::usage,
                      "tcp store: the server at " + where() +
                          " did not prove that it holds this job's secret: it is not this job's "
                          "store (another job's on the same port, or an impostor); set "
                          "TRAINCTL_STORE_PORT to a port of this job's own",
                      "store.connect");
    }
    return true;
  }
};

TcpStore::TcpStore(std::string host, int port, const StoreSecret& secret, Milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = std::move(host);
  impl_->port = port;
  impl_->secret = secret;
  impl_->timeout = timeout;
  const auto deadline = Clock::now() + timeout;
  Milliseconds delay(5);
  std::string why = "no address";
  while (true) {
    const int fd = connect_once(impl_->host, port, deadline, &why);
    if (fd >= 0) {
      bool done = false;
      try {
        done = impl_->handshake(fd, deadline, &why);
      } catch (...) {
        ::close(fd);
        throw;
      }
      if (done) {
        impl_->fd = fd;
        break;
      }
      ::close(fd);
    }
    if (Clock::now() >= deadline) {
      throw CommError(CommError::Kind::timeout,
                      "tcp store: cannot connect to " + impl_->where() + " within " +
                          std::to_string(timeout.count()) + " ms (" + why +
                          "); is rank 0 running the store server at that address?",
                      "store.connect");
    }
    std::this_thread::sleep_for(std::min(delay, Milliseconds(millis_until(deadline))));
    delay = std::min(delay * 2, Milliseconds(200));
  }
  set_nodelay(impl_->fd);
}

TcpStore::~TcpStore() {
  if (impl_->fd >= 0) ::close(impl_->fd);
}

std::string TcpStore::describe() const {
  return "tcp store " + impl_->where();
}

namespace {

std::string request_head(char op, const std::string& key) {
  if (key.size() > kStoreMaxKeyBytes) {
    throw CommError(CommError::Kind::usage,
                    "tcp store: a key of " + std::to_string(key.size()) + " bytes (the limit is " +
                        std::to_string(kStoreMaxKeyBytes) + ")",
                    "store");
  }
  std::string request(1, op);
  const auto size = static_cast<uint32_t>(key.size());
  request.append(reinterpret_cast<const char*>(&size), sizeof size);
  request += key;
  return request;
}

[[noreturn]] void store_full(const char* op, const std::string& key, const std::string& where) {
  throw CommError(CommError::Kind::io,
                  std::string(op) + ": the tcp store at " + where +
                      " is full (its bound on keys "
                      "and values is reached) and did not store key '" +
                      key + "'",
                  op);
}

}  // namespace

void TcpStore::set(const std::string& key, std::string_view value) {
  if (value.size() > kStoreMaxValueBytes) {
    throw CommError(CommError::Kind::usage,
                    "store.set: a value of " + std::to_string(value.size()) + " bytes for key '" +
                        key + "' (the limit is " + std::to_string(kStoreMaxValueBytes) + ")",
                    "store.set");
  }
  std::lock_guard<std::mutex> guard(impl_->mutex);
  std::string request = request_head('S', key);
  const auto size = static_cast<uint32_t>(value.size());
  request.append(reinterpret_cast<const char*>(&size), sizeof size);
  request += value;
  impl_->send_request("store.set", request);
  if (impl_->receive<uint8_t>("store.set") != kStoreOk)
    store_full("store.set", key, impl_->where());
}

std::optional<std::string> TcpStore::try_get(const std::string& key) {
  std::lock_guard<std::mutex> guard(impl_->mutex);
  impl_->send_request("store.get", request_head('G', key));
  if (impl_->receive<uint8_t>("store.get") == 0) return std::nullopt;
  const auto size = impl_->receive<uint32_t>("store.get");
  if (size > kStoreMaxValueBytes) impl_->failed("store.get", Io::error);
  std::string value(size, '\0');
  const Io io = read_exact(impl_->fd, value.data(), size, Clock::now() + impl_->timeout);
  if (io != Io::ok) impl_->failed("store.get", io);
  return value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> guard(impl_->mutex);
  std::string request = request_head('A', key);
  request.append(reinterpret_cast<const char*>(&delta), sizeof delta);
  impl_->send_request("store.add", request);
  const auto status = impl_->receive<uint8_t>("store.add");
  const auto value = impl_->receive<int64_t>("store.add");
  if (status != kStoreOk) store_full("store.add", key, impl_->where());
  return value;
}

}  // namespace trainctl::comm
