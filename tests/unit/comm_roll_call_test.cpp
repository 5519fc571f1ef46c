// The roll call after a failed collective across hosts (comm/roll_call.hpp): who answered, who
// did not, stale keys of an earlier attempt, a store that fails, and the message.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "comm/error.hpp"
#include "comm/roll_call.hpp"
#include "comm/store.hpp"
#include "comm_test_util.hpp"

using namespace trainctl::comm;
using Catch::Matchers::Contains;
using std::chrono::milliseconds;

namespace {

const std::vector<Member> kMembers{
    {"h0", 100, "10.0.0.1"}, {"h1", 200, "10.0.0.2"}, {"h2", 300, "10.0.0.3"}};

// A store whose host cannot be reached: every call fails as the TCP store's do.
class UnreachableStore final : public Store {
 public:
  void set(const std::string&, std::string_view) override { fail(); }
  std::optional<std::string> try_get(const std::string&) override { fail(); }
  int64_t add(const std::string&, int64_t) override { fail(); }
  std::string describe() const override { return "tcp store 10.0.0.1:29500"; }

 private:
  [[noreturn]] static void fail() {
    throw CommError(CommError::Kind::timeout, "tcp store 10.0.0.1:29500: no answer within 50 ms",
                    "store.set");
  }
};

}  // namespace

TEST_CASE("roll call: a member that does not answer within the window is named with its address",
          "[comm]") {
  const comm_test::TempDir temp;
  FileStore store(temp.path);
  store.set("trainctl/roll_call/1", "200");
  store.set("trainctl/roll_call/2", "999");  // an earlier attempt's rank 2: another pid
  const auto start = std::chrono::steady_clock::now();
  const RollCall call = roll_call(store, 0, kMembers, milliseconds(150));
  CHECK(std::chrono::steady_clock::now() - start >= milliseconds(150));
  CHECK(call.answered == std::vector<int>{0, 1});
  CHECK(call.silent == std::vector<int>{2});
  CHECK(call.store_error.empty());
  CHECK(*store.try_get("trainctl/roll_call/0") == "100");
  CHECK(*store.try_get("trainctl/roll_call_done/0") == "100");
  CHECK_THAT(describe_roll_call(call, kMembers, store.describe(), milliseconds(150)),
             Contains("rank 2 (pid 300 on h2, address 10.0.0.3) did not answer within 150 ms, "
                      "ranks 0, 1 did: rank 2 is cut off (link or host down) or stuck"));
}

TEST_CASE("roll call: ends as soon as every member answered", "[comm]") {
  const comm_test::TempDir temp;
  FileStore store(temp.path);
  for (const auto& [rank, pid] : {std::pair{0, "100"}, std::pair{2, "300"}}) {
    store.set("trainctl/roll_call/" + std::to_string(rank), pid);
    store.set("trainctl/roll_call_done/" + std::to_string(rank), pid);  // they finished theirs
  }
  const auto start = std::chrono::steady_clock::now();
  const RollCall call = roll_call(store, 1, kMembers, milliseconds(5000));
  CHECK(std::chrono::steady_clock::now() - start < milliseconds(2000));
  CHECK(call.silent.empty());
  CHECK_THAT(describe_roll_call(call, kMembers, store.describe(), milliseconds(5000)),
             Contains("every rank answered within 5000 ms"));
}

TEST_CASE("roll call: a store that does not answer is reported, not thrown", "[comm]") {
  UnreachableStore store;
  const RollCall call = roll_call(store, 1, kMembers, milliseconds(100));
  CHECK_THAT(call.store_error, Contains("no answer within 50 ms"));
  CHECK(call.silent == std::vector<int>{0, 2});
  CHECK_THAT(describe_roll_call(call, kMembers, store.describe(), milliseconds(100)),
             Contains("roll call through tcp store 10.0.0.1:29500: the store did not answer") &&
                 Contains("rank 0's"));
}

TEST_CASE("roll call: only members on several addresses span a network", "[comm]") {
  CHECK(spans_network(kMembers));
  CHECK_FALSE(spans_network({{"a", 1, "127.0.0.1"}, {"b", 2, "127.0.0.1"}}));
}
