#!/usr/bin/env python3
"""cli:run_resume_auto: `checkpoint.resume: auto` lets the same `trainctl run` command continue.

A run stopped by SIGTERM (exit 75, as under a Slurm requeue) is started again with the very same
command line:
  - without checkpoint.resume: auto, it exits 2 pointing at `trainctl resume DIR` and changes
    nothing in the run directory;
  - with it, it continues from the saved step ("resuming from step_..."), and the finished run
    equals a straight run, step by step and in its final weights;
  - once finished, the same command again exits 0 saying the run is complete, changing nothing.
"""
import os
import signal

import cli_resume_util as ru
import cli_util
from cli_util import check

STEPS = 12
STOP_AT = 3
EXTRA = ["checkpoint.every_steps=0", "checkpoint.keep_last=100"]


def snapshot(path):
    files = {}
    for name in cli_util.tree(path):
        full = os.path.join(path, name)
        files[name] = open(full, "rb").read() if os.path.isfile(full) else None
    return files


def main(binary, root):
    with cli_util.temp_dir("resume-auto") as tmp:
        reference = os.path.join(tmp, "straight")
        cli_util.run_ok(binary, ru.run_args(reference, STEPS, EXTRA), root)

        # Without auto: refused, pointing at `trainctl resume`.
        plain_dir = os.path.join(tmp, "never")
        plain = ru.run_args(plain_dir, STEPS, EXTRA)
        stopped = ru.stop_with_signal(binary, plain, root, plain_dir, STOP_AT, STEPS,
                                      signal.SIGTERM)
        before = snapshot(plain_dir)
        again = cli_util.run(binary, plain, root)
        expected = (f"trainctl run: error: run directory {plain_dir} holds checkpoints (newest: "
                    f"step_{stopped:08d}); continue the run with `trainctl resume {plain_dir}`, "
                    "set checkpoint.resume: auto, or pass --overwrite to start again (deleting "
                    "them)\n")
        check(again.rc == 2 and again.stderr == expected,
              f"expected exit code 2 and\n{expected}{again.describe()}")
        check(snapshot(plain_dir) == before, "the refused run changed the run directory")

        # With auto: the same command continues.
        auto_dir = os.path.join(tmp, "auto")
        auto = ru.run_args(auto_dir, STEPS, [*EXTRA, "checkpoint.resume=auto"])
        stopped = ru.stop_with_signal(binary, auto, root, auto_dir, STOP_AT, STEPS,
                                      signal.SIGTERM)
        continued = cli_util.run_ok(binary, auto, root)
        check(f"resuming from step_{stopped:08d}" in continued.stderr,
              f"the second run with checkpoint.resume: auto does not continue from "
              f"step_{stopped:08d}\n{continued.describe()}")
        check(cli_util.read_summary(auto_dir)["resumed_from_step"] == stopped,
              f"summary.json resumed_from_step is not {stopped}")
        ru.check_same_run(reference, auto_dir, STEPS,
                          f"stopped after step {stopped}, continued by the same run command")

        # Finished: the same command once more does nothing and says so.
        before = snapshot(auto_dir)
        done = cli_util.run_ok(binary, auto, root)
        check("the run is complete" in done.stderr,
              f"a third run of a finished run does not say it is complete\n{done.describe()}")
        check(snapshot(auto_dir) == before, "running a finished run again changed its directory")
        print(f"stopped after step {stopped}; the same run command continued it exactly")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
