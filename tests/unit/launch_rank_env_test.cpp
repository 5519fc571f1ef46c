// lib/launch: the rank environment of each launcher, read through a fake getenv (the test never
// touches its own environment).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>

#include <map>
#include <string>

#include "launch/rank_env.hpp"

using namespace trainctl::launch;

namespace {

struct FakeEnv {
  std::map<std::string, std::string> vars;
  Getenv getenv() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

}  // namespace

TEST_CASE("rank env: none without a launcher", "[launch]") {
  FakeEnv env{{{"HOME", "/root"}, {"SLURM_JOB_ID", "7"}}};
  const RankInfo info = rank_info_from_environment(env.getenv());
  CHECK(info.source == RankSource::none);
  CHECK_FALSE(info.launched());
  CHECK(info.rank == 0);
  CHECK(info.world_size == 1);
}

TEST_CASE("rank env: trainctl launcher variables come first", "[launch]") {
  FakeEnv env{{{"TRAINCTL_RANK", "1"},
               {"TRAINCTL_WORLD_SIZE", "4"},
               {"TRAINCTL_LOCAL_RANK", "1"},
               {"TRAINCTL_RENDEZVOUS", "/run/x/rendezvous/a1"},
               {"TRAINCTL_JOB_ID", "a1"},
               {"TRAINCTL_LAUNCHER_PID", "4242"},
               {"RANK", "3"},
               {"WORLD_SIZE", "8"},
               {"SLURM_PROCID", "5"},
               {"SLURM_NTASKS", "8"},
               {"SLURM_STEP_ID", "0"}}};
  const RankInfo info = rank_info_from_environment(env.getenv());
  CHECK(info.source == RankSource::trainctl);
  CHECK(info.rank == 1);
  CHECK(info.world_size == 4);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 4);
  CHECK(info.rendezvous == "/run/x/rendezvous/a1");
  CHECK(info.job_id == "a1");
  CHECK(info.launcher_pid == 4242);
}

TEST_CASE("rank env: TRAINCTL_ rank variables without the launcher's pid are named as left over",
          "[launch]") {
  // A shell started from a rank's environment keeps TRAINCTL_RANK and TRAINCTL_WORLD_SIZE: a
  // plain `trainctl run` there must not act as rank 1 of 2 and wait for a peer that never comes.
  FakeEnv stale{{{"TRAINCTL_RANK", "1"}, {"TRAINCTL_WORLD_SIZE", "2"}}};
  CHECK_THROWS_WITH(rank_info_from_environment(stale.getenv()),
                    Catch::Contains("TRAINCTL_RANK=1 and TRAINCTL_WORLD_SIZE=2 are in the "
                                    "environment, but TRAINCTL_LAUNCHER_PID is not") &&
                        Catch::Contains("left over") && Catch::Contains("unset TRAINCTL_RANK"));
  // In the real environment the launcher's pid must be this process's parent.
  ::setenv("TRAINCTL_RANK", "0", 1);
  ::setenv("TRAINCTL_WORLD_SIZE", "2", 1);
  ::setenv("TRAINCTL_LAUNCHER_PID", std::to_string(::getpid()).c_str(), 1);  // not the parent
  CHECK_THROWS_WITH(
      rank_info_from_environment(),
      Catch::Contains("TRAINCTL_LAUNCHER_PID=" + std::to_string(::getpid()) +
                      " is not this process's parent (" + std::to_string(::getppid()) + ")"));
  ::setenv("TRAINCTL_LAUNCHER_PID", std::to_string(::getppid()).c_str(), 1);
  CHECK(rank_info_from_environment().source == RankSource::trainctl);
  for (const char* name : {"TRAINCTL_RANK", "TRAINCTL_WORLD_SIZE", "TRAINCTL_LAUNCHER_PID"})
    ::unsetenv(name);
  CHECK(rank_info_from_environment().source == RankSource::none);
}

TEST_CASE("rank env: slurm inside a job step", "[launch]") {
  FakeEnv env{{{"SLURM_PROCID", "5"},
               {"SLURM_NTASKS", "6"},
               {"SLURM_LOCALID", "1"},
               {"SLURM_NODEID", "2"},
               {"SLURM_STEP_TASKS_PER_NODE", "2(x2),2"},
               {"SLURM_NODELIST", "node[01-03]"},
               {"SLURM_JOB_ID", "42"},
               {"SLURM_STEP_ID", "0"},
               {"SLURM_RESTART_COUNT", "3"},
               {"RANK", "0"},
               {"WORLD_SIZE", "1"}}};
  const RankInfo info = rank_info_from_environment(env.getenv());
  CHECK(info.source == RankSource::slurm);
  CHECK(info.rank == 5);
  CHECK(info.world_size == 6);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 2);
  CHECK(info.node_list == "node[01-03]");
  CHECK(info.job_id == "slurm-42.0");
  CHECK(info.restart_count == 3);
}

TEST_CASE("rank env: a slurm batch script (no step) is not a rank", "[launch]") {
  FakeEnv env{{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_JOB_ID", "42"}}};
  CHECK(rank_info_from_environment(env.getenv()).source == RankSource::none);
}

TEST_CASE("rank env: torchrun-style RANK/WORLD_SIZE", "[launch]") {
  FakeEnv env{{{"RANK", "2"},
               {"WORLD_SIZE", "4"},
               {"LOCAL_RANK", "0"},
               {"LOCAL_WORLD_SIZE", "2"},
               {"TORCHELASTIC_RUN_ID", "abc"},
               {"TORCHELASTIC_RESTART_COUNT", "1"}}};
  const RankInfo info = rank_info_from_environment(env.getenv());
  CHECK(info.source == RankSource::torchrun);
  CHECK(info.rank == 2);
  CHECK(info.world_size == 4);
  CHECK(info.local_rank == 0);
  CHECK(info.local_world_size == 2);
  CHECK(info.job_id == "torchrun-abc");
  CHECK(info.restart_count == 1);
  CHECK_FALSE(info.external_tcp_store);  // files in the run directory, unless the port is named
  FakeEnv with_port{{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TRAINCTL_STORE_PORT", "29500"}}};
  CHECK(rank_info_from_environment(with_port.getenv()).external_tcp_store);
}

TEST_CASE("rank env: inconsistent values name the variable", "[launch]") {
  FakeEnv bad_number{{{"TRAINCTL_RANK", "one"}, {"TRAINCTL_WORLD_SIZE", "2"}}};
  CHECK_THROWS_WITH(rank_info_from_environment(bad_number.getenv()),
                    Catch::Contains("TRAINCTL_RANK='one'"));
  FakeEnv too_big{{{"RANK", "4"}, {"WORLD_SIZE", "4"}}};
  CHECK_THROWS_WITH(rank_info_from_environment(too_big.getenv()),
                    Catch::Contains("RANK=4 is not below WORLD_SIZE=4"));
  FakeEnv missing_world{{{"TRAINCTL_RANK", "0"}}};
  CHECK_THROWS_AS(rank_info_from_environment(missing_world.getenv()), RankEnvError);
  FakeEnv bad_tasks{{{"SLURM_PROCID", "0"},
                     {"SLURM_NTASKS", "2"},
                     {"SLURM_STEP_ID", "0"},
                     {"SLURM_NTASKS_PER_NODE", "x"}}};
  CHECK_THROWS_WITH(rank_info_from_environment(bad_tasks.getenv()),
                    Catch::Contains("SLURM_NTASKS_PER_NODE='x'"));
}

TEST_CASE("rank env: slurm tasks per node", "[launch]") {
  CHECK(slurm_tasks_on_node("4", 0) == 4);
  CHECK(slurm_tasks_on_node("2(x3),1", 0) == 2);
  CHECK(slurm_tasks_on_node("2(x3),1", 2) == 2);
  CHECK(slurm_tasks_on_node("2(x3),1", 3) == 1);
  CHECK(slurm_tasks_on_node("2(x3),1", 4) == -1);
  CHECK(slurm_tasks_on_node("2(x", 0) == -1);
  CHECK(slurm_tasks_on_node("", 0) == -1);
}
