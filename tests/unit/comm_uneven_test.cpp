// reduce_scatter_sum_v and all_gather_v (the uneven collectives ZeRO-1 uses) on Gloo groups of 2,
// 3 and 4 processes and on the one-rank group: exact rank-order sums in f32, f64, bf16 and f16,
// parts of zero length, equality with the even reduce_scatter_sum, and refused misuse.
#include <catch2/catch.hpp>
#include <cstring>

#include "comm/comm.hpp"
#include "comm_test_util.hpp"

using namespace trainctl::comm;
using comm_test::expect;
using comm_test::test_value;
namespace tensor = trainctl::tensor;

namespace {

std::unique_ptr<Communicator> join(const std::string& dir, int rank, int size) {
  FileStore store(dir);
  return create_gloo_communicator(
      store,
      GroupOptions{.name = "dp", .rank = rank, .size = size, .timeout = Milliseconds(10000)});
}

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::f32;
  if constexpr (std::is_same_v<T, double>) return DType::f64;
  if constexpr (std::is_same_v<T, tensor::bf16>) return DType::bf16;
  return DType::f16;
}

// Element i of rank r's input, in storage type T (never zero-filled: sums must be real sums).
template <class T>
T input_value(int rank, size_t i, uint64_t seed) {
  return tensor::store<T>(static_cast<tensor::compute_t<T>>(test_value(rank, i, seed)));
}

// Uneven counts with zero-length parts: patterns chosen so that some rank owns nothing, the last
// rank owns nothing, and one part spans several Gloo segments.
std::vector<std::vector<size_t>> count_patterns(int n) {
  std::vector<std::vector<size_t>> patterns;
  std::vector<size_t> mixed, first_only, last_empty;
  for (int r = 0; r < n; ++r) {
    mixed.push_back(static_cast<size_t>((r * 5 + 3) % 4) * 1001 + (r == 1 ? 300007 : 0));
    first_only.push_back(r == 0 ? 17 : 0);
    last_empty.push_back(r == n - 1 ? 0 : 3 + static_cast<size_t>(r));
  }
  patterns.push_back(mixed);
  patterns.push_back(first_only);
  patterns.push_back(last_empty);
  patterns.push_back(std::vector<size_t>(static_cast<size_t>(n), 0));
  return patterns;
}

// Output is the rank-order sum (in the compute type, rounded once) of every rank's part rank().
template <class T>
void check_reduce_scatter_v(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  uint64_t seed = 11;
  for (const std::vector<size_t>& counts : count_patterns(n)) {
    ++seed;
    size_t total = 0, before = 0;
    for (int r = 0; r < n; ++r) {
      if (r == me) before = total;
      total += counts[static_cast<size_t>(r)];
    }
    std::vector<T> input(total);
    for (size_t i = 0; i < total; ++i)
      input[i] = input_value<T>(me, i, seed);
    const size_t mine = counts[static_cast<size_t>(me)];
    std::vector<T> output(mine + 1, tensor::store<T>(-7));  // one guard element past the part
    comm.reduce_scatter_sum_v(input.data(), output.data(), counts, dtype_of<T>());
    for (size_t i = 0; i < mine; ++i) {
      tensor::compute_t<T> sum = tensor::load(input_value<T>(0, before + i, seed));
      for (int r = 1; r < n; ++r)
        sum += tensor::load(input_value<T>(r, before + i, seed));
      const T expected = tensor::store<T>(sum);
      expect(std::memcmp(&expected, &output[i], sizeof(T)) == 0,
             "reduce_scatter_v element " + std::to_string(i) + " of part " + std::to_string(me) +
                 " (" + std::to_string(mine) + " elements) is not the rank-order sum");
    }
    expect(tensor::load(output[mine]) == -7, "reduce_scatter_v wrote past its part");
  }
}

// With equal counts the uneven op gives the same bits as the even one.
template <class T>
void check_equal_counts_match(Communicator& comm) {
  const size_t count = 4099;
  const size_t n = static_cast<size_t>(comm.size());
  std::vector<T> input(count * n);
  for (size_t i = 0; i < input.size(); ++i)
    input[i] = input_value<T>(comm.rank(), i, 5);
  std::vector<T> even(count), uneven(count);
  comm.reduce_scatter_sum(input.data(), even.data(), count, dtype_of<T>());
  const std::vector<size_t> counts(n, count);
  comm.reduce_scatter_sum_v(input.data(), uneven.data(), counts, dtype_of<T>());
  expect(std::memcmp(even.data(), uneven.data(), count * sizeof(T)) == 0,
         "reduce_scatter_v with equal counts differs from reduce_scatter");
}

uint8_t byte_of(int from, size_t k) {
  return static_cast<uint8_t>(from * 37 + k * 11 + 1);
}

void check_all_gather_v(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  for (const std::vector<size_t>& counts : count_patterns(n)) {
    std::vector<uint8_t> mine(counts[static_cast<size_t>(me)]);
    for (size_t k = 0; k < mine.size(); ++k)
      mine[k] = byte_of(me, k);
    size_t total = 0;
    for (size_t c : counts)
      total += c;
    std::vector<uint8_t> all(total + 1, 0xEE);  // one guard byte
    comm.all_gather_v(mine.data(), all.data(), counts);
    size_t at = 0;
    for (int r = 0; r < n; ++r)
      for (size_t k = 0; k < counts[static_cast<size_t>(r)]; ++k)
        expect(all[at++] == byte_of(r, k),
               "all_gather_v byte " + std::to_string(k) + " from rank " + std::to_string(r));
    expect(all[total] == 0xEE, "all_gather_v wrote past the output");
  }
}

}  // namespace

TEST_CASE("reduce_scatter_sum_v and all_gather_v with uneven parts on 2, 3 and 4 ranks",
          "[comm][gloo]") {
  for (int world : {2, 3, 4}) {
    const comm_test::TempDir temp;
    const auto status = comm_test::run_ranks(world, [&](int rank) {
      auto comm = join(temp.path, rank, world);
      check_reduce_scatter_v<float>(*comm);
      check_reduce_scatter_v<double>(*comm);
      check_reduce_scatter_v<tensor::bf16>(*comm);
      check_reduce_scatter_v<tensor::f16>(*comm);
      check_all_gather_v(*comm);
      return 0;
    });
    INFO("world size " << world);
    CHECK(status == std::vector<int>(static_cast<size_t>(world), 0));
  }
}

TEST_CASE("reduce_scatter_sum_v with equal counts is bit-identical to reduce_scatter_sum",
          "[comm][gloo]") {
  const comm_test::TempDir temp;
  const auto status = comm_test::run_ranks(3, [&](int rank) {
    auto comm = join(temp.path, rank, 3);
    check_equal_counts_match<float>(*comm);
    check_equal_counts_match<double>(*comm);
    check_equal_counts_match<tensor::bf16>(*comm);
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0, 0});
}

TEST_CASE("uneven collectives refuse a wrong number of counts and a dtype they cannot sum",
          "[comm][gloo]") {
  const comm_test::TempDir temp;
  const auto status = comm_test::run_ranks(2, [&](int rank) {
    auto comm = join(temp.path, rank, 2);
    const std::vector<size_t> three = {1, 1, 1};
    float in[3] = {1, 2, 3}, out[3] = {};
    auto refused = [&](const std::function<void()>& call, const std::string& words) {
      try {
        call();
      } catch (const CommError& error) {
        expect(error.kind() == CommError::Kind::usage, "usage error for " + words);
        expect(std::string(error.what()).find(words) != std::string::npos,
               std::string("message: ") + error.what());
        return;
      }
      expect(false, "accepted: " + words);
    };
    refused([&] { comm->reduce_scatter_sum_v(in, out, three, DType::f32); },
            "reduce_scatter_v on group dp (2 ranks, this is rank " + std::to_string(rank) +
                "): got 3 element counts; pass one per rank (2)");
    refused([&] { comm->all_gather_v(in, out, three); }, "got 3 byte counts");
    const std::vector<size_t> two = {1, 1};
    refused([&] { comm->reduce_scatter_sum_v(in, out, two, DType::i32); }, "cannot sum i32");
    // Misuse is caught before any traffic: the group still works.
    comm->reduce_scatter_sum_v(in, out, two, DType::f32);
    expect(out[0] == (rank == 0 ? 2.0f : 4.0f), "sum after refused calls");
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0});
}

TEST_CASE("the one-rank group's uneven collectives are copies", "[comm]") {
  auto comm = create_local_communicator("tp", Milliseconds(1000));
  const std::vector<float> in = {1.5f, -2.0f, 3.25f};
  std::vector<float> out(3);
  const std::vector<size_t> one = {3};
  comm->reduce_scatter_sum_v(in.data(), out.data(), one, DType::f32);
  CHECK(out == in);
  std::vector<float> gathered(3);
  const std::vector<size_t> bytes = {3 * sizeof(float)};
  comm->all_gather_v(in.data(), gathered.data(), bytes);
  CHECK(gathered == in);
  const std::vector<size_t> two = {1, 2};
  CHECK_THROWS_WITH(comm->reduce_scatter_sum_v(in.data(), out.data(), two, DType::f32),
                    Catch::Contains("got 2 element counts; a group of one rank takes exactly one"));
  CHECK_THROWS_WITH(comm->all_gather_v(in.data(), gathered.data(), two),
                    Catch::Contains("got 2 byte counts"));
}
