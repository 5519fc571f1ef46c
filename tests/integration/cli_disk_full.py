#!/usr/bin/env python3
"""cli:disk_full: a save that cannot be written fails clearly and harms no earlier checkpoint.

RLIMIT_FSIZE limits each file, and every checkpoint of a model has the same size, so the committed
checkpoint is made first without a limit: a 2-step run saves step_00000002. Then `trainctl resume
--set training.steps=6` runs with RLIMIT_FSIZE below one shard's size (trainctl ignores SIGXFSZ,
so write() fails with EFBIG): the save of step 4 fails, the run exits 1 with a message naming the
file and "File too large", leaves no temporary directory, and step_00000002 and checkpoints/latest
are byte for byte as before (`trainctl ckpt verify` passes). Resuming without the limit then
completes the run, equal to a straight 6-step run."""
import os
import re
import resource
import subprocess

import cli_resume_util as ru
import cli_util
from cli_util import check

STEPS = 6
EXTRA = [f"schedule.decay_steps={STEPS}", "checkpoint.every_steps=2", "checkpoint.keep_last=100"]
LIMIT_BYTES = 512 * 1024  # the small model's shard is about 1.6 MiB; logs stay far below this


def checkpoint_bytes(run_dir):
    checkpoints = os.path.join(run_dir, "checkpoints")
    files = {}
    for name in cli_util.tree(checkpoints):
        path = os.path.join(checkpoints, name)
        files[name] = open(path, "rb").read() if os.path.isfile(path) else None
    return files


def limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, LIMIT_BYTES))


def main(binary, root):
    with cli_util.temp_dir("disk-full") as tmp:
        reference = os.path.join(tmp, "straight")
        cli_util.run_ok(binary, ru.run_args(reference, STEPS, EXTRA), root)

        run_dir = os.path.join(tmp, "limited")
        cli_util.run_ok(binary, ru.run_args(run_dir, 2, EXTRA), root)
        shard = os.path.join(run_dir, "checkpoints", "step_00000002", "rank_0.bin")
        check(os.path.getsize(shard) > LIMIT_BYTES,
              f"{shard} has {os.path.getsize(shard)} bytes, not more than the limit "
              f"{LIMIT_BYTES}: the test would not hit the limit")
        before = checkpoint_bytes(run_dir)

        args = [binary, *ru.resume_args(run_dir, [f"training.steps={STEPS}"])]
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        # preexec_fn: the limit applies to the child alone.
        completed = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True,
                                   timeout=120, preexec_fn=limit_file_size)
        failed = cli_util.Result(args, completed)
        check(failed.rc == 1, f"a save that hits the file size limit must exit 1 (not killed by "
              f"SIGXFSZ, not 0)\n{failed.describe()}")
        tmp_prefix = re.escape(os.path.join(run_dir, "checkpoints", ".tmp-step_00000004."))
        check(re.search(rf"trainctl resume: error: saving a checkpoint failed: cannot write "
                        rf"{tmp_prefix}\d+/rank_0\.bin: File too large", failed.stderr),
              f"expected an error naming .tmp-step_00000004.<pid>/rank_0.bin and 'File too "
              f"large'\n{failed.describe()}")
        check(f"the newest good checkpoint is step_00000002; after fixing the cause, continue "
              f"with: trainctl resume {run_dir}" in failed.stderr,
              f"expected the way forward (the newest good checkpoint and the resume command)\n"
              f"{failed.describe()}")
        # The background save's failure stops the run as soon as it is known (the next step's
        # poll, or at the latest the next save): the run never reports itself done.
        check("done:" not in failed.stderr,
              f"the run finished after the failed save\n{failed.describe()}")
        check(checkpoint_bytes(run_dir) == before,
              f"the failed save changed checkpoints/ (a leftover temporary directory or a touched "
              f"earlier checkpoint): before {sorted(before)}, after "
              f"{sorted(checkpoint_bytes(run_dir))}")

        verified = cli_util.run_ok(binary, ["ckpt", "verify", run_dir], root)
        check(re.search(r"^OK step_00000002: ", verified.stdout + verified.stderr, re.MULTILINE),
              f"`trainctl ckpt verify` does not report step_00000002 OK\n{verified.describe()}")

        resumed = cli_util.run_ok(binary, ru.resume_args(run_dir, [f"training.steps={STEPS}"]),
                                  root)
        check("resuming from step_00000002" in resumed.stderr,
              f"resume does not continue from step_00000002\n{resumed.describe()}")
        ru.check_same_run(reference, run_dir, STEPS, "failed save at step 4, then resumed")
        print("save at step 4 failed with EFBIG; step 2 intact; resumed run equals straight run")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
