// GlooCommunicator: Communicator over Gloo's new-style collectives (never the legacy algorithm
// classes: mixing them on one context pins socket buffers and slows later calls 400x).
// reduce_scatter has no new-style Gloo op: it is all_to_all plus a local sum in rank order.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/error.hpp"
#include "comm/gloo_communicator.hpp"
#include "comm/peers.hpp"

namespace trainctl::comm {

class GlooDevice {
 public:
  explicit GlooDevice(std::shared_ptr<gloo::transport::Device> device)
      : device(std::move(device)) {}
  std::shared_ptr<gloo::transport::Device> device;
};

std::shared_ptr<GlooDevice> make_gloo_device() {
  // Gloo writes to its sockets without MSG_NOSIGNAL: a peer that dies mid-transfer would kill this
  // process with SIGPIPE instead of failing the collective with an error that names the peer.
  // Ignore SIGPIPE unless the program installed its own handler (Python does the same).
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL)
    ::signal(SIGPIPE, SIG_IGN);
  gloo::transport::tcp::attr attr;
  const char* choice = std::getenv("TRAINCTL_GLOO_IFACE");
  if (choice != nullptr && *choice != '\0') {
    if (::if_nametoindex(choice) != 0)
      attr.iface = choice;
    else
      attr.hostname = choice;
  } else {
    attr.hostname = "127.0.0.1";
  }
  try {
    return std::make_shared<GlooDevice>(gloo::transport::tcp::CreateDevice(attr));
  } catch (const std::exception& error) {
    throw CommError(CommError::Kind::io,
                    std::string("gloo: cannot create a TCP device on '") +
                        (choice ? choice : "127.0.0.1") + "': " + error.what() +
                        "; set TRAINCTL_GLOO_IFACE to an interface or address of this host",
                    "device");
  }
}

std::string gloo_address() {
  const char* choice = std::getenv("TRAINCTL_GLOO_IFACE");
  if (choice == nullptr || *choice == '\0') return "127.0.0.1";
  if (::if_nametoindex(choice) == 0) return choice;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return choice;
  std::string address = choice;
  for (const ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET ||
        std::strcmp(entry->ifa_name, choice) != 0)
      continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) != nullptr) address = text;
    break;
  }
  ::freeifaddrs(list);
  return address;
}

namespace {

using std::chrono::milliseconds;
constexpr uint8_t kSendRecvSlotPrefix = 0x7f;  // Gloo's own collectives use small prefixes
// How long a survivor of a closed connection watches the process table for the peer to exit.
constexpr milliseconds kExitSettle{1000};

// Our Store seen as Gloo's rendezvous store. Gloo calls wait() and get() during connectFullMesh.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(comm::Store& store, milliseconds timeout) : store_(store), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, std::string_view(data.data(), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string value = store_.get(key, timeout_);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    store_.wait(keys, timeout);
  }

 private:
  comm::Store& store_;
  milliseconds timeout_;
};

std::string peer_key(int rank) {
  return "trainctl/peer/" + std::to_string(rank);
}

template <class T>
void sum_into(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i)
    o[i] = x[i] + y[i];
}

template <class T>
void max_into(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i)
    o[i] = x[i] < y[i] ? y[i] : x[i];
}

// Widen a bf16/f16 buffer to f32 and back: narrow types are summed in f32, rounded once.
void widen(const void* data, float* wide, size_t count, DType dtype) {
  for (size_t i = 0; i < count; ++i) {
    wide[i] = dtype == DType::bf16 ? tensor::to_float(static_cast<const tensor::bf16*>(data)[i])
                                   : tensor::to_float(static_cast<const tensor::f16*>(data)[i]);
  }
}
void narrow(const float* wide, void* data, size_t count, DType dtype) {
  for (size_t i = 0; i < count; ++i) {
    if (dtype == DType::bf16)
      static_cast<tensor::bf16*>(data)[i] = tensor::to_bf16(wide[i]);
    else
      static_cast<tensor::f16*>(data)[i] = tensor::to_f16(wide[i]);
  }
}

// output[i] = chunk_0[i] + chunk_1[i] + ... in that order (the deterministic part of
// reduce_scatter); chunk r starts at r * count. T is the storage type; the sum runs in its compute
// type and is rounded once. Blocked so the inner loops run over contiguous elements and vectorise:
// the order of the additions per element is still rank order.
template <class T>
void sum_chunks(const void* chunks, void* output, size_t count, int num_chunks) {
  constexpr size_t kBlock = 1024;
  const auto* in = static_cast<const T*>(chunks);
  auto* out = static_cast<T*>(output);
  tensor::compute_t<T> acc[kBlock];
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = std::min(kBlock, count - begin);
    for (size_t i = 0; i < n; ++i)
      acc[i] = tensor::load(in[begin + i]);
    for (int r = 1; r < num_chunks; ++r) {
      const T* chunk = in + static_cast<size_t>(r) * count + begin;
      for (size_t i = 0; i < n; ++i)
        acc[i] += tensor::load(chunk[i]);
    }
    for (size_t i = 0; i < n; ++i)
      out[begin + i] = tensor::store<T>(acc[i]);
  }
}

void sum_chunks(DType dtype, const void* chunks, void* output, size_t count, int num_chunks) {
  switch (dtype) {
    case DType::f32:
      return sum_chunks<float>(chunks, output, count, num_chunks);
    case DType::f64:
      return sum_chunks<double>(chunks, output, count, num_chunks);
    case DType::bf16:
      return sum_chunks<tensor::bf16>(chunks, output, count, num_chunks);
    default:
      return sum_chunks<tensor::f16>(chunks, output, count, num_chunks);
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const GroupOptions& options, std::shared_ptr<gloo::rendezvous::Context> context,
                   std::vector<detail::PeerInfo> peers)
      : name_(options.name),
        rank_(options.rank),
        size_(options.size),
        timeout_(options.timeout),
        context_(std::move(context)),
        peers_(std::move(peers)) {}

  const std::string& name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  milliseconds timeout() const override { return timeout_; }

  void all_reduce_sum(void* data, size_t count, DType dtype, milliseconds timeout) override {
    check_sum_dtype("all_reduce", *this, dtype);
    if (count == 0) return;
    if (dtype == DType::bf16 || dtype == DType::f16) {
      auto* wide = reinterpret_cast<float*>(scratch(count * sizeof(float)));
      widen(data, wide, count, dtype);
      all_reduce_sum(wide, count, DType::f32, timeout);
      narrow(wide, data, count, dtype);
      return;
    }
    ring_all_reduce("all_reduce", data, count, dtype, timeout, &sum_into<float>, &sum_into<double>);
  }

  void all_reduce_max(void* data, size_t count, DType dtype, milliseconds timeout) override {
    check_max_dtype("all_reduce_max", *this, dtype);
    if (count == 0) return;
    ring_all_reduce("all_reduce_max", data, count, dtype, timeout, &max_into<float>,
                    &max_into<double>);
  }

  void reduce_scatter_sum(const void* input, void* output, size_t count, DType dtype,
                          milliseconds timeout) override {
    check_sum_dtype("reduce_scatter", *this, dtype);
    if (count == 0) return;
    const size_t chunk_bytes = count * tensor::dtype_size(dtype);
    char* received = scratch(chunk_bytes * static_cast<size_t>(size_));
    all_to_all_impl("reduce_scatter", input, received, chunk_bytes, timeout);
    sum_chunks(dtype, received, output, count, size_);
  }

  // alltoallv sends chunk r to rank r and receives size() chunks of counts[rank()] elements, packed
  // like reduce_scatter_sum's: the same local sum then gives the same bits for equal counts.
  void reduce_scatter_sum_v(const void* input, void* output, std::span<const size_t> counts,
                            DType dtype, milliseconds timeout) override {
    check_sum_dtype("reduce_scatter_v", *this, dtype);
    check_counts("reduce_scatter_v", *this, counts, "element counts");
    size_t total = 0;
    for (size_t c : counts)
      total += c;
    if (total == 0) return;
    const size_t item = tensor::dtype_size(dtype);
    const size_t mine = counts[static_cast<size_t>(rank_)];
    std::vector<int64_t> send(counts.size()),
        recv(counts.size(), static_cast<int64_t>(mine * item));
    for (size_t r = 0; r < counts.size(); ++r)
      send[r] = static_cast<int64_t>(counts[r] * item);
    char dummy = 0;  // Gloo wants a pointer even for an empty side
    char* received = mine > 0 ? scratch(mine * item * static_cast<size_t>(size_)) : &dummy;
    char* in = input ? static_cast<char*>(const_cast<void*>(input)) : &dummy;
    run("reduce_scatter_v", timeout, [&](milliseconds t) {
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(in, send);
      opts.setOutput(received, recv);
      opts.setTimeout(t);
      gloo::alltoallv(opts);
    });
    if (mine > 0) sum_chunks(dtype, received, output, mine, size_);
  }

  void all_gather_v(const void* input, void* output, std::span<const size_t> bytes,
                    milliseconds timeout) override {
    check_counts("all_gather_v", *this, bytes, "byte counts");
    size_t total = 0;
    for (size_t b : bytes)
      total += b;
    if (total == 0) return;
    char dummy = 0;
    const size_t mine = bytes[static_cast<size_t>(rank_)];
    char* in = mine > 0 ? static_cast<char*>(const_cast<void*>(input)) : &dummy;
    run("all_gather_v", timeout, [&](milliseconds t) {
      gloo::AllgathervOptions opts(context_);
      opts.setInput(in, mine);
      opts.setOutput(static_cast<char*>(output), std::vector<size_t>(bytes.begin(), bytes.end()));
      opts.setTimeout(t);
      gloo::allgatherv(opts);
    });
  }

  void all_gather(const void* input, void* output, size_t bytes, milliseconds timeout) override {
    if (bytes == 0) return;
    run("all_gather", timeout, [&](milliseconds t) {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(static_cast<char*>(const_cast<void*>(input)), bytes);
      opts.setOutput(static_cast<char*>(output), bytes * static_cast<size_t>(size_));
      opts.setTimeout(t);
      gloo::allgather(opts);
    });
  }

  void all_to_all(const void* input, void* output, size_t bytes, milliseconds timeout) override {
    if (bytes == 0) return;
    all_to_all_impl("all_to_all", input, output, bytes, timeout);
  }

  void all_to_allv(const void* input, std::span<const size_t> send_bytes, void* output,
                   std::span<const size_t> recv_bytes, milliseconds timeout) override {
    if (send_bytes.size() != static_cast<size_t>(size_) ||
        recv_bytes.size() != static_cast<size_t>(size_)) {
      throw CommError(CommError::Kind::usage,
                      describe_call("all_to_allv", *this) + ": got " +
                          std::to_string(send_bytes.size()) + " send and " +
                          std::to_string(recv_bytes.size()) + " receive counts; pass one per rank",
                      "all_to_allv");
    }
    std::vector<int64_t> send(send_bytes.begin(), send_bytes.end());
    std::vector<int64_t> recv(recv_bytes.begin(), recv_bytes.end());
    char dummy = 0;  // Gloo wants a pointer even for an empty side
    char* in = input ? static_cast<char*>(const_cast<void*>(input)) : &dummy;
    char* out = output ? static_cast<char*>(output) : &dummy;
    run("all_to_allv", timeout, [&](milliseconds t) {
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(in, send);
      opts.setOutput(out, recv);
      opts.setTimeout(t);
      gloo::alltoallv(opts);
    });
  }

  void send(const void* data, size_t bytes, int peer, uint32_t tag, milliseconds timeout) override {
    check_peer("send", *this, peer);
    if (bytes == 0) return;
    run(
        "send", timeout,
        [&](milliseconds t) {
          auto buffer = context_->createUnboundBuffer(const_cast<void*>(data), bytes);
          buffer->send(peer, gloo::Slot::build(kSendRecvSlotPrefix, tag));
          if (!buffer->waitSend(t)) throw gloo::IoException("send aborted");
        },
        peer);
  }

  // Posted and returned: Gloo's unbound buffer sends while the caller goes on; the handle waits.
  std::unique_ptr<PendingSend> isend(const void* data, size_t bytes, int peer, uint32_t tag,
                                     milliseconds timeout) override {
    check_peer("isend", *this, peer);
    auto pending = std::make_unique<GlooSend>(*this, peer, timeout);
    if (bytes == 0) return pending;
    run(
        "isend", timeout,
        [&](milliseconds) {
          pending->buffer = context_->createUnboundBuffer(const_cast<void*>(data), bytes);
          pending->buffer->send(peer, gloo::Slot::build(kSendRecvSlotPrefix, tag));
        },
        peer);
    return pending;
  }

  void recv(void* data, size_t bytes, int peer, uint32_t tag, milliseconds timeout) override {
    check_peer("recv", *this, peer);
    if (bytes == 0) return;
    run(
        "recv", timeout,
        [&](milliseconds t) {
          auto buffer = context_->createUnboundBuffer(data, bytes);
          buffer->recv(peer, gloo::Slot::build(kSendRecvSlotPrefix, tag));
          if (!buffer->waitRecv(t)) throw gloo::IoException("recv aborted");
        },
        peer);
  }

  void broadcast(void* data, size_t bytes, int root, milliseconds timeout) override {
    check_peer("broadcast", *this, root, /*self_ok=*/true);
    if (bytes == 0) return;
    run("broadcast", timeout, [&](milliseconds t) {
      gloo::BroadcastOptions opts(context_);
      if (rank_ == root) opts.setInput(static_cast<char*>(data), bytes);
      opts.setOutput(static_cast<char*>(data), bytes);
      opts.setRoot(root);
      opts.setTimeout(t);
      gloo::broadcast(opts);
    });
  }

  void barrier(milliseconds timeout) override {
    run("barrier", timeout, [&](milliseconds t) {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(t);
      gloo::barrier(opts);
    });
  }

 private:
  void all_to_all_impl(const char* op, const void* input, void* output, size_t bytes,
                       milliseconds timeout) {
    run(op, timeout, [&](milliseconds t) {
      gloo::AlltoallOptions opts(context_);
      const size_t total = bytes * static_cast<size_t>(size_);
      opts.setInput(static_cast<char*>(const_cast<void*>(input)), total);
      opts.setOutput(static_cast<char*>(output), total);
      opts.setTimeout(t);
      gloo::alltoall(opts);
    });
  }

  // A receive buffer kept between calls: a fresh multi-megabyte vector per call would be a new
  // mmap, and faulting its pages in costs about as much as sending them over loopback.
  char* scratch(size_t bytes) {
    if (scratch_.size() < bytes) {
      scratch_.clear();
      scratch_.shrink_to_fit();
      scratch_.resize(bytes);
      scratch_bytes_ = bytes;
    }
    return scratch_.data();
  }

 public:
  size_t buffer_bytes() const override { return scratch_bytes_; }

 private:
  using ReduceFn = void (*)(void*, const void*, const void*, size_t);

  // data[count] (f32 or f64) <- the ranks' values folded with f32_fn / f64_fn, on Gloo's ring.
  void ring_all_reduce(const char* op, void* data, size_t count, DType dtype, milliseconds timeout,
                       ReduceFn f32_fn, ReduceFn f64_fn) {
    run(op, timeout, [&](milliseconds t) {
      gloo::AllreduceOptions opts(context_);
      if (dtype == DType::f32) {
        opts.setOutput(static_cast<float*>(data), count);
        opts.setReduceFunction(f32_fn);
      } else {
        opts.setOutput(static_cast<double*>(data), count);
        opts.setReduceFunction(f64_fn);
      }
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setTimeout(t);
      gloo::allreduce(opts);
    });
  }

  // An isend's handle: waits for its buffer as send would, once.
  struct GlooSend final : PendingSend {
    GlooSend(GlooCommunicator& owner, int peer, milliseconds timeout)
        : owner(owner), peer(peer), timeout(timeout) {}
    ~GlooSend() override {
      try {
        wait();
      } catch (const std::exception&) {  // the group is broken; its next call says so
      }
    }
    void wait() override {
      if (!buffer) return;
      std::unique_ptr<gloo::transport::UnboundBuffer> posted = std::move(buffer);
      owner.run(
          "send", timeout,
          [&](milliseconds t) {
            if (!posted->waitSend(t)) throw gloo::IoException("send aborted");
          },
          peer);
    }
    GlooCommunicator& owner;
    int peer;
    milliseconds timeout;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  };

  // Runs one Gloo call; turns any Gloo failure into a CommError that names the peer when it can.
  template <class Call>
  void run(const char* op, milliseconds timeout, Call&& call, int hinted_peer = -1) {
    if (broken_) {
      throw CommError(CommError::Kind::io,
                      describe_call(op, *this) + ": this group is broken by an earlier failure (" +
                          broken_reason_ + "); stop and restart the job",
                      op);
    }
    const milliseconds t = timeout.count() > 0 ? timeout : timeout_;
    try {
      call(t);
    } catch (const gloo::Exception& error) {
      broken_ = true;
      throw diagnose(op, t, error.what(), hinted_peer);
    } catch (const std::exception& error) {  // GLOO_ENFORCE and friends
      broken_ = true;
      throw diagnose(op, t, error.what(), hinted_peer);
    }
  }

  // Which peer failed? Gloo names peers by socket address at best (and not at all on a timeout),
  // so ask the process table about the members on this host; else the peer a send/recv named.
  CommError diagnose(const char* op, milliseconds t, const std::string& what, int hinted_peer) {
    const bool timed_out =
        what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
    // The process table: a dead or stopped local peer is the most useful thing to name.
    std::vector<std::pair<int, detail::PeerState>> suspects;
    bool local_alive = false;  // a member on this host that still looks alive
    const auto survey = [&] {
      suspects.clear();
      local_alive = false;
      for (int r = 0; r < size_; ++r) {
        if (r == rank_ || static_cast<size_t>(r) >= peers_.size()) continue;
        const detail::PeerState s = detail::probe(peers_[static_cast<size_t>(r)]);
        if (s == detail::PeerState::gone || s == detail::PeerState::stopped)
          suspects.emplace_back(r, s);
        local_alive = local_alive || s == detail::PeerState::alive;
      }
    };
    survey();
    // A killed process closes its sockets before it becomes a zombie, and on a loaded machine the
    // rest of its exit can lag the closed connection by many milliseconds: a survivor that looks
    // at once sees every peer alive. So on a closed connection, look again for up to a second.
    const auto any_gone = [&] {
      return std::any_of(suspects.begin(), suspects.end(),
                         [](const auto& s) { return s.second == detail::PeerState::gone; });
    };
    const auto settle = std::chrono::steady_clock::now() + kExitSettle;
    while (!timed_out && !any_gone() && local_alive && std::chrono::steady_clock::now() < settle) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      survey();
    }
    // The culprit: on a timeout a stopped peer (a peer that already exited may be another victim
    // that timed out first and gave up); on a closed connection a peer that is gone.
    const detail::PeerState culprit =
        timed_out ? detail::PeerState::stopped : detail::PeerState::gone;
    int peer = !suspects.empty() ? suspects.front().first : hinted_peer;
    // In a group of two there is one connection: whoever closed it is the other member.
    if (peer < 0 && size_ == 2) peer = 1 - rank_;
    for (const auto& [r, s] : suspects) {
      if (s == culprit) {
        peer = r;
        break;
      }
    }
    std::string message = describe_call(op, *this) + ": ";
    if (timed_out) {
      message += "timed out after " + std::to_string(t.count()) + " ms";
      if (suspects.empty() && peer >= 0)
        message += "; rank " + std::to_string(peer) + " did not answer";
    } else if (peer >= 0 && any_gone()) {
      message += "rank " + std::to_string(peer) + " is gone (connection closed)";
    } else if (peer >= 0) {  // named by the send/recv or as the only other member, not seen exit
      message += "rank " + std::to_string(peer) + " closed its connection";
    } else {
      message += "a peer closed its connection (Gloo names only its address)";
    }
    for (const auto& [r, s] : suspects) {
      if (!timed_out && r == peer && s == detail::PeerState::gone) continue;  // said already
      message += "; rank " + std::to_string(r) + " is " + detail::state_text(s);
    }
    message += " [gloo: " + what + "]";
    broken_reason_ = message;
    const auto kind = timed_out   ? CommError::Kind::timeout
                      : peer >= 0 ? CommError::Kind::peer_gone
                                  : CommError::Kind::io;
    return CommError(kind, message, op, peer);
  }

  std::string name_;
  int rank_;
  int size_;
  milliseconds timeout_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::vector<detail::PeerInfo> peers_;
  bool broken_ = false;
  std::string broken_reason_;
  std::vector<char> scratch_;
  std::atomic<size_t> scratch_bytes_{0};  // scratch_.size(), for buffer_bytes on any thread
};

// Names the members that never published their peer key: the ranks that "have not arrived".
std::string missing_ranks(comm::Store& store, int size) {
  std::string list;
  for (int r = 0; r < size; ++r)
    if (!store.try_get(peer_key(r))) list += (list.empty() ? "" : ", ") + std::to_string(r);
  return list;
}

}  // namespace

std::unique_ptr<Communicator> create_gloo_communicator(Store& store, const GroupOptions& options) {
  const std::string where = "rendezvous of group " + options.name + " (" +
                            std::to_string(options.size) + " ranks, this is rank " +
                            std::to_string(options.rank) + ")";
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    throw CommError(CommError::Kind::usage,
                    where + ": rank must be in 0.." + std::to_string(options.size - 1),
                    "rendezvous");
  }
  if (options.timeout.count() <= 0) {
    throw CommError(CommError::Kind::usage, where + ": timeout must be positive", "rendezvous");
  }
  if (options.size == 1) return create_local_communicator(options.name, options.timeout);

  std::shared_ptr<GlooDevice> device = options.device ? options.device : make_gloo_device();
  store.set(peer_key(options.rank), detail::encode(detail::this_process()));
  auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
  context->setTimeout(options.timeout);
  GlooStoreAdapter adapter(store, options.timeout);
  try {
    context->connectFullMesh(adapter, device->device);
  } catch (const CommError& error) {
    if (error.kind() != CommError::Kind::timeout) throw;
    const std::string missing = missing_ranks(store, options.size);
    throw CommError(CommError::Kind::timeout,
                    where + ": " +
                        (missing.empty() ? std::string("peers did not connect")
                                         : "rank(s) " + missing + " have not arrived") +
                        " within " + std::to_string(options.timeout.count()) + " ms in " +
                        store.describe() +
                        "; check that every rank started, with the same job id and restart count",
                    "rendezvous");
  } catch (const std::exception& error) {
    throw CommError(CommError::Kind::io, where + ": " + error.what(), "rendezvous");
  }
  std::vector<detail::PeerInfo> peers(static_cast<size_t>(options.size));
  for (int r = 0; r < options.size; ++r) {
    if (auto text = store.try_get(peer_key(r)))
      peers[static_cast<size_t>(r)] = detail::decode_peer(*text);
  }
  return std::make_unique<GlooCommunicator>(options, std::move(context), std::move(peers));
}

}  // namespace trainctl::comm
