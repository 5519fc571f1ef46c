// GlooCommunicator collectives against plain references computed here, over 2, 3 and 4 processes,
// for sizes including 0 and odd lengths, in f32 and f64; deterministic sums; the max; point to
// point.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "comm/comm.hpp"
#include "comm_test_util.hpp"

using namespace trainctl::comm;
using comm_test::expect;
using comm_test::test_value;

namespace {

const std::vector<size_t> kCounts = {0, 1, 7, 1000, 300007};  // 300007 f32: several Gloo segments

std::unique_ptr<Communicator> join(const std::string& dir, int rank, int size,
                                   Milliseconds timeout = Milliseconds(10000)) {
  FileStore store(dir);
  GroupOptions options;
  options.name = "dp";
  options.rank = rank;
  options.size = size;
  options.timeout = timeout;
  return create_gloo_communicator(store, options);
}

template <class T>
std::vector<T> values(int rank, size_t count, uint64_t seed) {
  std::vector<T> v(count);
  for (size_t i = 0; i < count; ++i)
    v[i] = static_cast<T>(test_value(rank, i, seed));
  return v;
}

// Every rank's copy of `data` is bit-identical (checked by gathering them all).
void expect_same_on_all_ranks(Communicator& comm, const void* data, size_t bytes) {
  std::vector<char> all(bytes * static_cast<size_t>(comm.size()));
  comm.all_gather(data, all.data(), bytes);
  for (int r = 0; r < comm.size(); ++r)
    expect(std::memcmp(all.data() + bytes * static_cast<size_t>(r), data, bytes) == 0,
           "rank " + std::to_string(r) + " holds different bytes");
}

template <class T>
void check_all_reduce(Communicator& comm, double tolerance) {
  for (size_t count : kCounts) {
    std::vector<T> data = values<T>(comm.rank(), count, count);
    comm.all_reduce_sum(data.data(), count, std::is_same_v<T, float> ? DType::f32 : DType::f64);
    for (size_t i = 0; i < count; ++i) {
      double reference = 0;
      for (int r = 0; r < comm.size(); ++r)
        reference += static_cast<T>(test_value(r, i, count));
      expect(std::fabs(data[i] - reference) <= tolerance,
             "all_reduce element " + std::to_string(i) + " of " + std::to_string(count));
    }
    expect_same_on_all_ranks(comm, data.data(), count * sizeof(T));
  }
}

// all_reduce_max is exact and order-free: the reference is the max itself. A +inf on one rank
// (an fp8 amax with a non-finite element) wins; bf16 is refused, naming the dtype.
template <class T>
void check_all_reduce_max(Communicator& comm) {
  const DType dtype = std::is_same_v<T, float> ? DType::f32 : DType::f64;
  for (size_t count : kCounts) {
    std::vector<T> data = values<T>(comm.rank(), count, 3 * count + 1);
    if (count > 1 && comm.rank() == comm.size() - 1) data[1] = std::numeric_limits<T>::infinity();
    comm.all_reduce_max(data.data(), count, dtype);
    for (size_t i = 0; i < count; ++i) {
      T reference = static_cast<T>(test_value(0, i, 3 * count + 1));
      for (int r = 1; r < comm.size(); ++r)
        reference = std::max(reference, static_cast<T>(test_value(r, i, 3 * count + 1)));
      if (i == 1) reference = std::numeric_limits<T>::infinity();
      expect(std::memcmp(&reference, &data[i], sizeof(T)) == 0,
             "all_reduce_max element " + std::to_string(i) + " of " + std::to_string(count));
    }
  }
  uint16_t narrow = 0;
  try {
    comm.all_reduce_max(&narrow, 1, DType::bf16);
    expect(false, "all_reduce_max accepted bf16");
  } catch (const CommError& error) {
    expect(std::string(error.what()).find("cannot take the max of bf16; use f32 or f64") !=
               std::string::npos,
           std::string("the bf16 refusal names the dtype: ") + error.what());
  }
}

template <class T>
void check_reduce_scatter(Communicator& comm) {
  const DType dtype = std::is_same_v<T, float> ? DType::f32 : DType::f64;
  for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{4099}}) {
    const size_t total = count * static_cast<size_t>(comm.size());
    std::vector<T> input = values<T>(comm.rank(), total, 7 + count);
    std::vector<T> output(count, T(-1));
    comm.reduce_scatter_sum(input.data(), output.data(), count, dtype);
    // Exact reference: chunk rank() of every rank, added in rank order 0, 1, ... in T.
    for (size_t i = 0; i < count; ++i) {
      const size_t at = static_cast<size_t>(comm.rank()) * count + i;
      T expected = static_cast<T>(test_value(0, at, 7 + count));
      for (int r = 1; r < comm.size(); ++r)
        expected += static_cast<T>(test_value(r, at, 7 + count));
      expect(std::memcmp(&expected, &output[i], sizeof(T)) == 0,
             "reduce_scatter is not the rank-order sum at " + std::to_string(i));
    }
  }
}

uint8_t byte_of(int from, int to, size_t k) {
  return static_cast<uint8_t>(from * 31 + to * 7 + k * 13);
}

void check_data_movement(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{13}, size_t{65537}}) {
    // all_gather
    std::vector<uint8_t> mine(bytes), all(bytes * static_cast<size_t>(n));
    for (size_t k = 0; k < bytes; ++k)
      mine[k] = byte_of(me, 0, k);
    comm.all_gather(mine.data(), all.data(), bytes);
    for (int r = 0; r < n; ++r)
      for (size_t k = 0; k < bytes; ++k)
        expect(all[static_cast<size_t>(r) * bytes + k] == byte_of(r, 0, k), "all_gather");
    // all_to_all: chunk r goes to rank r
    std::vector<uint8_t> send(bytes * static_cast<size_t>(n)), recv(send.size());
    for (int r = 0; r < n; ++r)
      for (size_t k = 0; k < bytes; ++k)
        send[static_cast<size_t>(r) * bytes + k] = byte_of(me, r, k);
    comm.all_to_all(send.data(), recv.data(), bytes);
    for (int r = 0; r < n; ++r)
      for (size_t k = 0; k < bytes; ++k)
        expect(recv[static_cast<size_t>(r) * bytes + k] == byte_of(r, me, k), "all_to_all");
    // broadcast from the last rank
    std::vector<uint8_t> b(bytes);
    for (size_t k = 0; k < bytes; ++k)
      b[k] = byte_of(me, me, k);
    comm.broadcast(b.data(), bytes, n - 1);
    for (size_t k = 0; k < bytes; ++k)
      expect(b[k] == byte_of(n - 1, n - 1, k), "broadcast");
  }
  // all_to_allv with uneven counts, zeros included: from -> to carries (3*from + 5*to + 1) % 7 *
  // 1000 bytes.
  auto count = [](int from, int to) {
    return static_cast<size_t>((3 * from + 5 * to + 1) % 7) * 1000;
  };
  std::vector<size_t> send_bytes, recv_bytes;
  for (int r = 0; r < n; ++r) {
    send_bytes.push_back(count(me, r));
    recv_bytes.push_back(count(r, me));
  }
  std::vector<uint8_t> send, recv;
  for (int r = 0; r < n; ++r)
    for (size_t k = 0; k < send_bytes[static_cast<size_t>(r)]; ++k)
      send.push_back(byte_of(me, r, k));
  size_t total = 0;
  for (size_t c : recv_bytes)
    total += c;
  recv.assign(total, 0);
  comm.all_to_allv(send.data(), send_bytes, recv.data(), recv_bytes);
  size_t at = 0;
  for (int r = 0; r < n; ++r)
    for (size_t k = 0; k < recv_bytes[static_cast<size_t>(r)]; ++k)
      expect(recv[at++] == byte_of(r, me, k), "all_to_allv from rank " + std::to_string(r));
  comm.barrier();
}

}  // namespace

TEST_CASE("collectives match plain references on 2, 3 and 4 ranks", "[comm][gloo]") {
  for (int world : {2, 3, 4}) {
    const comm_test::TempDir temp;
    const std::string& dir = temp.path;
    const auto status = comm_test::run_ranks(world, [&](int rank) {
      auto comm = join(dir, rank, world);
      expect(comm->size() == world && comm->rank() == rank && comm->name() == "dp", "identity");
      check_all_reduce<float>(*comm, 1e-5);
      check_all_reduce<double>(*comm, 1e-12);
      check_all_reduce_max<float>(*comm);
      check_all_reduce_max<double>(*comm);
      check_reduce_scatter<float>(*comm);
      check_reduce_scatter<double>(*comm);
      check_data_movement(*comm);
      return 0;
    });
    INFO("world size " << world);
    CHECK(status == std::vector<int>(static_cast<size_t>(world), 0));
  }
}

TEST_CASE("all_reduce is bit-identical from run to run and bf16 sums in f32", "[comm][gloo]") {
  // Two separate runs (fresh processes, fresh connections) write their results; bytes must match.
  std::vector<std::string> outputs;
  for (int run = 0; run < 2; ++run) {
    const comm_test::TempDir temp;
    const std::string& dir = temp.path;
    const auto status = comm_test::run_ranks(4, [&](int rank) {
      auto comm = join(dir, rank, 4);
      std::vector<float> data = values<float>(rank, 100003, 99);
      comm->all_reduce_sum(std::span<float>(data));
      std::vector<trainctl::tensor::bf16> narrow(1001);
      for (size_t i = 0; i < narrow.size(); ++i)
        narrow[i] = trainctl::tensor::to_bf16(static_cast<float>(test_value(rank, i, 3)));
      comm->all_reduce_sum(narrow.data(), narrow.size(), DType::bf16);
      for (size_t i = 0; i < narrow.size(); ++i) {
        float reference = 0;  // sum of bf16 inputs in f32, rounded once: at most half an ulp off
        for (int r = 0; r < 4; ++r)
          reference += trainctl::tensor::to_float(
              trainctl::tensor::to_bf16(static_cast<float>(test_value(r, i, 3))));
        expect(std::fabs(trainctl::tensor::to_float(narrow[i]) - reference) <=
                   std::fabs(reference) * 0.0079f + 1e-6f,
               "bf16 all_reduce");
      }
      if (rank == 1) {
        std::ofstream out(dir + "/result", std::ios::binary);
        out.write(reinterpret_cast<const char*>(data.data()),
                  static_cast<std::streamsize>(data.size() * sizeof(float)));
      }
      return 0;
    });
    REQUIRE(status == std::vector<int>{0, 0, 0, 0});
    std::ifstream in(dir + "/result", std::ios::binary);
    outputs.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  REQUIRE(outputs[0].size() == 100003 * sizeof(float));
  CHECK(outputs[0] == outputs[1]);
}

// isend posts and returns: both ranks of a pair send first and receive second (with blocking,
// unbuffered sends that order deadlocks), several sends in flight at once, matched by tag in
// another order than posted. The handles then wait; the data arrived whole.
TEST_CASE("isend: both sides send first, several in flight, received by tag", "[comm][gloo]") {
  const comm_test::TempDir temp;
  const std::string& dir = temp.path;
  const auto status = comm_test::run_ranks(2, [&](int rank) {
    auto comm = join(dir, rank, 2);
    const int partner = 1 - rank;
    const size_t bytes = size_t{4} << 20;  // beyond any socket buffer
    std::vector<std::vector<uint8_t>> out(3, std::vector<uint8_t>(bytes)), in(out);
    for (uint32_t tag = 0; tag < 3; ++tag)
      for (size_t k = 0; k < bytes; ++k)
        out[tag][k] = byte_of(rank, partner, k + tag);
    std::vector<std::unique_ptr<PendingSend>> sends;
    for (uint32_t tag = 0; tag < 3; ++tag)
      sends.push_back(comm->isend(out[tag].data(), bytes, partner, tag));
    for (uint32_t tag = 3; tag-- > 0;)  // the last posted first
      comm->recv(in[tag].data(), bytes, partner, tag);
    for (auto& send : sends)
      send->wait();
    for (uint32_t tag = 0; tag < 3; ++tag)
      for (size_t k = 0; k < bytes; ++k)
        expect(in[tag][k] == byte_of(partner, rank, k + tag), "isend data");
    comm->barrier();
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0});
}

TEST_CASE("send/recv pairs with tags, and misuse is refused before any traffic", "[comm][gloo]") {
  const comm_test::TempDir temp;
  const std::string& dir = temp.path;
  const auto status = comm_test::run_ranks(4, [&](int rank) {
    auto comm = join(dir, rank, 4);
    const int partner = rank ^ 1;  // pairs 0-1, 2-3
    for (size_t bytes : {size_t{1}, size_t{4096}, size_t{1} << 20}) {
      std::vector<uint8_t> out(bytes), in(bytes, 0);
      for (size_t k = 0; k < bytes; ++k)
        out[k] = byte_of(rank, partner, k);
      for (uint32_t tag : {1u, 2u}) {
        if (rank % 2 == 0) {
          comm->send(out.data(), bytes, partner, tag);
          comm->recv(in.data(), bytes, partner, tag);
        } else {
          comm->recv(in.data(), bytes, partner, tag);
          comm->send(out.data(), bytes, partner, tag);
        }
        for (size_t k = 0; k < bytes; ++k)
          expect(in[k] == byte_of(partner, rank, k), "recv");
      }
    }
    try {
      comm->send(nullptr, 4, rank, 0);
      expect(false, "send to self accepted");
    } catch (const CommError& error) {
      expect(error.kind() == CommError::Kind::usage, "send to self: usage error");
      expect(std::string(error.what()).find("send on group dp (4 ranks") != std::string::npos,
             std::string("send to self message: ") + error.what());
    }
    std::vector<size_t> three(3, 0);
    try {
      comm->all_to_allv(nullptr, three, nullptr, three);
      expect(false, "all_to_allv with 3 counts accepted");
    } catch (const CommError& error) {
      expect(std::string(error.what()).find("pass one per rank") != std::string::npos, "counts");
    }
    comm->barrier();  // misuse did not break the group
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0, 0, 0});
}

TEST_CASE("a group of one rank is local and never touches the store", "[comm][gloo]") {
  const comm_test::TempDir temp;
  FileStore store(temp.path);
  auto comm = create_gloo_communicator(store, GroupOptions{.name = "tp", .rank = 0, .size = 1});
  std::vector<double> data = {1.5, -2.0};
  comm->all_reduce_sum(std::span<double>(data));
  CHECK(data == std::vector<double>{1.5, -2.0});
  comm->all_reduce_max(data.data(), data.size(), DType::f64);
  CHECK(data == std::vector<double>{1.5, -2.0});
  CHECK_THROWS_WITH(comm->all_reduce_max(data.data(), 1, DType::i32),
                    Catch::Contains("cannot take the max of i32"));
  std::vector<float> out(2);
  const float in[2] = {3, 4};
  comm->reduce_scatter_sum(in, out.data(), 2, DType::f32);
  CHECK(out == std::vector<float>{3, 4});
  CHECK_THROWS_WITH(comm->send(in, 8, 1, 0), Catch::Contains("peer 1 does not exist"));
  CHECK_FALSE(store.try_get("trainctl/peer/0"));
  CHECK_THROWS_AS(create_gloo_communicator(store, GroupOptions{.rank = 2, .size = 2}), CommError);
}
