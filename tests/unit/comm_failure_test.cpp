// Failures never hang: a peer that exits, a peer that stops (SIGSTOP), a rank that never arrives.
// Each survivor must get a CommError naming the op, the group and the peer within the timeout.
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "comm/comm.hpp"
#include "comm_test_util.hpp"

using namespace trainctl::comm;
using comm_test::expect;

namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<Communicator> join(const std::string& dir, int rank, int size,
                                   Milliseconds timeout) {
  FileStore store(dir);
  return create_gloo_communicator(
      store, GroupOptions{.name = "dp", .rank = rank, .size = size, .timeout = timeout});
}

// Polls /proc/<pid>/stat until the process is in state T (stopped), for up to 10 s.
void wait_until_stopped(int pid) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');
    if (close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'T') return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("a peer that exits: the others get CommError naming op and peer, not a hang",
          "[comm][gloo][failure]") {
  const comm_test::TempDir temp;
  const std::string& dir = temp.path;
  const auto status = comm_test::run_ranks(4, [&](int rank) {
    auto comm = join(dir, rank, 4, Milliseconds(10000));
    comm->barrier();
    if (rank == 2) ::_exit(0);  // gone without a word, sockets closed by the kernel
    std::vector<float> data(1 << 16, 1.0f);
    try {
      comm->all_reduce_sum(std::span<float>(data));
      expect(false, "all_reduce succeeded without rank 2");
    } catch (const CommError& error) {
      const std::string what = error.what();
      std::fprintf(stderr, "rank %d saw: %s\n", rank, what.c_str());
      expect(
          contains(what, "all_reduce on group dp (4 ranks, this is rank " + std::to_string(rank)),
          "op and group named: " + what);
      expect(contains(what, "rank 2 is gone"), "dead peer named: " + what);
      // Found from the closed connection, not by waiting out the 10 s timeout.
      expect(error.kind() == CommError::Kind::peer_gone, "kind peer_gone: " + what);
      // The group is broken now: later calls fail at once with the first failure's reason.
      try {
        comm->barrier();
        expect(false, "barrier on a broken group succeeded");
      } catch (const CommError& again) {
        expect(contains(again.what(), "broken by an earlier failure"), again.what());
      }
    }
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0, 0, 0});
}

TEST_CASE("a peer whose connections close before it exits is still named once it has exited",
          "[comm][gloo][failure]") {
  // A killed process closes its sockets before the process table shows it exited; on a loaded
  // machine the gap is long enough that a survivor looking at once sees every peer alive. Rank 2
  // makes the gap 100 ms on purpose (the survivors watch for up to a second): it closes its
  // connections, then exits.
  const comm_test::TempDir temp;
  const std::string& dir = temp.path;
  const auto status = comm_test::run_ranks(3, [&](int rank) {
    auto comm = join(dir, rank, 3, Milliseconds(10000));
    comm->barrier();
    if (rank == 2) {
      comm.reset();
      std::this_thread::sleep_for(Milliseconds(100));
      ::_exit(0);
    }
    std::vector<float> data(1 << 16, 1.0f);
    try {
      comm->all_reduce_sum(std::span<float>(data));
      expect(false, "all_reduce succeeded without rank 2");
    } catch (const CommError& error) {
      const std::string what = error.what();
      std::fprintf(stderr, "rank %d saw: %s\n", rank, what.c_str());
      expect(contains(what, "rank 2 is gone (connection closed)"), "exited peer named: " + what);
      expect(error.kind() == CommError::Kind::peer_gone && error.peer() == 2, "kind and peer");
    }
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0, 0});
}

TEST_CASE("in a group of two, a closed connection names the other rank even while it lives on",
          "[comm][gloo][failure]") {
  const comm_test::TempDir temp;
  const std::string& dir = temp.path;
  int done[2];  // rank 0 -> rank 1: "I have my error", so rank 1 lives through rank 0's diagnosis
  REQUIRE(::pipe(done) == 0);
  const auto status = comm_test::run_ranks(2, [&](int rank) {
    auto comm = join(dir, rank, 2, Milliseconds(10000));
    comm->barrier();
    if (rank == 1) {
      ::close(done[1]);
      comm.reset();  // closes its connection and stays alive until rank 0 has looked
      char byte = 0;
      return ::read(done[0], &byte, 1) == 1 ? 0 : 5;
    }
    std::vector<float> data(1 << 16, 1.0f);
    try {
      comm->all_reduce_sum(std::span<float>(data));
      expect(false, "all_reduce succeeded after rank 1 closed its connection");
    } catch (const CommError& error) {
      const std::string what = error.what();
      expect(contains(what, "rank 1 closed its connection"), "the other member named: " + what);
      expect(!contains(what, "is gone"), "a live peer is not called gone: " + what);
      expect(error.kind() == CommError::Kind::peer_gone && error.peer() == 1, "kind and peer");
    }
    expect(::write(done[1], "x", 1) == 1, "told rank 1");
    return 0;
  });
  ::close(done[0]);
  ::close(done[1]);
  CHECK(status == std::vector<int>{0, 0});
}

TEST_CASE("a peer that stops answering (SIGSTOP): the others time out naming op and peer",
          "[comm][gloo][failure]") {
  const comm_test::TempDir temp;
  const std::string& dir = temp.path;
  const auto status = comm_test::run_ranks(
      3,
      [&](int rank) {
        auto comm = join(dir, rank, 3, Milliseconds(10000));
        FileStore store(dir + "/test");
        if (rank == 1) store.set("stopper_pid", std::to_string(::getpid()));
        comm->barrier();
        if (rank == 1) ::raise(SIGSTOP);  // the harness SIGKILLs it once the others are done
        // Start the collective only once rank 1 really is stopped: on a loaded machine it may not
        // be scheduled for a while after the barrier, and the test is about a stopped peer.
        wait_until_stopped(std::stoi(store.get("stopper_pid", Milliseconds(10000))));
        std::vector<double> data(1000, 2.0);
        const auto start = Clock::now();
        try {
          comm->all_reduce_sum(data.data(), data.size(), DType::f64, Milliseconds(700));
          expect(false, "all_reduce succeeded with rank 1 stopped");
        } catch (const CommError& error) {
          const std::string what = error.what();
          std::fprintf(stderr, "rank %d saw: %s\n", rank, what.c_str());
          expect(error.kind() == CommError::Kind::timeout, "timeout kind: " + what);
          expect(error.op() == "all_reduce", "op field");
          expect(contains(what, "all_reduce on group dp (3 ranks"), "op and group: " + what);
          expect(contains(what, "timed out after 700 ms"), "timeout named: " + what);
          expect(contains(what, "rank 1 is stopped"), "silent peer named: " + what);
          expect(error.peer() == 1, "peer field");
          const auto waited = Clock::now() - start;
          // Not before the timeout; the upper bound only says "gave up", so it is one any
          // loaded machine meets.
          expect(waited >= Milliseconds(700) && waited < Milliseconds(30000), "waited the timeout");
        }
        return 0;
      },
      {.deadline = Milliseconds(20000), .required = {0, 2}});
  CHECK(status[0] == 0);
  CHECK(status[2] == 0);
  CHECK(status[1] == -1);  // still stopped: killed by the harness
}

TEST_CASE("a rank that never arrives: rendezvous names it after the timeout",
          "[comm][gloo][failure]") {
  const comm_test::TempDir temp;
  const std::string& dir = temp.path;
  const auto status = comm_test::run_ranks(2, [&](int rank) {
    if (rank == 1) return 0;  // never joins
    const auto start = Clock::now();
    try {
      join(dir, 0, 3, Milliseconds(500));
      expect(false, "rendezvous completed without ranks 1 and 2");
    } catch (const CommError& error) {
      const std::string what = error.what();
      expect(error.kind() == CommError::Kind::timeout, "timeout kind: " + what);
      expect(contains(what, "rendezvous of group dp (3 ranks, this is rank 0)"), what);
      expect(contains(what, "rank(s) 1, 2 have not arrived"), what);
      expect(Clock::now() - start >= Milliseconds(500), "waited the timeout");
      expect(Clock::now() - start < Milliseconds(30000), "no hang");
    }
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0});
}

TEST_CASE("creating a Gloo device ignores SIGPIPE, so a dead peer is an error, not a silent death",
          "[comm][gloo][failure]") {
  const auto status = comm_test::run_ranks(1, [](int) {
    ::signal(SIGPIPE, SIG_DFL);
    auto device = make_gloo_device();
    struct sigaction current {};
    ::sigaction(SIGPIPE, nullptr, &current);
    expect(current.sa_handler == SIG_IGN, "SIGPIPE ignored");
    return 0;
  });
  CHECK(status == std::vector<int>{0});
}
