// FileStore and TcpStore: basics, atomic counters across processes, timeouts that name the key,
// and the per-job, per-restart namespace.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "comm/error.hpp"
#include "comm/store.hpp"
#include "comm_test_util.hpp"

using namespace trainctl::comm;
using comm_test::expect;

namespace {

void check_basics(Store& store) {
  store.set("a/b c", std::string("x\0y", 3));
  CHECK(store.get("a/b c", Milliseconds(100)) == std::string("x\0y", 3));
  store.set("a/b c", "overwritten");
  CHECK(*store.try_get("a/b c") == "overwritten");
  CHECK_FALSE(store.try_get("missing"));
  CHECK(store.add("counter", 5) == 5);
  CHECK(store.add("counter", -2) == 3);
  store.set("empty", "");
  CHECK(store.get("empty", Milliseconds(100)).empty());
  CHECK_NOTHROW(store.wait({"a/b c", "counter"}, Milliseconds(100)));

  const auto start = std::chrono::steady_clock::now();
  try {
    store.get("never/set", Milliseconds(150));
    FAIL("get of a missing key returned");
  } catch (const CommError& error) {
    CHECK(error.kind() == CommError::Kind::timeout);
    CHECK_THAT(error.what(), Catch::Contains("'never/set'") && Catch::Contains("150 ms"));
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited >= Milliseconds(150));
  CHECK(waited < Milliseconds(1500));
  try {
    store.wait({"a/b c", "gone1", "gone2"}, Milliseconds(50));
    FAIL("wait for missing keys returned");
  } catch (const CommError& error) {
    CHECK_THAT(error.what(), Catch::Contains("2 of 3 keys") && Catch::Contains("'gone1', 'gone2'"));
  }
}

// Four processes add concurrently; every increment must land exactly once.
void check_counter_across_processes(const std::function<std::unique_ptr<Store>()>& open) {
  const auto status = comm_test::run_ranks(4, [&](int) {
    auto store = open();
    for (int i = 0; i < 50; ++i)
      store->add("shared", 1);
    store->set("done/" + std::to_string(::getpid()), "1");
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0, 0, 0});
  CHECK(open()->add("shared", 0) == 200);
}

}  // namespace

TEST_CASE("file store: set, get, add, wait, timeouts", "[comm][store]") {
  const comm_test::TempDir temp;
  FileStore store(temp.path + "/store");
  check_basics(store);
  check_counter_across_processes([&] { return std::make_unique<FileStore>(store.dir()); });
}

TEST_CASE(
    "file store: new folders 0700 and key files 0600 whatever the umask; existing folders "
    "keep their mode",
    "[comm][store][security]") {
  const comm_test::TempDir temp;
  const auto mode_of = [](const std::string& path) {
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    return st.st_mode & 07777;
  };
  ::chmod(temp.path.c_str(), 0755);
  const mode_t old_umask = ::umask(0);
  {
    FileStore store(temp.path + "/run/rendezvous/job");
    store.set("k", "v");
    store.add("c", 1);
  }
  ::umask(old_umask);
  CHECK(mode_of(temp.path) == 0755);
  for (const char* folder : {"/run", "/run/rendezvous", "/run/rendezvous/job"}) {
    INFO(folder);
    CHECK(mode_of(temp.path + folder) == 0700);
  }
  for (const char* file : {"k", "c", "c.lock"}) {
    INFO(file);
    CHECK(mode_of(temp.path + "/run/rendezvous/job/" + file) == 0600);
  }
}

TEST_CASE("tcp store: set, get, add, wait, timeouts", "[comm][store]") {
  const StoreSecret secret = StoreSecret::generate();
  TcpStoreServer server("127.0.0.1", 0, secret);
  REQUIRE(server.port() > 0);
  TcpStore store("127.0.0.1", server.port(), secret, Milliseconds(2000));
  check_basics(store);
  check_counter_across_processes([&] {
    return std::make_unique<TcpStore>("127.0.0.1", server.port(), secret, Milliseconds(2000));
  });
  // A value larger than a socket buffer crosses intact.
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i)
    big[i] = static_cast<char>(i * 131 % 251);
  store.set("big", big);
  CHECK(store.get("big", Milliseconds(1000)) == big);
}

TEST_CASE("tcp store: a client waits for a late server, and says so when there is none",
          "[comm][store]") {
  // A port that is bound but never listened on: connections are refused, and no other process
  // (a test running beside this one) can take the port while the socket is held.
  const int holder = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(holder >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(holder, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  socklen_t length = sizeof(address);
  REQUIRE(::getsockname(holder, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  const int port = ntohs(address.sin_port);
  const StoreSecret secret = StoreSecret::generate();
  try {
    TcpStore store("127.0.0.1", port, secret, Milliseconds(100));
    FAIL("connected to nothing");
  } catch (const CommError& error) {
    CHECK(error.kind() == CommError::Kind::timeout);
    CHECK_THAT(error.what(),
               Catch::Contains("127.0.0.1:" + std::to_string(port)) && Catch::Contains("rank 0"));
  }
  // A server that starts after the client began retrying.
  std::unique_ptr<TcpStoreServer> late;
  std::thread starter([&] {
    std::this_thread::sleep_for(Milliseconds(200));
    ::close(holder);  // hand the port to the server
    late = std::make_unique<TcpStoreServer>("127.0.0.1", port, secret);
  });
  TcpStore client("127.0.0.1", port, secret, Milliseconds(60000));  // generous: a busy machine
  starter.join();
  client.set("hello", "world");
  CHECK(client.get("hello", Milliseconds(100)) == "world");
}

TEST_CASE("job store: a restarted job never sees the previous attempt's keys", "[comm][store]") {
  const comm_test::TempDir temp;
  FileStore base(temp.path);
  PrefixStore first = job_store(base, "job42", 0);
  first.set("rendezvous/0", "old address");
  first.add("arrivals", 3);
  PrefixStore second = job_store(base, "job42", 1);
  CHECK_FALSE(second.try_get("rendezvous/0"));
  CHECK(second.add("arrivals", 1) == 1);
  CHECK(*job_store(base, "job42", 0).try_get("rendezvous/0") == "old address");
  CHECK_FALSE(job_store(base, "job43", 0).try_get("rendezvous/0"));
  CHECK_THROWS_WITH(job_store(base, "a/b", 0), Catch::Contains("no '/'"));
  CHECK_THROWS_AS(job_store(base, "job", -1), CommError);
}
