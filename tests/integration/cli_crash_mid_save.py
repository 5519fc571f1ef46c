#!/usr/bin/env python3
"""cli:crash_mid_save: SIGKILL in the middle of writing a checkpoint loses nothing committed.

A run saves every 2 steps with --debug-save-delay-ms slowing each tensor written, and is
killed (SIGKILL: no handler runs) while checkpoints/.tmp-step_00000004.<pid>/ is being written and
step_00000002 is committed. `trainctl resume` then says it skipped the temporary directory, moves
it to checkpoints/rejected/ untouched, continues from step_00000002, and the finished run equals
a run that never crashed, step by step and in its final weights."""
import glob
import os
import signal
import subprocess
import time

import cli_resume_util as ru
import cli_util
from cli_util import check

STEPS = 8
EXTRA = [f"schedule.decay_steps={STEPS}", "checkpoint.every_steps=2", "checkpoint.keep_last=100"]
DELAY_MS = 10  # per slice: about 1 s a save for the small model's 112 tensors


def snapshot(path):
    """Every file's bytes under `path`, by relative name."""
    files = {}
    for name in cli_util.tree(path):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                files[name] = f.read()
    return files


def size_or_zero(path):
    """The file's size; 0 when it went away (a save that committed between glob and stat)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def kill_mid_save(binary, root, run_dir):
    """Starts the slowed run and SIGKILLs it once step 4's temporary directory holds a shard that
    is being written while step 2 is committed. Returns the temporary directory's name."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    args = [*ru.run_args(run_dir, STEPS, EXTRA), f"--debug-save-delay-ms={DELAY_MS}"]
    process = subprocess.Popen([binary, *args], cwd=root, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    checkpoints = os.path.join(run_dir, "checkpoints")
    deadline = time.monotonic() + 60
    tmp = None
    try:
        while time.monotonic() < deadline and process.poll() is None:
            shards = glob.glob(os.path.join(checkpoints, ".tmp-step_00000004.*", "rank_0.bin"))
            committed = os.path.isfile(os.path.join(checkpoints, "step_00000002", "manifest.json"))
            if shards and committed and size_or_zero(shards[0]) > 64:
                process.send_signal(signal.SIGKILL)
                tmp = os.path.basename(os.path.dirname(shards[0]))
                break
            time.sleep(0.002)
    finally:
        if process.poll() is None and tmp is None:
            process.kill()
        _, stderr = process.communicate()
    check(tmp is not None, f"never saw step 4's checkpoint being written after step 2's commit "
          f"(exit code {process.returncode}); found {ru.checkpoint_names(run_dir)}\n{stderr}")
    check(process.returncode == -signal.SIGKILL,
          f"expected the run to die of SIGKILL, exit code {process.returncode}\n{stderr}")
    return tmp


def main(binary, root):
    with cli_util.temp_dir("crash-mid-save") as tmp_root:
        reference = os.path.join(tmp_root, "straight")
        cli_util.run_ok(binary, ru.run_args(reference, STEPS, EXTRA), root)

        run_dir = os.path.join(tmp_root, "crashed")
        tmp = kill_mid_save(binary, root, run_dir)
        checkpoints = os.path.join(run_dir, "checkpoints")
        check(not os.path.exists(os.path.join(checkpoints, "step_00000004")),
              "step_00000004 exists although its save was killed before the commit")
        with open(os.path.join(checkpoints, "latest"), encoding="utf-8") as f:
            latest = f.read().strip()
        check(latest == "step_00000002", f"checkpoints/latest says {latest!r} after the kill, "
              "expected step_00000002 (it moves only after a commit)")
        partial = snapshot(os.path.join(checkpoints, tmp))
        check("manifest.json" not in partial,
              f"the killed save's {tmp} already has a manifest: the kill came too late")

        resumed = cli_util.run_ok(binary, ru.resume_args(run_dir), root)
        rejected = os.path.join(checkpoints, "rejected", tmp)
        expected = f"skipped {tmp} ("
        lines = [l for l in resumed.stderr.splitlines() if l.startswith(expected)]
        check(len(lines) == 1 and lines[0].endswith(f": moved to {rejected}, never read"),
              f"expected one line 'skipped {tmp} (reason): moved to {rejected}, never read'\n"
              f"{resumed.describe()}")
        check("resuming from step_00000002" in resumed.stderr,
              f"resume does not continue from step_00000002\n{resumed.describe()}")
        check(not os.path.exists(os.path.join(checkpoints, tmp)),
              f"{tmp} is still in checkpoints/ after resume")
        check(os.path.isdir(rejected), f"{rejected} is missing: the partial save was not kept")
        check(snapshot(rejected) == partial, f"{rejected} changed: the partial save was touched")
        check(cli_util.read_summary(run_dir)["resumed_from_step"] == 2,
              "summary.json: resumed_from_step is not 2")
        ru.check_same_run(reference, run_dir, STEPS, "killed mid-save at step 4, resumed")
        print(f"killed while writing {tmp}; resumed from step_00000002; equal to the straight run")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
