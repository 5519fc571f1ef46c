// Store: the key-value rendezvous every rank of a job shares (c10d's Store). Ranks publish their
// transport addresses and small facts (pid, host) here before any collective exists.
//
// Contract:
//  - Values are bytes (std::string is used as a binary-safe byte container).
//  - set() overwrites; the write is visible to every other process once set() returns.
//  - get() blocks until the key exists or the timeout passes (CommError, Kind::timeout, naming the
//  key).
//  - add() is an atomic counter shared by all processes (missing key counts as 0); returns the new
//  value.
//  - wait() blocks until every key exists; its error names the keys that are still missing.
//  - Implementations are safe to call from several threads of one process.
//
// Keys of one job attempt live under a prefix "<job_id>/<restart_count>/" (see job_store()), so a
// restarted job never reads the keys its previous attempt left behind.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/store_protocol.hpp"

namespace trainctl::comm {

using Milliseconds = std::chrono::milliseconds;

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, std::string_view value) = 0;
  // The value if the key exists now, without waiting.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Polls try_get with backoff (1 ms growing to 50 ms).
  std::string get(const std::string& key, Milliseconds timeout);
  void wait(const std::vector<std::string>& keys, Milliseconds timeout);
  // A short text for error messages: "file store /run/x/rendezvous", "tcp store 10.0.0.1:29500".
  virtual std::string describe() const = 0;
};

// Keys land in files of one folder (created if missing). Atomic: each set() writes a temporary
// file, fsyncs nothing (rendezvous data is not precious) and renames it over the key's file; add()
// holds a POSIX record lock on the key's lock file, which works across processes and across nodes
// on NFS. Use it in the run directory when every node sees the same file system.
class FileStore : public Store {
 public:
  explicit FileStore(std::string dir);
  void set(const std::string& key, std::string_view value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string describe() const override;
  const std::string& dir() const { return dir_; }

 private:
  std::string path_of(const std::string& key) const;
  std::string dir_;
};

// The bounds and deadlines of a TcpStoreServer. Defaults suit a job of up to 65,536 ranks.
struct TcpStoreServerOptions {
  size_t max_bytes = size_t{256} << 20;  // keys + values stored (StoreData); a set past it fails
  size_t max_clients = 65536;  // connections that passed the handshake; more are closed at once
  // Connections still in their handshake; a new one beyond this closes the oldest, so a flood of
  // silent connections can delay a rank's handshake (it retries) but never lock it out.
  size_t max_pending = 256;
  Milliseconds handshake_timeout{10000};  // from accept to a correct proof
  Milliseconds request_timeout{30000};    // from a request's first byte to its reply sent
  // Called from the server's thread, one line per event worth a log line (refused connections,
  // rate-limited to one line per 10 s with counts); never with the secret.
  std::function<void(const std::string&)> log;
};

// A small TCP key-value server that rank 0 runs; every rank, rank 0 included, talks to it through
// a TcpStore client. For clusters without a shared file system. One thread with a poll loop over
// non-blocking sockets: no client can stall it (each connection has its own buffers, bounded,
// and its own deadline). Only clients that prove they hold the job's secret (store_protocol.hpp)
// may read or write; the others are disconnected and counted in the log.
class TcpStoreServer {
 public:
  // Listens on host:port; port 0 picks a free port (see port()). host "" or "0.0.0.0": every
  // interface.
  TcpStoreServer(const std::string& host, int port, const StoreSecret& secret,
                 TcpStoreServerOptions options = {});
  ~TcpStoreServer();  // stops the thread and closes every connection
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const;
  // Connections refused so far (wrong secret, handshake deadline, malformed, over a bound).
  uint64_t refused() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class TcpStore : public Store {
 public:
  // Connects to a TcpStoreServer and proves it holds `secret` (and checks that the server does),
  // retrying until `timeout` (the server may start later). Each later request must be answered
  // within `timeout` too. Throws CommError: usage when the server refuses the secret or is not
  // this job's store; timeout when no store answers.
  TcpStore(std::string host, int port, const StoreSecret& secret, Milliseconds timeout);
  ~TcpStore() override;
  void set(const std::string& key, std::string_view value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string describe() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Every key gets `prefix` in front. The base store must outlive this object.
class PrefixStore : public Store {
 public:
  PrefixStore(Store& base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}
  void set(const std::string& key, std::string_view value) override {
    base_.set(prefix_ + key, value);
  }
  std::optional<std::string> try_get(const std::string& key) override {
    return base_.try_get(prefix_ + key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return base_.add(prefix_ + key, delta);
  }
  std::string describe() const override { return base_.describe() + " (prefix " + prefix_ + ")"; }
  const std::string& prefix() const { return prefix_; }

 private:
  Store& base_;
  std::string prefix_;
};

// The namespace of one attempt of one job: "<job_id>/<restart_count>/". job_id must be non-empty
// and may not contain '/'; restart_count >= 0 (e.g. SLURM_RESTART_COUNT).
PrefixStore job_store(Store& base, const std::string& job_id, int restart_count);

}  // namespace trainctl::comm
