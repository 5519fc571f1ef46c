// Mesh::create over real processes: every group of every rank sums correctly.
#include <catch2/catch.hpp>

#include "comm/comm.hpp"
#include "comm_test_util.hpp"

using namespace trainctl::comm;
using comm_test::expect;

namespace {

// Sums (member + 1) over the group through the communicator and checks against the membership.
void check_group(Communicator& comm, const std::vector<int>& members, int rank,
                 const std::string& kind) {
  expect(comm.name() == kind, "group name " + comm.name());
  expect(comm.size() == static_cast<int>(members.size()), kind + " size");
  expect(members[static_cast<size_t>(comm.rank())] == rank, kind + " rank within group");
  double value = rank + 1;
  comm.all_reduce_sum(&value, 1, DType::f64);
  double expected = 0;
  for (int m : members)
    expected += m + 1;
  expect(value == expected,
         kind + " sum " + std::to_string(value) + " != " + std::to_string(expected));
}

int run_mesh(Store& store, int world, int rank, const Layout& layout) {
  Mesh mesh = Mesh::create(store, world, rank, layout, MeshOptions{.timeout = Milliseconds(10000)});
  const RankGroups& g = mesh.groups();
  std::vector<int> everyone;
  for (int r = 0; r < world; ++r)
    everyone.push_back(r);
  check_group(mesh.world(), everyone, rank, "world");
  check_group(mesh.tp(), g.of(Axis::tp), rank, "tp");
  check_group(mesh.ep(), g.of(Axis::ep), rank, "ep");
  check_group(mesh.dp(), g.of(Axis::dp), rank, "dp");
  check_group(mesh.pp(), g.of(Axis::pp), rank, "pp");
  check_group(mesh.dp_ep(), g.dp_ep, rank, "dp_ep");
  mesh.world().barrier();
  return 0;
}

}  // namespace

TEST_CASE("mesh tp2 x dp2 on 4 processes (file store)", "[comm][mesh]") {
  const comm_test::TempDir temp;
  const std::string& dir = temp.path;
  const auto status = comm_test::run_ranks(4, [&](int rank) {
    FileStore base(dir);
    PrefixStore store = job_store(base, "job", 0);
    return run_mesh(store, 4, rank, Layout{.tp = 2, .dp = 2});
  });
  CHECK(status == std::vector<int>{0, 0, 0, 0});
}

TEST_CASE("mesh tp2 x ep2 x dp2 on 8 processes (tcp store)", "[comm][mesh]") {
  const StoreSecret secret = StoreSecret::generate();
  TcpStoreServer server("127.0.0.1", 0, secret);
  const auto status = comm_test::run_ranks(8, [&](int rank) {
    TcpStore base("127.0.0.1", server.port(), secret, Milliseconds(5000));
    PrefixStore store = job_store(base, "job", 3);
    return run_mesh(store, 8, rank, Layout{.tp = 2, .ep = 2, .dp = 2});
  });
  CHECK(status == std::vector<int>(8, 0));
}

TEST_CASE("mesh refuses a layout that does not fit the world before any rendezvous",
          "[comm][mesh]") {
  const comm_test::TempDir temp;
  FileStore store(temp.path);
  CHECK_THROWS_WITH(Mesh::create(store, 8, 0, Layout{.tp = 2, .dp = 2}),
                    Catch::Contains("tp*cp*ep*dp*pp = 2*1*1*2*1 = 4 != world size 8"));
}
