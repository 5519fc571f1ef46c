// Mesh::comm_seconds: the wall time a rank spends inside its communicators' calls, counted once
// when calls on two threads overlap, and zero for one-rank groups (which only copy).
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "comm/comm.hpp"
#include "comm_test_util.hpp"

using namespace trainctl::comm;
using comm_test::expect;

namespace {

// Rank 1 arrives this many seconds after rank 0. The checks hold on a loaded machine: what a
// rank counts must fit inside the wall time it measured around its own calls (exact, whatever the
// load), and rank 0 must count at least half of kLate (it fails only if rank 0 lost the CPU for
// kLate / 2 between the barrier and its call).
constexpr double kLate = 0.6;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Mesh join(const std::string& dir, int rank) {
  FileStore store(dir);
  return Mesh::create(store, 2, rank, Layout{.dp = 2}, MeshOptions{.timeout = Milliseconds(10000)});
}

void sleep_seconds(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

}  // namespace

TEST_CASE("comm_seconds counts the time a rank waits inside a collective", "[comm][gloo]") {
  const comm_test::TempDir temp;
  const auto status = comm_test::run_ranks(2, [&](int rank) {
    Mesh mesh = join(temp.path, rank);
    mesh.world().barrier();
    const double before = mesh.comm_seconds();
    if (rank == 1) sleep_seconds(kLate);
    double value = 1;
    const auto start = std::chrono::steady_clock::now();
    mesh.dp().all_reduce_sum(&value, 1, DType::f64);
    const double wall = seconds_since(start);
    expect(value == 2, "sum");
    const double spent = mesh.comm_seconds() - before;
    expect(spent <= wall, "counted " + std::to_string(spent) + " s in a call that took " +
                              std::to_string(wall) + " s");
    if (rank == 0)
      expect(spent >= kLate / 2, "rank 0 waited " + std::to_string(spent) + " s for a rank " +
                                     std::to_string(kLate) + " s late");
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0});
}

TEST_CASE("comm_seconds counts overlapping calls on two threads once", "[comm][gloo]") {
  const comm_test::TempDir temp;
  const auto status = comm_test::run_ranks(2, [&](int rank) {
    Mesh mesh = join(temp.path, rank);
    mesh.world().barrier();
    const double before = mesh.comm_seconds();
    if (rank == 1) sleep_seconds(kLate);
    // Two different groups (world and dp), one per thread, both blocked on the late rank 1.
    double a = 1, b = 1;
    const auto start = std::chrono::steady_clock::now();
    std::thread other([&] { mesh.world().all_reduce_sum(&a, 1, DType::f64); });
    mesh.dp().all_reduce_sum(&b, 1, DType::f64);
    other.join();
    const double wall = seconds_since(start);
    expect(a == 2 && b == 2, "sums");
    const double spent = mesh.comm_seconds() - before;
    // Counted twice, the overlap would exceed the wall time around both calls.
    expect(spent <= wall, "overlapping calls counted " + std::to_string(spent) + " s in " +
                              std::to_string(wall) + " s of wall time");
    if (rank == 0)
      expect(spent >= kLate / 2, "rank 0 counted only " + std::to_string(spent) + " s");
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0});
}

TEST_CASE("comm_seconds stays zero for one-rank groups", "[comm]") {
  const comm_test::TempDir temp;
  FileStore store(temp.path);
  Mesh mesh = Mesh::create(store, 1, 0, Layout{});
  std::vector<float> data(1 << 20, 1.0f), out(1 << 20);
  for (int i = 0; i < 10; ++i) {
    mesh.dp().all_reduce_sum(std::span<float>(data));
    mesh.tp().reduce_scatter_sum(data.data(), out.data(), data.size(), DType::f32);
  }
  CHECK(mesh.comm_seconds() == 0.0);
}
