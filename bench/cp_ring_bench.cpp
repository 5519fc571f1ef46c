// How much of the context-parallel ring's exchange hides behind attention on this CPU (issue 24's
// benchmark). Two ranks (cp2) run forward + backward of a model with long sequences. The cp
// group's key/value passes run two ways, in alternating rounds:
//   blocking    each pass before the block's attention (no background groups)
//   overlapped  the next block passes on a second cp group (Mesh::cp_bg) while attention
//               computes on the one held (the default, parallel.overlap_grad_sync)
// Per way it reports the median forward + backward time of the slower rank and the time the ring's
// passes held up the training thread (Transformer::ring_wait_seconds): in the blocking run every
// pass whole (the exchange's cost), in the overlapped run only what outlasted the attention beside
// it (the exposed exchange). hidden = 1 - exposed / blocking: the share of the exchange that
// overlapping hides. The step times are reported too, but on a shared 2-core machine they move by
// more than the exchange costs, so the waits, measured directly, are the figure to read. Each rank
// gets OPENBLAS_NUM_THREADS=1.
//
//   cp_ring_bench [--seq 4096] [--hidden 256] [--heads 4] [--layers 2] [--steps 6] [--rounds 3]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "comm/comm.hpp"
#include "model/model.hpp"

namespace {

using namespace trainctl;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct Options {
  int seq = 4096, hidden = 256, heads = 4, layers = 2, steps = 6, rounds = 3;
};

struct Timing {
  double step_s = 0;  // median forward + backward
  double wait_s = 0;  // per step: the ring's passes holding up the training thread
};

// One rank's run: `steps` forward + backward passes after one warm-up; writes its median step
// and comm seconds to `out`.
void run_rank(const Options& o, const std::string& dir, int rank, bool overlapped,
              const std::string& out) {
  comm::FileStore base(dir);
  comm::PrefixStore store = comm::job_store(base, overlapped ? "overlapped" : "blocking", 0);
  comm::Mesh mesh = comm::Mesh::create(
      store, 2, rank, comm::Layout{.cp = 2},
      comm::MeshOptions{.timeout = std::chrono::seconds(120), .background_groups = overlapped});
  model::ModelConfig c = model::llama_preset();
  c.layers = o.layers;
  c.hidden = o.hidden;
  c.heads = o.heads;
  c.kv_heads = o.heads;
  c.ffn_hidden = 2 * o.hidden;
  c.vocab = 256;
  c.seq_len = o.seq;
  c.storage = tensor::DType::f32;
  auto be = backend::make_cpu_backend();
  model::Transformer m(c, *be, 1, model::ModelParallel::from_mesh(mesh, 0));
  m.params().initialize(7);
  std::vector<int32_t> tokens(static_cast<size_t>(o.seq)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7919) % 256);
    targets[i] = static_cast<int32_t>((i * 104729 + 1) % 256);
  }
  std::vector<double> steps, waits;
  for (int s = 0; s <= o.steps; ++s) {
    mesh.world().barrier();
    const double wait_before = m.ring_wait_seconds();
    const auto start = Clock::now();
    m.forward(tokens.data(), targets.data());
    m.backward(1.0);
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    if (s == 0) continue;  // warm-up: first touch of the arena and the scratch
    steps.push_back(took);
    waits.push_back(m.ring_wait_seconds() - wait_before);
  }
  std::sort(steps.begin(), steps.end());
  std::sort(waits.begin(), waits.end());
  std::ofstream(out) << steps[steps.size() / 2] << " " << waits[waits.size() / 2] << "\n";
  mesh.world().barrier();
}

// Both ranks of one way; the slower rank's median step.
Timing run_way(const Options& o, bool overlapped) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("cp_ring_bench_{}", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<pid_t> children;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        run_rank(o, dir.string(), rank, overlapped, (dir / fmt::format("rank{}", rank)).string());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        code = 1;
      }
      std::_Exit(code);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("a rank failed");
  }
  Timing t;
  for (int rank = 0; rank < 2; ++rank) {
    Timing r;
    std::ifstream(dir / fmt::format("rank{}", rank)) >> r.step_s >> r.wait_s;
    t.step_s = std::max(t.step_s, r.step_s);
    t.wait_s = std::max(t.wait_s, r.wait_s);
  }
  fs::remove_all(dir);
  return t;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (key == "--seq")
      o.seq = value;
    else if (key == "--hidden")
      o.hidden = value;
    else if (key == "--heads")
      o.heads = value;
    else if (key == "--layers")
      o.layers = value;
    else if (key == "--steps")
      o.steps = value;
    else if (key == "--rounds")
      o.rounds = value;
    else
      throw std::invalid_argument("unknown option " + key);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    const Options o = parse(argc, argv);
    std::printf(
        "cp2, llama shape: seq %d, hidden %d, %d heads, %d layers, micro-batch 1, fp32; %d "
        "steps (median) per run, %d rounds alternating\n\n",
        o.seq, o.hidden, o.heads, o.layers, o.steps, o.rounds);
    std::printf(
        "| round | blocking: step ms | ring wait ms | overlapped: step ms | ring wait ms | hidden "
        "|\n");
    std::printf("|---|---|---|---|---|---|\n");
    for (int round = 0; round < o.rounds; ++round) {
      // Alternate which way runs first so drift favours neither.
      Timing blocking, overlapped;
      if (round % 2 == 0) {
        blocking = run_way(o, false);
        overlapped = run_way(o, true);
      } else {
        overlapped = run_way(o, true);
        blocking = run_way(o, false);
      }
      const double hidden = blocking.wait_s > 0 ? 1 - overlapped.wait_s / blocking.wait_s : 0;
      std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.0f%% |\n", round + 1, blocking.step_s * 1e3,
                  blocking.wait_s * 1e3, overlapped.step_s * 1e3, overlapped.wait_s * 1e3,
                  100 * hidden);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cp_ring_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
