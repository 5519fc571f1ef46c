// Checkpoint I/O against the disk's own speed, measured in the same run on the same directory:
//   plain  write(2) of the same bytes into one file + fsync; read(2) of it back
//   ckpt   ckpt::save (shard + manifest + fsyncs + rename) and CheckpointReader::read of every
//          tensor (checksums checked) into the caller's buffers
//   stall  the time an async save blocks its caller: CheckpointWriter::new_request, the copy of
//          every tensor into it and save() (exactly what the session times), as a fraction of a
//          synchronous save of the same state. The first save maps and faults its host memory;
//          later ones reuse it, so the two are reported apart. These run after the I/O part,
//          without dropping caches, as saves in a training run do; repeat + 1 saves each.
// The state is a GPT-like model of about 1 GB: bf16 weights, fp32 master weights and both AdamW
// moments (14 bytes per parameter), random bytes, realistic tensor shapes. Before each read the
// page cache is dropped (echo 3 > /proc/sys/vm/drop_caches) when allowed; the table says whether
// it was, and when not both sides read from the page cache.
//
//   ckpt_bench [--dir DIR] [--hidden H] [--layers L] [--vocab V] [--repeat N]
//
// Defaults: DIR ./ckpt-bench.tmp (removed at the end), hidden 768, 6 layers, vocab 50257
// (81 M parameters, 1.15 GB of state), 5 repetitions (best and median of each are reported;
// the disk is shared, so single runs are noisy).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ckpt/ckpt.hpp"

namespace {

using namespace trainctl;
using ckpt::DType;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string dir = "ckpt-bench.tmp";
  int64_t hidden = 768;
  int64_t layers = 6;
  int64_t vocab = 50257;
  int repeat = 5;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", flag));
    const char* value = argv[++i];
    auto number = [&] {
      const long long v = std::atoll(value);
      if (v < 1)
        throw std::invalid_argument(
            fmt::format("{} needs a positive integer, got '{}'", flag, value));
      return v;
    };
    if (flag == "--dir")
      o.dir = value;
    else if (flag == "--hidden")
      o.hidden = number();
    else if (flag == "--layers")
      o.layers = number();
    else if (flag == "--vocab")
      o.vocab = number();
    else if (flag == "--repeat")
      o.repeat = static_cast<int>(number());
    else
      throw std::invalid_argument(fmt::format(
          "unknown flag {} (ckpt_bench [--dir DIR] [--hidden H] [--layers L] [--vocab V] "
          "[--repeat N])",
          flag));
  }
  return o;
}

// One tensor of the state and its bytes (random, so nothing in the path can shortcut zeros).
struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<char> bytes;
};

std::vector<Tensor> make_state(const Options& o) {
  const int64_t h = o.hidden;
  std::vector<std::pair<std::string, std::vector<int64_t>>> params = {{"embed.wte", {o.vocab, h}},
                                                                      {"embed.wpe", {1024, h}}};
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    params.push_back({p + "ln1.weight", {h}});
    params.push_back({p + "attn.qkv", {3 * h, h}});
    params.push_back({p + "attn.proj", {h, h}});
    params.push_back({p + "ln2.weight", {h}});
    params.push_back({p + "mlp.fc", {4 * h, h}});
    params.push_back({p + "mlp.proj", {h, 4 * h}});
  }
  params.push_back({"ln_f.weight", {h}});
  std::vector<Tensor> state;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (const auto& [prefix, dtype] : {std::pair{"model/", DType::bf16},
                                      {"master/", DType::f32},
                                      {"adam_m/", DType::f32},
                                      {"adam_v/", DType::f32}}) {
    for (const auto& [name, shape] : params) {
      size_t bytes = tensor::dtype_size(dtype);
      for (int64_t d : shape)
        bytes *= static_cast<size_t>(d);
      Tensor t{prefix + name, dtype, shape, std::vector<char>(bytes)};
      for (size_t i = 0; i + 8 <= bytes; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        std::memcpy(t.bytes.data() + i, &x, 8);
      }
      state.push_back(std::move(t));
    }
  }
  return state;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool drop_caches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "3\n";
  f.flush();
  return static_cast<bool>(f);
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

double plain_write(const std::vector<Tensor>& state, const std::string& path) {
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  check(fd >= 0, "cannot create " + path);
  for (const Tensor& t : state)
    for (size_t done = 0; done < t.bytes.size();) {
      const ssize_t n = ::write(fd, t.bytes.data() + done, t.bytes.size() - done);
      check(n > 0, "write failed: " + path);
      done += static_cast<size_t>(n);
    }
  check(::fsync(fd) == 0 && ::close(fd) == 0, "fsync failed: " + path);
  return seconds_since(start);
}

double plain_read(std::vector<Tensor>& into, const std::string& path) {
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd >= 0, "cannot open " + path);
  for (Tensor& t : into)
    for (size_t done = 0; done < t.bytes.size();) {
      const ssize_t n = ::read(fd, t.bytes.data() + done, t.bytes.size() - done);
      check(n > 0, "read failed: " + path);
      done += static_cast<size_t>(n);
    }
  ::close(fd);
  return seconds_since(start);
}

std::vector<ckpt::SliceData> slices_of(const std::vector<Tensor>& state) {
  std::vector<ckpt::SliceData> slices;
  for (const Tensor& t : state)
    slices.push_back({t.name, t.dtype, t.shape, {}, t.bytes.data()});
  return slices;
}

// What the session does at a save (train::capture_checkpoint, then CheckpointWriter::save): a
// request from the writer (its memory recycled from the last finished save), one copy per tensor.
void capture_and_save(ckpt::CheckpointWriter& writer, const std::vector<Tensor>& state,
                      int64_t step) {
  ckpt::SaveRequest r = writer.new_request();
  r.header.step = step;
  r.header.recipe_hash = "bench";
  for (const Tensor& t : state)
    r.add(t.name, t.dtype, t.shape, {}, t.bytes.data());
  writer.save(std::move(r));
}

struct Samples {
  std::vector<double> values;
  void add(double v) { values.push_back(v); }
  double best() const { return *std::min_element(values.begin(), values.end()); }
  double median() const {
    std::vector<double> v = values;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  }
};

double ckpt_read(std::vector<Tensor>& into, const ckpt::fs::path& step_dir) {
  const auto start = Clock::now();
  const auto reader = ckpt::CheckpointReader::open(step_dir);
  for (Tensor& t : into)
    reader.read(t.name, t.dtype, t.bytes.data());
  return seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  namespace fs = ckpt::fs;
  const fs::path dir = fs::absolute(o.dir);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<Tensor> state = make_state(o);
  std::vector<Tensor> back = state;  // destination buffers, touched once already
  uint64_t bytes = 0;
  for (const Tensor& t : state)
    bytes += t.bytes.size();
  const double gb = static_cast<double>(bytes) / 1e9;
  fmt::print("state: {} tensors, {:.3f} GB (hidden {}, {} layers, vocab {}), dir {}\n",
             state.size(), gb, o.hidden, o.layers, o.vocab, dir.string());

  Samples plain_w, plain_r, save_s, load_s, sync_s, stall_steady;
  double stall_first = 0, sync_first = 0;
  bool cold = true;
  int64_t step = 0;
  const fs::path ckpts = dir / "ckpts";
  for (int rep = 0; rep < o.repeat; ++rep) {
    // (a) plain sequential write + fsync, read back.
    const std::string plain = (dir / "plain.bin").string();
    plain_w.add(plain_write(state, plain));
    cold = drop_caches() && cold;
    plain_r.add(plain_read(back, plain));
    fs::remove(plain);

    // (b) ckpt::save of the caller's buffers (no copy), then a full read.
    const auto slices = slices_of(state);
    ckpt::ManifestHeader header;
    header.step = ++step;
    header.recipe_hash = "bench";
    const auto start = Clock::now();
    const fs::path saved = ckpt::save(ckpts, header, slices).path;
    save_s.add(seconds_since(start));
    cold = drop_caches() && cold;
    load_s.add(ckpt_read(back, saved));
    for (size_t i = 0; i < state.size(); ++i)
      check(back[i].bytes == state[i].bytes, "read back differs: " + state[i].name);
    fs::remove_all(saved);
  }
  {
    // (c) the caller's view, as in a run (no cache dropping here): long-lived writers whose first
    // save maps and faults its host memory and whose later saves reuse it. A synchronous save
    // (capture + write) against an async one, where the caller is blocked for capture +
    // hand-off only (what the session reports as the stall).
    ckpt::CheckpointWriter sync_writer(ckpts, {.async = false, .keep_last = 1});
    ckpt::CheckpointWriter async_writer(ckpts, {.async = true, .keep_last = 1});
    for (int rep = 0; rep <= o.repeat; ++rep) {
      auto start = Clock::now();
      capture_and_save(async_writer, state, ++step);
      const double stall = seconds_since(start);
      async_writer.wait();
      start = Clock::now();
      capture_and_save(sync_writer, state, ++step);
      const double sync = seconds_since(start);
      if (rep == 0) {
        stall_first = stall;
        sync_first = sync;
      } else {
        stall_steady.add(stall);
        sync_s.add(sync);
      }
    }
  }
  fs::remove_all(dir);

  auto rate = [&](double s) { return gb / s; };
  fmt::print("\nreads: {}\n", cold ? "page cache dropped before each read (cold)"
                                   : "FROM THE PAGE CACHE (drop_caches refused) for both sides");
  fmt::print("{} repetitions; best (median) of each\n", o.repeat);
  fmt::print("| operation | plain s | plain GB/s | ckpt s | ckpt GB/s | ckpt/plain |\n");
  fmt::print("|---|---|---|---|---|---|\n");
  auto row = [&](const char* what, const Samples& plain, const Samples& ours) {
    fmt::print("| {} | {:.3f} ({:.3f}) | {:.2f} | {:.3f} ({:.3f}) | {:.2f} | {:.2f} ({:.2f}) |\n",
               what, plain.best(), plain.median(), rate(plain.best()), ours.best(), ours.median(),
               rate(ours.best()), plain.best() / ours.best(), plain.median() / ours.median());
  };
  row("write + fsync", plain_w, save_s);
  row("read", plain_r, load_s);
  fmt::print("\n| async save (caller's view) | best s | median s | / sync save (median) |\n");
  fmt::print("|---|---|---|---|\n");
  fmt::print("| synchronous save (capture + write), memory warm | {:.3f} | {:.3f} | 100% |\n",
             sync_s.best(), sync_s.median());
  fmt::print("| synchronous save, first of its writer (maps memory) | {:.3f} | - | - |\n",
             sync_first);
  fmt::print("| async, first save: capture + hand-off (maps memory) | {:.3f} | - | {:.1f}% |\n",
             stall_first, 100.0 * stall_first / sync_s.median());
  fmt::print("| async, later saves: capture + hand-off | {:.3f} | {:.3f} | {:.1f}% |\n",
             stall_steady.best(), stall_steady.median(),
             100.0 * stall_steady.median() / sync_s.median());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ckpt_bench: error: %s\n", e.what());
  return 1;
}
