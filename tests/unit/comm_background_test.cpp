// BackgroundReducer: all_reduce and reduce_scatter_v on a worker thread with its own Gloo context,
// overlapping calls on the foreground context of the same members; results, order, wait timeouts
// and failures.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "comm/comm.hpp"
#include "comm_test_util.hpp"

using namespace trainctl::comm;
using comm_test::expect;
using comm_test::test_value;

namespace {

std::unique_ptr<Communicator> join(const std::string& dir, const std::string& name, int rank,
                                   int size) {
  FileStore base(dir);
  PrefixStore store(base, name + "/");
  return create_gloo_communicator(
      store, GroupOptions{.name = name, .rank = rank, .size = size, .timeout = Milliseconds(5000)});
}

std::vector<float> values(int rank, size_t count, uint64_t seed) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i)
    v[i] = static_cast<float>(test_value(rank, i, seed));
  return v;
}

}  // namespace

TEST_CASE("background all_reduces overlap foreground calls and match blocking ones",
          "[comm][gloo]") {
  const comm_test::TempDir temp;
  const auto status = comm_test::run_ranks(3, [&](int rank) {
    auto foreground = join(temp.path, "dp", rank, 3);
    BackgroundReducer reducer(join(temp.path, "dp_bg", rank, 3));
    const std::vector<size_t> sizes = {1, 1000, 300007, 0};
    std::vector<std::vector<float>> buckets;
    for (size_t count : sizes)
      buckets.push_back(values(rank, count, count + 1));
    std::vector<std::shared_ptr<Work>> works;
    for (auto& bucket : buckets)
      works.push_back(reducer.start_all_reduce_sum(bucket.data(), bucket.size(), DType::f32));
    // Foreground traffic on the same members while the background ones are in flight.
    std::vector<float> other = values(rank, 50000, 99);
    foreground->all_reduce_sum(std::span<float>(other));
    for (auto& work : works)
      work->wait();
    for (size_t b = 0; b < sizes.size(); ++b) {
      expect(works[b]->done(), "done after wait");
      std::vector<float> blocking = values(rank, sizes[b], sizes[b] + 1);
      foreground->all_reduce_sum(std::span<float>(blocking));
      expect(std::memcmp(blocking.data(), buckets[b].data(), sizes[b] * sizeof(float)) == 0,
             "background all_reduce of " + std::to_string(sizes[b]) +
                 " differs from the blocking one");
    }
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0, 0});
}

// The hand-off of a GPU's bucket: the buffer is written late (here by `ready` itself, standing
// for the device finishing its writes), and the sum must see the late values.
TEST_CASE("a background all_reduce runs its ready step on the worker, before the collective",
          "[comm][gloo]") {
  const comm_test::TempDir temp;
  const auto status = comm_test::run_ranks(2, [&](int rank) {
    BackgroundReducer reducer(join(temp.path, "dp_bg", rank, 2));
    const std::thread::id caller = std::this_thread::get_id();
    std::vector<double> bucket(4097, -1.0);  // what the sum would see without the ready step
    std::thread::id ran_on = caller;
    auto work = reducer.start_all_reduce_sum(bucket.data(), bucket.size(), DType::f64, [&] {
      ran_on = std::this_thread::get_id();
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * (rank + 1)));
      for (size_t i = 0; i < bucket.size(); ++i)
        bucket[i] = static_cast<double>(rank + 1) * static_cast<double>(i);
    });
    work->wait();
    expect(ran_on != caller, "ready ran on the worker thread, not on the caller's");
    for (size_t i = 0; i < bucket.size(); ++i)
      expect(bucket[i] == 3.0 * static_cast<double>(i),
             "element " + std::to_string(i) + " is " + std::to_string(bucket[i]) +
                 ": the sum did not see what ready wrote");
    // A ready step that fails fails its operation; the peer's then fails by timeout, so only one
    // rank's failure is shown here: rank 1 skips the collective too (both fail in ready).
    auto failed = reducer.start_all_reduce_sum(bucket.data(), bucket.size(), DType::f64,
                                               [] { throw std::runtime_error("device failed"); });
    bool threw = false;
    try {
      failed->wait();
    } catch (const std::runtime_error& e) {
      threw = std::string(e.what()) == "device failed";
    }
    expect(threw, "the ready step's exception is rethrown by wait");
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0});
}

// ZeRO-1's buckets: a reduce-scatter per bucket, cut from one buffer whose rank parts do not
// follow the bucket edges (counts of zero included), must give each rank exactly the bits of one
// blocking reduce_scatter_v of the whole buffer; the input is written late by `ready`. Then an
// all-gather per bucket of the reduced parts must rebuild the whole buffer, as one blocking
// all_gather_v does.
TEST_CASE("background reduce_scatter_v and all_gather_v of buckets equal one blocking call each",
          "[comm][gloo]") {
  const comm_test::TempDir temp;
  const auto status = comm_test::run_ranks(3, [&](int rank) {
    auto foreground = join(temp.path, "dp", rank, 3);
    BackgroundReducer reducer(join(temp.path, "dp_bg", rank, 3));
    const std::vector<size_t> parts = {7000, 1, 12999};  // rank r owns parts[r] elements
    const std::vector<size_t> bucket_edges = {0, 3000, 7001, 9000, 20000};
    const size_t total = bucket_edges.back();
    std::vector<float> grads(total, -1.0f);  // what the sums would see without the ready steps
    const size_t begin = rank == 0 ? 0 : rank == 1 ? parts[0] : parts[0] + parts[1];
    std::vector<float> background(parts[static_cast<size_t>(rank)], -7.0f);
    // Bucket b's elements in each rank's part, and where the bucket starts in this rank's part.
    auto counts_of = [&](size_t lo, size_t hi) {
      std::vector<size_t> counts;
      size_t owner_begin = 0;
      for (size_t part : parts) {
        const size_t from = std::max(lo, owner_begin), to = std::min(hi, owner_begin + part);
        counts.push_back(to > from ? to - from : 0);
        owner_begin += part;
      }
      return counts;
    };
    auto at_of = [&](size_t lo) {
      return std::clamp(lo, begin, begin + parts[static_cast<size_t>(rank)]) - begin;
    };
    std::vector<std::shared_ptr<Work>> works;
    for (size_t b = 0; b + 1 < bucket_edges.size(); ++b) {
      const size_t lo = bucket_edges[b], hi = bucket_edges[b + 1];
      const std::vector<size_t> counts = counts_of(lo, hi);
      const size_t at = at_of(lo);
      works.push_back(reducer.start_reduce_scatter_sum_v(
          grads.data() + lo, background.data() + at, counts, DType::f32, [&, lo, hi] {
            const std::vector<float> late = values(rank, total, 5);
            std::copy(late.begin() + static_cast<std::ptrdiff_t>(lo),
                      late.begin() + static_cast<std::ptrdiff_t>(hi),
                      grads.begin() + static_cast<std::ptrdiff_t>(lo));
          }));
    }
    for (auto& work : works)
      work->wait();
    const std::vector<float> input = values(rank, total, 5);
    std::vector<float> blocking(parts[static_cast<size_t>(rank)], -9.0f);
    foreground->reduce_scatter_sum_v(input.data(), blocking.data(), parts, DType::f32);
    expect(std::memcmp(blocking.data(), background.data(), blocking.size() * sizeof(float)) == 0,
           "rank " + std::to_string(rank) +
               ": the buckets' reduce-scatters differ from the whole buffer's");

    // The gathers: `ready` writes the part late, as the optimizer's kernels would.
    std::vector<float> part(background.size(), -3.0f), gathered(total, -5.0f);
    works.clear();
    for (size_t b = 0; b + 1 < bucket_edges.size(); ++b) {
      const size_t lo = bucket_edges[b], hi = bucket_edges[b + 1];
      std::vector<size_t> bytes = counts_of(lo, hi);
      for (size_t& count : bytes)
        count *= sizeof(float);
      works.push_back(reducer.start_all_gather_v(part.data() + at_of(lo), gathered.data() + lo,
                                                 std::move(bytes), [&] { part = background; }));
    }
    for (auto& work : works)
      work->wait();
    std::vector<size_t> part_bytes;
    for (size_t count : parts)
      part_bytes.push_back(count * sizeof(float));
    std::vector<float> whole(total, -11.0f);
    foreground->all_gather_v(blocking.data(), whole.data(), part_bytes);
    expect(std::memcmp(whole.data(), gathered.data(), total * sizeof(float)) == 0,
           "rank " + std::to_string(rank) +
               ": the buckets' all-gathers differ from the whole buffer's");
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0, 0});
}

TEST_CASE("Work::wait with a timeout gives up without losing the operation", "[comm][gloo]") {
  const comm_test::TempDir temp;
  // Rank 1 joins the all_reduce only when rank 0 says so, after rank 0's wait(50 ms) gave up.
  int go[2];
  REQUIRE(::pipe(go) == 0);
  const auto status = comm_test::run_ranks(2, [&](int rank) {
    BackgroundReducer reducer(join(temp.path, "dp_bg", rank, 2));
    if (rank == 1) {
      ::close(go[1]);  // EOF, not a hang, if rank 0 dies first
      char byte = 0;
      expect(::read(go[0], &byte, 1) == 1, "rank 0 let rank 1 go");
    }
    double value = rank + 1;
    auto work = reducer.start_all_reduce_sum(&value, 1, DType::f64);
    if (rank == 0) {
      try {
        work->wait(Milliseconds(50));
        expect(false, "wait(50 ms) returned while rank 1 had not joined");
      } catch (const CommError& error) {
        expect(error.kind() == CommError::Kind::timeout, "timeout kind");
        expect(std::string(error.what()).find("all_reduce of 1 elements on group dp_bg") !=
                   std::string::npos,
               std::string("message: ") + error.what());
      }
      expect(!work->done(), "done while rank 1 had not joined");
      expect(::write(go[1], "x", 1) == 1, "rank 1 let go");
    }
    work->wait();
    expect(value == 3, "sum after the late rank arrived");
    return 0;
  });
  ::close(go[0]);
  ::close(go[1]);
  CHECK(status == std::vector<int>{0, 0});
}

TEST_CASE("a background failure is rethrown by wait, also for later operations", "[comm][gloo]") {
  const comm_test::TempDir temp;
  const auto status = comm_test::run_ranks(2, [&](int rank) {
    BackgroundReducer reducer(join(temp.path, "dp_bg", rank, 2));
    // Rank 1 leaves only once rank 0 has finished its dp_bg rendezvous too (a barrier on another
    // group proves it), so what fails is the background all_reduce, not the rendezvous.
    join(temp.path, "dp", rank, 2)->barrier();
    if (rank == 1) ::_exit(0);
    std::vector<float> data(100000, 1.0f);
    auto first = reducer.start_all_reduce_sum(data.data(), data.size(), DType::f32);
    auto second = reducer.start_all_reduce_sum(data.data(), data.size(), DType::f32);
    for (auto* work : {&first, &second}) {
      try {
        (*work)->wait();
        expect(false, "wait succeeded with rank 1 gone");
      } catch (const CommError& error) {
        expect(std::string(error.what()).find("all_reduce on group dp_bg") != std::string::npos,
               std::string("message: ") + error.what());
      }
    }
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0});
}
