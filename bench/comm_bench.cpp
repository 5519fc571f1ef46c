// Collective speed of our Communicator against bare Gloo, measured in the same run, on the same
// kind of transport (a Gloo TCP device on 127.0.0.1 per process) and the same buffers sizes:
//   all_reduce      ours: Mesh::dp().all_reduce_sum (the timed decorator + GlooCommunicator, as
//                   the trainer calls it); bare: gloo::allreduce with Gloo's default algorithm
//                   and gloo::sum<float>, on its own context, device and file store
//   all_gather      ours: all_gather of size/N floats per rank; bare: gloo::allgather
//   reduce_scatter  ours only (Gloo has no new-style reduce_scatter to compare with)
// N ranks are forked before any Gloo device exists. For each size, batches of calls alternate
// between ours and bare (the order flips every round so drift favours neither); a batch's time
// is the slowest rank's; the best and the median batch over --repeat rounds are reported per call
// (on a shared machine the best is the figure least disturbed by other processes). Bandwidths
// follow the NCCL-tests convention: algbw = bytes / time with bytes the full buffer (all_reduce)
// or the full gathered/scattered buffer; busbw = algbw * 2(N-1)/N for all_reduce and
// algbw * (N-1)/N for all_gather and reduce_scatter (from the best time). ratio = bare time /
// ours time = ours busbw / bare busbw.
// Before timing, one all_reduce of non-zero values by each side must give identical bytes
// (both are Gloo's ring with the same element order); timing then runs on zeros so repeated
// in-place sums never overflow.
//
//   comm_bench [--ranks N] [--sizes 1K,16K,1M,...] [--repeat R] [--dir DIR]
//
// Defaults: 2 ranks, sizes (floats) 1K 4K 16K 64K 256K 1M 4M 16M, 7 rounds, DIR a fresh folder
// under /tmp (removed at the end).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "comm/comm.hpp"

namespace {

using namespace trainctl;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct Options {
  int ranks = 2;
  std::vector<size_t> sizes = {1 << 10, 1 << 12, 1 << 14, 1 << 16,
                               1 << 18, 1 << 20, 1 << 22, 1 << 24};
  int repeat = 7;
  std::string dir;
};

size_t parse_size(const std::string& text) {
  size_t end = 0;
  const unsigned long long value = std::stoull(text, &end);
  const std::string suffix = text.substr(end);
  if (suffix.empty()) return value;
  if (suffix == "K" || suffix == "k") return value << 10;
  if (suffix == "M" || suffix == "m") return value << 20;
  throw std::invalid_argument(
      fmt::format("--sizes: '{}' is not a count of floats (use 4096, 4K or 16M)", text));
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", flag));
    const std::string value = argv[++i];
    if (flag == "--ranks") {
      o.ranks = std::atoi(value.c_str());
      if (o.ranks < 2) throw std::invalid_argument("--ranks must be at least 2");
    } else if (flag == "--repeat") {
      o.repeat = std::atoi(value.c_str());
      if (o.repeat < 1) throw std::invalid_argument("--repeat must be at least 1");
    } else if (flag == "--sizes") {
      o.sizes.clear();
      size_t start = 0;
      while (start <= value.size()) {
        const size_t comma = std::min(value.find(',', start), value.size());
        o.sizes.push_back(parse_size(value.substr(start, comma - start)));
        start = comma + 1;
      }
    } else if (flag == "--dir") {
      o.dir = value;
    } else {
      throw std::invalid_argument(fmt::format(
          "unknown option {}; use --ranks N, --sizes LIST, --repeat R, --dir DIR", flag));
    }
  }
  return o;
}

// Gloo with nothing of ours in between: its own file store, TCP device and context.
std::shared_ptr<gloo::Context> bare_context(const std::string& dir, int rank, int size) {
  fs::create_directories(dir);
  gloo::rendezvous::FileStore file_store(dir);
  gloo::rendezvous::PrefixStore store("bare", file_store);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(std::chrono::seconds(60));
  context->connectFullMesh(store, device);
  return context;
}

void bare_all_reduce(const std::shared_ptr<gloo::Context>& context, float* data, size_t count) {
  gloo::AllreduceOptions opts(context);
  opts.setOutput(data, count);
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  gloo::allreduce(opts);
}

void bare_all_gather(const std::shared_ptr<gloo::Context>& context, const float* input,
                     float* output, size_t count) {
  gloo::AllgatherOptions opts(context);
  opts.setInput(const_cast<float*>(input), count);
  opts.setOutput(output, count * static_cast<size_t>(context->size));
  gloo::allgather(opts);
}

// Calls per batch: about 4 MiB moved per batch, between 1 and 50 calls (small messages are
// latency-bound, and on a loaded machine each call can cost a scheduler slice).
int calls_per_batch(size_t floats) {
  return static_cast<int>(std::clamp<size_t>((size_t{1} << 20) / floats, 1, 50));
}

struct Row {
  std::string op;
  size_t floats = 0;
  // Seconds per call, best and median over the rounds; bare 0: no bare counterpart.
  double ours_best = 0, ours_median = 0, bare_best = 0, bare_median = 0;
  bool identical = true;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double best(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end());
}

// One rank's whole benchmark; rank 0 returns the rows, the others an empty list.
std::vector<Row> run_rank(const Options& o, int rank) {
  const int n = o.ranks;
  comm::FileStore store(o.dir + "/ours");
  comm::Mesh mesh = comm::Mesh::create(store, n, rank, comm::Layout{.dp = n},
                                       comm::MeshOptions{.timeout = std::chrono::seconds(60)});
  comm::Communicator& ours = mesh.dp();
  const auto bare = bare_context(o.dir + "/bare", rank, n);

  // The slowest rank's time for `calls` calls of `body`, after a barrier.
  auto batch = [&](int calls, const std::function<void()>& body) {
    mesh.world().barrier();
    const auto start = Clock::now();
    for (int c = 0; c < calls; ++c)
      body();
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::vector<double> all(static_cast<size_t>(n));
    mesh.world().all_gather(&seconds, all.data(), sizeof(double));
    return *std::max_element(all.begin(), all.end()) / calls;
  };
  // Rounds of (ours, bare) batches, the order flipped every round.
  auto compare = [&](int calls, const std::function<void()>& ours_call,
                     const std::function<void()>& bare_call, Row& row) {
    ours_call();  // warm-up: connections, buffers, page faults
    if (bare_call) bare_call();
    std::vector<double> ours_s, bare_s;
    for (int round = 0; round < o.repeat; ++round) {
      if (bare_call && round % 2 == 1) bare_s.push_back(batch(calls, bare_call));
      ours_s.push_back(batch(calls, ours_call));
      if (bare_call && round % 2 == 0) bare_s.push_back(batch(calls, bare_call));
    }
    row.ours_best = best(ours_s);
    row.ours_median = median(ours_s);
    if (bare_call) {
      row.bare_best = best(bare_s);
      row.bare_median = median(bare_s);
    }
  };

  std::vector<Row> rows;
  for (size_t requested : o.sizes) {
    const size_t floats = std::max<size_t>(requested / static_cast<size_t>(n), 1) * n;
    const size_t part = floats / static_cast<size_t>(n);
    const int calls = calls_per_batch(floats);
    std::vector<float> a(floats), b(floats), gathered(floats), scattered(part);

    Row reduce{.op = "all_reduce", .floats = floats};
    for (size_t i = 0; i < floats; ++i)
      a[i] = b[i] =
          static_cast<float>((i * 2654435761u + static_cast<size_t>(rank) * 97) % 1000) / 997.0f;
    ours.all_reduce_sum(a.data(), floats, comm::DType::f32);
    bare_all_reduce(bare, b.data(), floats);
    reduce.identical = std::memcmp(a.data(), b.data(), floats * sizeof(float)) == 0;
    std::fill(a.begin(), a.end(), 0.0f);
    std::fill(b.begin(), b.end(), 0.0f);
    compare(
        calls, [&] { ours.all_reduce_sum(a.data(), floats, comm::DType::f32); },
        [&] { bare_all_reduce(bare, b.data(), floats); }, reduce);

    Row gather{.op = "all_gather", .floats = floats};
    compare(
        calls, [&] { ours.all_gather(a.data(), gathered.data(), part * sizeof(float)); },
        [&] { bare_all_gather(bare, b.data(), gathered.data(), part); }, gather);

    Row scatter{.op = "reduce_scatter", .floats = floats};
    compare(
        calls, [&] { ours.reduce_scatter_sum(a.data(), scattered.data(), part, comm::DType::f32); },
        nullptr, scatter);
    if (rank == 0) {
      rows.push_back(reduce);
      rows.push_back(gather);
      rows.push_back(scatter);
      std::fprintf(stderr, "comm_bench: %zu floats done\n", floats);
    }
  }
  mesh.world().barrier();
  return rows;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

std::string human(size_t bytes) {
  if (bytes >= (1u << 20)) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (1u << 10)) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

void print_table(std::FILE* out, const Options& o, const std::vector<Row>& rows) {
  const double n = o.ranks;
  fmt::print(out, "machine: {} cores ({}), {} ranks over 127.0.0.1, {} rounds\n",
             std::thread::hardware_concurrency(), cpu_model(), o.ranks, o.repeat);
  fmt::print(out,
             "| op | floats | bytes | ours us/call best (median) | bare us/call best (median) | "
             "ours busbw GB/s | bare busbw GB/s | ours/bare best (median) |\n");
  fmt::print(out, "|---|---|---|---|---|---|---|---|\n");
  for (const Row& row : rows) {
    const double bytes = static_cast<double>(row.floats) * sizeof(float);
    const double factor = row.op == "all_reduce" ? 2 * (n - 1) / n : (n - 1) / n;
    auto busbw = [&](double seconds) {
      return fmt::format("{:.3f}", bytes / seconds / 1e9 * factor);
    };
    auto us = [](double best_s, double median_s) {
      return fmt::format("{:.1f} ({:.1f})", best_s * 1e6, median_s * 1e6);
    };
    const bool bare = row.bare_best > 0;
    fmt::print(out, "| {}{} | {} | {} | {} | {} | {} | {} | {} |\n", row.op,
               row.identical ? "" : " (RESULT DIFFERS FROM BARE GLOO)", row.floats,
               human(row.floats * sizeof(float)), us(row.ours_best, row.ours_median),
               bare ? us(row.bare_best, row.bare_median) : "-", busbw(row.ours_best),
               bare ? busbw(row.bare_best) : "-",
               bare ? fmt::format("{:.2f} ({:.2f})", row.bare_best / row.ours_best,
                                  row.bare_median / row.ours_median)
                    : "-");
  }
}

}  // namespace

int main(int argc, char** argv) try {
  Options o = parse(argc, argv);
  const bool own_dir = o.dir.empty();
  if (own_dir) {
    char pattern[] = "/tmp/comm_bench_XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("cannot create a folder in /tmp");
    o.dir = pattern;
  }
  fs::create_directories(o.dir + "/ours");
  const std::string table = o.dir + "/table.md";
  std::fflush(nullptr);
  std::vector<pid_t> children;
  for (int rank = 0; rank < o.ranks; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      int code = 0;
      try {
        const std::vector<Row> rows = run_rank(o, rank);
        if (rank == 0) {
          std::FILE* out = std::fopen(table.c_str(), "w");
          if (out == nullptr) throw std::runtime_error("cannot write " + table);
          print_table(out, o, rows);
          std::fclose(out);
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "comm_bench: rank %d: %s\n", rank, e.what());
        code = 1;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  if (failed == 0) {
    std::ifstream in(table);
    std::fputs(std::string(std::istreambuf_iterator<char>(in), {}).c_str(), stdout);
  }
  if (own_dir) fs::remove_all(o.dir);
  if (failed > 0) throw std::runtime_error(fmt::format("{} rank(s) failed", failed));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "comm_bench: error: %s\n", e.what());
  return 1;
}
