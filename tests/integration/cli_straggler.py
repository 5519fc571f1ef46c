#!/usr/bin/env python3
"""cli:straggler_*: a rank slowed by a sleep hook (--debug-slow-rank RANK MS) is named.

named: a dp 2 run whose rank 1 sleeps 40 ms in every step's compute. Rank 0's log names rank 1,
  its host and how much slower it computed than the median rank, once per logging.every_steps
  window; metrics.jsonl carries every step's slowest rank (rank 1) with its compute time and the
  median's, and rank 0's communication share (rank 0 waits for rank 1 in its collectives) and
  its wait by group (adding up to comm_ms; TensorBoard's comm/<group>_ms).
off: the same run with logging.straggler_threshold: 0 names nobody, and still records the times.
"""
import os
import re
import socket

import cli_util
from cli_util import check

SETS = ["parallel.dp=2", "logging.every_steps=5", "checkpoint.every_steps=0"]


def slow_run(binary, root, run_dir, extra=()):
    args = cli_util.small_run_args(run_dir, 10, [*SETS, *extra]) + ["--debug-slow-rank", "1", "40"]
    cli_util.run_ok(binary, args, root)
    with open(os.path.join(run_dir, "logs", "rank_0.log"), encoding="utf-8") as f:
        return f.read(), cli_util.read_metrics(run_dir)


def case_named(binary, root, tmp):
    log, records = slow_run(binary, root, os.path.join(tmp, "run"))
    lines = re.findall(r"straggler: rank (\d+) on (\S+) computed ([\d.]+) ms a step, ([\d.]+)x "
                       r"the median rank's ([\d.]+) ms \(the slowest by more than 20% in (\d+) of "
                       r"the last (\d+) steps; the others waited for it\)", log)
    check(len(lines) == 2, f"expected one straggler line per 5-step window, got {lines}\n{log}")
    for rank, host, computed, ratio, median, count, window in lines:
        check(rank == "1" and host == socket.gethostname(), f"named rank {rank} on {host}")
        check(float(computed) >= 40 and float(computed) > float(median) * 1.2 and
              float(ratio) > 1.2, f"how much: {computed} ms vs {median} ms ({ratio}x)")
        check(window == "5" and int(count) >= 3, f"{count} of {window} steps")
    steps = [r for r in records if "slowest_rank" in r]
    check(len(steps) == 10, f"every step records the slowest rank: {records}")
    check(sum(r["slowest_rank"] == 1 for r in steps) >= 8, f"rank 1 slowest: {steps}")
    check(all(r["slowest_compute_ms"] >= r["median_compute_ms"] for r in steps), f"{steps}")
    check(all(0 <= r["comm_share"] <= 1 for r in records), f"comm_share: {records}")
    # Rank 0 waits for rank 1: most of its step is communication.
    check(sum(r["comm_share"] for r in records) / len(records) > 0.3,
          f"rank 0 should wait for rank 1: {[r['comm_share'] for r in records]}")
    # The wait by group: each group of more than one rank (dp 2: dp, dp_ep, world) and the waits
    # for the background reductions; on the training thread they add up to comm_ms.
    for r in records:
        groups = r["comm_ms_by_group"]
        check({"dp", "dp_ep", "world", "bg_wait"} <= set(groups) and
              abs(sum(groups.values()) - r["comm_ms"]) <= 0.05 + 1e-3 * r["comm_ms"],
              f"step {r['step']}: comm_ms_by_group {groups} must add up to comm_ms {r['comm_ms']}")
    import cli_tensorboard
    scalars = cli_tensorboard.load_scalars(os.path.join(tmp, "run"))
    check(len(scalars.get("comm/dp_ms", {})) == 10 and
          len(scalars.get("comm/bg_wait_ms", {})) == 10,
          f"TensorBoard carries each group's wait every step: {sorted(scalars)}")



def case_off(binary, root, tmp):
    log, records = slow_run(binary, root, os.path.join(tmp, "run"),
                            ["logging.straggler_threshold=0"])
    check("straggler:" not in log, f"threshold 0 names nobody\n{log}")
    check(all("slowest_rank" in r for r in records), f"the times are still recorded: {records}")


if __name__ == "__main__":
    cli_util.cases_main({"named": case_named, "off": case_off}, "straggler")
