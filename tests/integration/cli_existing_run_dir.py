#!/usr/bin/env python3
"""cli:existing_run_dir: a second `run` into a run directory that already holds a run fails with
exit code 2 and leaves the old run untouched; with --overwrite it succeeds and the directory then
holds exactly the new run (no lines or event files left over from the old one)."""
import os
import shutil

import cli_util
from cli_util import check

STEPS = 3


def snapshot(run_dir):
    """Every file's bytes, by relative name."""
    files = {}
    for name in cli_util.tree(run_dir):
        path = os.path.join(run_dir, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                files[name] = f.read()
    return files


def main(binary, root):
    with cli_util.temp_dir("existing-run-dir") as tmp:
        run_dir = os.path.join(tmp, "run")
        args = cli_util.small_run_args(run_dir, STEPS, ["logging.eval_every_steps=0"])
        cli_util.run_ok(binary, args, root)
        before = snapshot(run_dir)

        # The finished run saved its last step: a new `run` points at `resume` instead.
        again = cli_util.run(binary, args, root)
        expected = (f"trainctl run: error: run directory {run_dir} holds checkpoints (newest: "
                    f"step_{STEPS:08d}); continue the run with `trainctl resume {run_dir}`, set "
                    "checkpoint.resume: auto, or pass --overwrite to start again (deleting them)\n")
        check(again.rc == 2, f"expected exit code 2\n{again.describe()}")
        check(again.stderr == expected,
              f"stderr differs\n--- expected ---\n{expected}--- got ---\n{again.stderr}")
        check(snapshot(run_dir) == before, "the refused run changed the existing run directory")

        # A run directory with metrics but no checkpoints (they were deleted by hand) is refused
        # too: it holds a run.
        shutil.rmtree(os.path.join(run_dir, "checkpoints"))
        before = snapshot(run_dir)
        again = cli_util.run(binary, args, root)
        expected = (f"trainctl run: error: run directory {run_dir} already holds a run "
                    "(metrics.jsonl); choose another with --run-dir or pass --overwrite to "
                    "replace it\n")
        check(again.rc == 2, f"expected exit code 2\n{again.describe()}")
        check(again.stderr == expected,
              f"stderr differs\n--- expected ---\n{expected}--- got ---\n{again.stderr}")
        check(snapshot(run_dir) == before, "the refused run changed the existing run directory")

        cli_util.run_ok(binary, [*args, "--overwrite"], root)
        records = cli_util.read_metrics(run_dir)
        check([r["step"] for r in records] == list(range(1, STEPS + 1)),
              f"after --overwrite metrics.jsonl holds steps {[r['step'] for r in records]}, "
              f"expected exactly 1..{STEPS} (old lines must be replaced, not appended to)")
        events = sorted(n for n in os.listdir(run_dir) if n.startswith("events.out.tfevents"))
        check(len(events) == 1, f"after --overwrite the run directory holds {len(events)} event "
              f"files {events}; TensorBoard would show the old run's steps twice")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
