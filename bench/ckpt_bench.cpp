// Checkpoint I/O against the disk's own speed, measured in the same run on the same directory:
//   plain  write(2) of the same bytes into one file + fsync; read(2) of it back
//   ckpt   ckpt::save (shard + manifest + fsyncs + rename) and CheckpointReader::read of every
//          tensor (checksums checked) into the caller's buffers
//   stall  the time CheckpointWriter::save (async) blocks its caller, copy into the SaveRequest
//          included, as a fraction of a synchronous save of the same request
// The state is a GPT-like model of about 1 GB: bf16 weights, fp32 master weights and both AdamW
// moments (14 bytes per parameter), random bytes, realistic tensor shapes. Before each read the
// page cache is dropped (echo 3 > /proc/sys/vm/drop_caches) when allowed; the table says whether
// it was, and when not both sides read from the page cache.
//
//   ckpt_bench [--dir DIR] [--hidden H] [--layers L] [--vocab V] [--repeat N]
//
// Defaults: DIR ./ckpt-bench.tmp (removed at the end), hidden 768, 6 layers, vocab 50257
// (81 M parameters, 1.14 GB of state), 3 repetitions (the best of each is reported).
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
  int repeat = 3;
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

ckpt::SaveRequest request_of(const std::vector<Tensor>& state, int64_t step) {
  ckpt::SaveRequest r;
  r.header.step = step;
  r.header.recipe_hash = "bench";
  for (const Tensor& t : state)
    r.add(t.name, t.dtype, t.shape, {}, t.bytes.data());
  return r;
}

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

  double best_plain_w = 1e30, best_plain_r = 1e30, best_save = 1e30, best_load = 1e30;
  double best_stall = 1e30, best_sync = 1e30, best_copy = 1e30;
  bool cold = true;
  int64_t step = 0;
  for (int rep = 0; rep < o.repeat; ++rep) {
    // (a) plain sequential write + fsync, read back.
    const std::string plain = (dir / "plain.bin").string();
    best_plain_w = std::min(best_plain_w, plain_write(state, plain));
    cold = drop_caches() && cold;
    best_plain_r = std::min(best_plain_r, plain_read(back, plain));
    fs::remove(plain);

    // (b) ckpt::save of the caller's buffers (no copy), then a full read.
    const auto slices = slices_of(state);
    ckpt::ManifestHeader header;
    header.step = ++step;
    header.recipe_hash = "bench";
    auto start = Clock::now();
    const fs::path saved = ckpt::save(dir / "ckpts", header, slices).path;
    best_save = std::min(best_save, seconds_since(start));
    cold = drop_caches() && cold;
    best_load = std::min(best_load, ckpt_read(back, saved));
    for (size_t i = 0; i < state.size(); ++i)
      check(back[i].bytes == state[i].bytes, "read back differs: " + state[i].name);
    fs::remove_all(saved);

    // (c) the caller's view: sync save (copy + write) vs async save (copy + hand-off).
    {
      ckpt::CheckpointWriter sync_writer(dir / "ckpts", {.async = false, .keep_last = 1});
      start = Clock::now();
      sync_writer.save(request_of(state, ++step));
      best_sync = std::min(best_sync, seconds_since(start));
    }
    {
      {
        start = Clock::now();
        const ckpt::SaveRequest copy_only = request_of(state, 0);
        best_copy = std::min(best_copy, seconds_since(start));
      }
      ckpt::CheckpointWriter async_writer(dir / "ckpts", {.async = true, .keep_last = 1});
      start = Clock::now();
      ckpt::SaveRequest timed = request_of(state, ++step);
      async_writer.save(std::move(timed));
      best_stall = std::min(best_stall, seconds_since(start));
      async_writer.wait();
    }
    fs::remove_all(dir / "ckpts");
  }
  fs::remove_all(dir);

  auto rate = [&](double s) { return gb / s; };
  fmt::print("\nreads: {}\n", cold ? "page cache dropped before each read (cold)"
                                   : "FROM THE PAGE CACHE (drop_caches refused) for both sides");
  fmt::print("| operation | plain s | plain GB/s | ckpt s | ckpt GB/s | ckpt/plain |\n");
  fmt::print("|---|---|---|---|---|---|\n");
  fmt::print("| write + fsync | {:.3f} | {:.2f} | {:.3f} | {:.2f} | {:.2f} |\n", best_plain_w,
             rate(best_plain_w), best_save, rate(best_save), best_plain_w / best_save);
  fmt::print("| read | {:.3f} | {:.2f} | {:.3f} | {:.2f} | {:.2f} |\n", best_plain_r,
             rate(best_plain_r), best_load, rate(best_load), best_plain_r / best_load);
  fmt::print("\n| async save | seconds |\n|---|---|\n");
  fmt::print("| SaveRequest copy alone | {:.3f} |\n", best_copy);
  fmt::print("| synchronous save (copy + write) | {:.3f} |\n", best_sync);
  fmt::print("| async save: caller blocked (copy + hand-off) | {:.3f} |\n", best_stall);
  fmt::print("| stall / synchronous save | {:.1f}% |\n", 100.0 * best_stall / best_sync);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ckpt_bench: error: %s\n", e.what());
  return 1;
}
