#!/usr/bin/env python3
"""cli:tiers_*: node-local checkpoint tiers (lib/run/local_tier.hpp) after a rank is killed.

A dp 2 run of the tiny GPT saves to the shared tier every 20 steps and to a node-local tier more
often; rank 1 is SIGKILLed mid-run, then `trainctl resume` continues from the freshest valid
tier, and the whole run equals a straight run bit for bit (every step's loss, lr and gradient
norm once, and the final weights).

memory:  memory tier (/dev/shm/trainctl-<uid>/<XXH3 of the run directory>) every step: the resume
         starts after the shared tier's step, from the memory tier; the tier is gone once the run
         is done.
corrupt: the same, with rank 1's copies in the memory tier damaged: each step is refused naming
         the rank, the file and the reason, and the shared tier's step 20 is used.
local:   the local-disk tier (checkpoint.local_dir) every 3 steps, no memory tier.
bad_input: the local tier without its folder or its cadence, or in a folder that cannot hold
         files: exit 2 naming the key, nothing created.
layout:  the killed run resumed at dp 1: the tier's copies belong to another layout, so the
         shared tier is used, saying why (then within the layout tolerance, not bit for bit).
"""
import os
import signal

import cli_layout_util
import cli_multirank_faults as mf
import cli_resume_util as ru
import cli_util
import multirank_util as mu
from cli_util import check

STEPS = 60
SHARED = ["checkpoint.every_steps=20"]


def memory_dir(run_dir):
    import xxhash
    key = xxhash.xxh3_64_intdigest(os.path.abspath(run_dir).encode())
    return os.path.join("/dev/shm", f"trainctl-{os.getuid()}", f"{key:016x}")


def steps_in(tier_dir):
    """The steps of which both ranks hold a copy (a rank killed mid-write, or before it pruned,
    leaves a step the other rank has not), oldest first."""
    if not os.path.isdir(tier_dir):
        return []
    return sorted(int(n[len("step_"):]) for n in os.listdir(tier_dir) if n.startswith("step_") and
                  all(os.path.isfile(os.path.join(tier_dir, n, f"rank_{r}.snapshot"))
                      for r in (0, 1)))


def killed_run(binary, root, run_dir, extra):
    """Starts the run, SIGKILLs rank 1 after step 30, and waits for the launcher to fail."""
    process = mf.start(binary, root, mu.tiny_run_args(run_dir, STEPS, [*SHARED, *extra]))
    pids = mf.rank_pids(run_dir)
    mf.wait_for_step(run_dir, 30, process)
    os.kill(pids[1], signal.SIGKILL)
    rc, _, err = mf.finish(process, 60)
    check(rc == 1 and "rank 1" in err, f"the launcher must fail naming rank 1, got {rc}\n{err}")
    check(mf.committed_steps(run_dir) == [20], f"shared tier: {mf.committed_steps(run_dir)}")


def straight(binary, root, tmp, extra):
    run_dir = os.path.join(tmp, "straight")
    cli_util.run_ok(binary, mu.tiny_run_args(run_dir, STEPS, [*SHARED, *extra]), root)
    return run_dir


def resume(binary, root, run_dir, sets=()):
    result = cli_util.run(binary, ru.resume_args(run_dir, sets), root, timeout=300)
    check(result.rc == 0, f"the resume failed\n{result.describe()}")
    return result.stderr + result.stdout


def resumed_from(output):
    for line in output.splitlines():
        if "resuming from " in line:
            return line
    raise cli_util.CheckFailed(f"no 'resuming from' line\n{output}")


MEMORY = ["checkpoint.memory_every_steps=1"]


def killed_with_memory_tier(binary, root, tmp):
    """killed_run with the memory tier every step: the run directory, the tier's folder and the
    steps both ranks hold there (after the shared tier's step 20)."""
    run_dir = os.path.join(tmp, "run")
    killed_run(binary, root, run_dir, MEMORY)
    tier = memory_dir(run_dir)
    held = steps_in(tier)
    check(held and held[-1] > 20, f"the memory tier {tier} holds steps {held}")
    return run_dir, tier, held


def case_memory(binary, root, tmp):
    extra = MEMORY
    run_dir, tier, held = killed_with_memory_tier(binary, root, tmp)
    output = resume(binary, root, run_dir)
    line = resumed_from(output)
    check(f"resuming from step_{held[-1]:08d} of the memory tier" in line, line)
    check(f"resumed from step_{held[-1]:08d} of the memory tier, newer than the shared tier's "
          "step 20" in output, output)
    ru.check_same_run(straight(binary, root, tmp, extra), run_dir, STEPS, "memory tier")
    check(not os.path.exists(tier), f"the memory tier {tier} outlived the run")


def case_corrupt(binary, root, tmp):
    extra = MEMORY
    run_dir, tier, held = killed_with_memory_tier(binary, root, tmp)
    # Rank 1's copy of every step both hold is damaged: the shared tier's step 20 is used.
    for step in held:
        damaged = os.path.join(tier, f"step_{step:08d}", "rank_1.snapshot")
        with open(damaged, "r+b") as f:
            f.seek(-5, os.SEEK_END)
            byte = f.read(1)
            f.seek(-5, os.SEEK_END)
            f.write(bytes([byte[0] ^ 0xFF]))
    output = resume(binary, root, run_dir)
    for step in held:
        check(f"the memory tier's step {step} was not used: rank 1: " in output and
              f"step_{step:08d}/rank_1.snapshot: the checksum of moment2 does not match "
              "(damaged)" in output, f"the damaged copy of step {step} must be named\n{output}")
    check("resuming from step_00000020 (the newest valid checkpoint)" in resumed_from(output),
          output)
    ru.check_same_run(straight(binary, root, tmp, extra), run_dir, STEPS, "fallback")


def case_local(binary, root, tmp):
    local = os.path.join(tmp, "local-disk")
    extra = [f"checkpoint.local_dir={local}", "checkpoint.local_every_steps=3"]
    run_dir = os.path.join(tmp, "run")
    killed_run(binary, root, run_dir, extra)
    check(not os.path.exists(memory_dir(run_dir)), "no memory tier was asked for")
    output = resume(binary, root, run_dir)
    check("of the local tier" in resumed_from(output), output)
    ru.check_same_run(straight(binary, root, tmp, extra), run_dir, STEPS, "local tier")
    check(os.listdir(local) == [], f"the local tier outlived the run: {os.listdir(local)}")


def case_layout(binary, root, tmp):
    extra = MEMORY
    run_dir, _, _ = killed_with_memory_tier(binary, root, tmp)
    output = resume(binary, root, run_dir, ["parallel.dp=1"])
    check("written with world_size 2, this run has 1" in output,
          f"the tier's copies of another layout must be refused with the reason\n{output}")
    check("resuming from step_00000020 (the newest valid checkpoint)" in resumed_from(output),
          output)
    check(not os.path.exists(memory_dir(run_dir)),
          "the memory tier (the dp 2 copies included) outlived the run")
    # Another layout sums in another order: within the layout tolerance (docs/architecture.md).
    cli_layout_util.check_losses(straight(binary, root, tmp, extra), run_dir, "other layout")


def case_bad_input(binary, root, tmp):
    run_dir = os.path.join(tmp, "run")
    for sets, words in (
            (["checkpoint.local_every_steps=5"],
             "checkpoint.local_every_steps = 5 writes the local-disk tier, but "
             "checkpoint.local_dir names no folder for it"),
            ([f"checkpoint.local_dir={tmp}/x"], "checkpoint.local_every_steps = 0 never writes it"),
            (["checkpoint.local_dir=/proc/tiers", "checkpoint.local_every_steps=5"],
             "checkpoint.local_dir /proc/tiers cannot hold the local-disk tier: /proc is on a proc "
             "file system")):
        cli_util.check_refused(binary, mu.tiny_run_args(run_dir, STEPS, sets), root, words,
                               run_dir)


if __name__ == "__main__":
    cli_util.cases_main({"memory": case_memory, "corrupt": case_corrupt, "local": case_local,
                         "layout": case_layout, "bad_input": case_bad_input}, "tiers")
