// The NCCL communicator's wait-and-abort logic (PendingOp) with fake poll and abort functions, and
// the factory's failure paths, which need neither a GPU nor NCCL. The collectives themselves are
// tested on a GPU in tests/gpu/gpu_nccl_test.cpp.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "comm/error.hpp"
#include "comm/mesh.hpp"
#include "comm/nccl_communicator.hpp"
#include "comm_test_util.hpp"

using namespace trainctl::comm;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kCall = "all_reduce on group dp (2 ranks, this is rank 1)";

// A clock the test moves by hand: the timeouts below are decided by events, not by the machine's
// speed.
struct FakeClock {
  Clock::time_point now = Clock::time_point{} + std::chrono::hours(1);
  PendingOp::Now function() {
    return [this] { return now; };
  }
};

}  // namespace

TEST_CASE("PendingOp returns once the poll reports done, without aborting") {
  int polls = 0, aborts = 0;
  PendingOp op(
      "all_reduce", kCall, milliseconds(5000),
      [&] {
        return PollResult{++polls >= 3, {}};
      },
      [&] { ++aborts; });
  op.wait();
  CHECK(polls == 3);
  CHECK(aborts == 0);
}

TEST_CASE("PendingOp times out, aborts exactly once and names the op and the group") {
  FakeClock clock;
  const Clock::time_point start = clock.now;
  int polls = 0, aborts = 0;
  PendingOp op(
      "all_reduce", kCall, milliseconds(150),
      [&] {
        ++polls;
        clock.now += milliseconds(1);  // each poll takes 1 ms
        return PollResult{};
      },
      [&] { ++aborts; }, clock.function());
  try {
    op.wait();
    FAIL("wait() returned although the operation never completed");
  } catch (const CommError& error) {
    CHECK(error.kind() == CommError::Kind::timeout);
    CHECK(error.op() == "all_reduce");
    CHECK(error.peer() == -1);
    const std::string what = error.what();
    CHECK(what.rfind(kCall, 0) == 0);
    CHECK(what.find("timed out after 150 ms") != std::string::npos);
    CHECK(what.find("a peer did not join the collective") != std::string::npos);
    // It gave up at the first poll that saw the deadline, not before and not later.
    CHECK(polls == 150);
    CHECK(clock.now - start == milliseconds(150));
  }
  CHECK(aborts == 1);
  // A second wait on the failed op fails again but never aborts twice.
  CHECK_THROWS_AS(op.wait(), CommError);
  CHECK(aborts == 1);
}

TEST_CASE("PendingOp on the real clock gives up after its timeout, not before") {
  int aborts = 0;
  PendingOp op(
      "all_reduce", kCall, milliseconds(150), [] { return PollResult{}; }, [&] { ++aborts; });
  const auto start = Clock::now();
  CHECK_THROWS_AS(op.wait(), CommError);
  const auto waited = Clock::now() - start;
  CHECK(waited >= milliseconds(150));
  CHECK(waited < milliseconds(30000));  // the claim is "gives up"; any bound a loaded machine meets
  CHECK(aborts == 1);
}

TEST_CASE("PendingOp turns an asynchronous error into a CommError naming the op and the group") {
  int polls = 0, aborts = 0;
  PendingOp op(
      "reduce_scatter", "reduce_scatter on group tp (4 ranks, this is rank 2)", milliseconds(5000),
      [&] {
        return ++polls < 4 ? PollResult{} : PollResult{false, "NCCL error: remote process exited"};
      },
      [&] { ++aborts; });
  try {
    op.wait();
    FAIL("wait() returned although the poll reported an error");
  } catch (const CommError& error) {
    CHECK(error.kind() == CommError::Kind::io);
    CHECK(error.op() == "reduce_scatter");
    const std::string what = error.what();
    CHECK(what.rfind("reduce_scatter on group tp (4 ranks, this is rank 2): ", 0) == 0);
    CHECK(what.find("NCCL error: remote process exited") != std::string::npos);
    CHECK(what.find("aborted") != std::string::npos);
  }
  CHECK(polls == 4);
  CHECK(aborts == 1);
}

TEST_CASE("PendingOp reports an error seen together with completion") {
  // ncclCommGetAsyncError can flag a failure after the stream drained: the error must win.
  int aborts = 0;
  PendingOp op(
      "barrier", "barrier on group world (2 ranks, this is rank 0)", milliseconds(1000),
      [] {
        return PollResult{true, "NCCL error: unhandled system error"};
      },
      [&] { ++aborts; });
  CHECK_THROWS_AS(op.wait(), CommError);
  CHECK(aborts == 1);
}

TEST_CASE("PendingOp counts its timeout from construction, when the op was enqueued") {
  FakeClock clock;
  int polls = 0, aborts = 0;
  PendingOp op(
      "send", "send on group pp (2 ranks, this is rank 0)", milliseconds(50),
      [&] {
        ++polls;
        return PollResult{};
      },
      [&] { ++aborts; }, clock.function());
  clock.now += milliseconds(80);  // the host was busy between enqueueing and waiting
  CHECK_THROWS_AS(op.wait(), CommError);
  CHECK(polls == 1);  // one look, and the deadline had passed
  CHECK(aborts == 1);
}

TEST_CASE("create_nccl_communicator names the group and the GPU when it cannot start") {
  comm_test::TempDir dir;
  FileStore store(dir.path);
  GroupOptions options;
  options.name = "dp";
  options.timeout = milliseconds(2000);
  try {
    create_nccl_communicator(store, options, /*cuda_device=*/999);
    FAIL("a communicator on GPU 999 was created");
  } catch (const CommError& error) {
    const std::string what = error.what();
    INFO(what);
    CHECK(what.find("group dp") != std::string::npos);
    CHECK(what.find("GPU 999") != std::string::npos);
    CHECK(error.op() == "rendezvous");
    if (nccl_available()) {
      CHECK(error.kind() == CommError::Kind::io);
      CHECK(what.find("cudaSetDevice") != std::string::npos);
    } else {
      CHECK(error.kind() == CommError::Kind::usage);
      CHECK(what.find("this build has no NCCL") != std::string::npos);
    }
  }
}

TEST_CASE("create_nccl_communicator rejects a rank outside the group") {
  comm_test::TempDir dir;
  FileStore store(dir.path);
  GroupOptions options;
  options.name = "tp";
  options.rank = 2;
  options.size = 2;
  try {
    create_nccl_communicator(store, options, 0);
    FAIL("rank 2 of 2 was accepted");
  } catch (const CommError& error) {
    CHECK(error.kind() == CommError::Kind::usage);
    CHECK(std::string(error.what()).find("group tp") != std::string::npos);
  }
}

TEST_CASE("Mesh with the nccl backend fails on a missing GPU instead of falling back to Gloo") {
  comm_test::TempDir dir;
  FileStore store(dir.path);
  MeshOptions options;
  options.timeout = milliseconds(2000);
  options.backend = CommBackend::nccl;
  options.cuda_device = 999;
  try {
    Mesh::create(store, 1, 0, Layout{}, options);
    FAIL("a mesh was created on GPU 999");
  } catch (const CommError& error) {
    const std::string what = error.what();
    INFO(what);
    CHECK(what.find("group world") != std::string::npos);
    CHECK(what.find("GPU 999") != std::string::npos);
  }
}
