#!/usr/bin/env python3
"""cli:reshard: a checkpoint saved by one layout resumes on another, and the run goes on as if it
had never stopped.

A run at dp2 x tp2 saves at step 10 (its schedule is that of a 20-step run) and stops. Copies of its
run directory resume to step 20 at pp2, at dp4, at dp2 with ZeRO-1, 2 and 3
(`trainctl resume DIR --set parallel...`; ZeRO-1 and 2 gather each step's parameters while the next
forward runs, ZeRO-3 each block's before it runs), at tp2 with sequence parallelism and at cp2
(context parallel) and at pp2 with the interleaved schedule (two model chunks per rank). All
eight continue the single-rank 20-step run within the layout tolerance: steps 11..20 have the same loss
and token count (the global sample position carried over, so no sample is skipped or repeated when
the number of data ranks changes from 2 to 1 or 4), and the final weights match. Each resumed
checkpoint's state says it has consumed exactly 20 * global_batch samples. A cp2 run's checkpoint
at step 10 resumes on one rank the same way, and an interleaved pp2 run's (rank 0 holding layers 0
and 2) on plain 1F1B over three stages."""
import json
import os
import shutil

import cli_layout_util as lu
import cli_util
from cli_util import check

STEPS = 20
HALF = 10
SCHEDULE = [f"schedule.decay_steps={STEPS}"]


def sampler_position(run_dir):
    """The global sample position in the manifest of run_dir's newest checkpoint."""
    checkpoints = os.path.join(run_dir, "checkpoints")
    newest = sorted(d for d in os.listdir(checkpoints) if d.startswith("step_"))[-1]
    with open(os.path.join(checkpoints, newest, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    return int(manifest["state"]["sampler"]["position"]), newest


def body(binary, root):
    with cli_util.temp_dir("reshard") as tmp:
        straight = os.path.join(tmp, "straight")
        lu.train(binary, root, straight, "gpt", "1", STEPS, SCHEDULE)
        want_weights = lu.final_weights(binary, root, straight)

        saved = os.path.join(tmp, "dp2-tp2")
        lu.train(binary, root, saved, "gpt", "dp2-tp2", HALF, SCHEDULE)
        lu.check_losses(straight, saved, "dp2-tp2 first half", 1, HALF)
        position, name = sampler_position(saved)
        check(position == HALF * 4, f"{saved}/checkpoints/{name} records sample position "
                                    f"{position}; expected {HALF} steps * 4 = {HALF * 4}")

        for target in ("pp2", "dp4", "dp2-zero1", "dp2-zero2", "dp2-zero3", "tp2-sp", "cp2",
                       "pp2-v2", "pp2-zb"):
            run_dir = os.path.join(tmp, f"resume-{target}")
            shutil.copytree(saved, run_dir)
            sets = ["parallel.dp=1", "parallel.tp=1", *lu.layout_sets(target),
                    f"training.steps={STEPS}"]
            result = cli_util.run_ok(
                binary, ["resume", run_dir, *[a for s in sets for a in ("--set", s)]], root)
            check(f"step {HALF}" in result.stderr or f"step_{HALF:08d}" in result.stderr,
                  f"resume at {target} does not say it continues from step {HALF}:\n"
                  f"{result.describe()}")
            label = f"dp2-tp2 -> {target}"
            lu.check_losses(straight, run_dir, label, 1, STEPS)
            lu.check_weights(want_weights, lu.final_weights(binary, root, run_dir), label)
            position, name = sampler_position(run_dir)
            check(position == STEPS * 4, f"{label}: {name} records sample position {position}; "
                                         f"expected {STEPS * 4}")

        # A context-parallel run's checkpoint resumes on one rank: the cp ranks held the same
        # weights, and the sample position is the data ranks' (cp ranks read the same samples).
        saved_cp = os.path.join(tmp, "cp2")
        lu.train(binary, root, saved_cp, "gpt", "cp2", HALF, SCHEDULE)
        lu.check_losses(straight, saved_cp, "cp2 first half", 1, HALF)
        run_dir = os.path.join(tmp, "resume-cp2-to-1")
        shutil.copytree(saved_cp, run_dir)
        sets = ["parallel.cp=1", f"training.steps={STEPS}"]
        cli_util.run_ok(binary, ["resume", run_dir, *[a for s in sets for a in ("--set", s)]], root)
        lu.check_losses(straight, run_dir, "cp2 -> 1", 1, STEPS)
        lu.check_weights(want_weights, lu.final_weights(binary, root, run_dir), "cp2 -> 1")
        position, name = sampler_position(run_dir)
        check(position == STEPS * 4, f"cp2 -> 1: {name} records sample position {position}; "
                                     f"expected {STEPS * 4}")

        # An interleaved run's checkpoint (two chunks per rank: rank 0 held layers 0 and 2)
        # resumes on plain 1F1B over three stages (layers 0-1, 2, 3).
        saved_v = os.path.join(tmp, "pp2-v2")
        lu.train(binary, root, saved_v, "gpt", "pp2-v2", HALF, SCHEDULE)
        lu.check_losses(straight, saved_v, "pp2-v2 first half", 1, HALF)
        run_dir = os.path.join(tmp, "resume-pp2-v2-to-pp3")
        shutil.copytree(saved_v, run_dir)
        sets = ["parallel.pp=3", "parallel.pp_schedule=1f1b", "parallel.pp_virtual=1",
                f"training.steps={STEPS}"]
        cli_util.run_ok(binary, ["resume", run_dir, *[a for s in sets for a in ("--set", s)]], root)
        lu.check_losses(straight, run_dir, "pp2-v2 -> pp3", 1, STEPS)
        lu.check_weights(want_weights, lu.final_weights(binary, root, run_dir), "pp2-v2 -> pp3")


if __name__ == "__main__":
    cli_util.main_wrapper(body)
