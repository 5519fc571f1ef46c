#!/usr/bin/env python3
"""slurm:failure: one rank of a 2-rank (dp 2) job is killed; the job fails naming the rank, nothing
keeps running, and `trainctl resume RUN_DIR` (outside Slurm, trainctl's own launcher) completes the
run from its last checkpoint.

Under srun there is no launcher of ours: the test finds rank 1 by the environment Slurm gave it
(SLURM_JOB_ID, SLURM_PROCID=1) once a checkpoint is committed, and SIGKILLs it. Then:
  - the job ends FAILED with a non-zero exit code, without a requeue;
  - its log names the rank on one line each: srun's "task 1: Killed", the surviving rank's error
    naming peer rank 1, and the batch script's "training failed: the step exited with code N";
  - no process of the job is left (rank 0 fails on its own; srun --wait=30 would kill it
    otherwise);
  - `trainctl resume RUN_DIR` exits 0; every step is in metrics.jsonl once and the run equals an
    uninterrupted one bit for bit.
Skips (exit 77) when Slurm cannot be started here. Run as: slurm_failure.py TRAINCTL REPO_ROOT.
"""
import os
import re
import signal
import subprocess
import time

import cli_resume_util as ru
import cli_util
import slurm_util
from cli_util import check

STEPS = 300  # long enough that the job is still training when the test kills a rank
# Saves 100 steps apart: the kill lands between two saves, where rank 0's next collective fails
# within milliseconds. A kill during a save made rank 0 wait for the dead rank's shard index until
# the collective timeout (60 s), and srun --wait=30 killed it first, without its error line.
SETS = [*cli_util.SMALL_MODEL, *ru.QUIET, f"training.steps={STEPS}", "parallel.dp=2",
        "checkpoint.every_steps=100", "checkpoint.keep_last=100", "checkpoint.async=false"]


def body(binary, root):
    with cli_util.temp_dir("slurm-failure") as tmp, slurm_util.local_slurm(root) as cluster:
        run_dir = os.path.join(tmp, "failed")
        job_id, log = slurm_util.submit(cluster, binary, root, SETS, run_dir)
        first = os.path.join(run_dir, "checkpoints", "step_00000100")
        deadline = time.monotonic() + 60
        while not os.path.isdir(first):
            check(time.monotonic() < deadline, f"no checkpoint step_00000100 within 60 s\n"
                  f"{slurm_util.read(log)}\n{cluster.logs()}")
            time.sleep(0.05)
        victims = slurm_util.task_pids(job_id, 1, binary)
        check(len(victims) == 1, f"expected one process of rank 1 in job {job_id}: {victims}")
        os.kill(victims[0], signal.SIGKILL)

        fields = cluster.wait_done(job_id, 60)
        text = slurm_util.read(log)
        shown = slurm_util.without_steps(text)
        check(fields["JobState"] == "FAILED" and fields.get("ExitCode") != "0:0",
              f"job {job_id} ended {fields['JobState']} ({fields.get('ExitCode')})\n{shown}")
        check(fields.get("Restarts") == "0", f"a failed rank must not requeue the job\n{shown}")
        check(re.search(r"^srun: error: \S+: task 1: Killed$", text, re.M),
              f"srun did not name task 1 in the log\n{shown}")
        check(re.search(r"^trainctl run: error: rank 0: .*\brank 1\b", text, re.M),
              f"rank 0's error does not name its peer rank 1 on one line\n{shown}")
        reason = re.search(r"^trainctl-slurm: job \d+ attempt 0: training failed: the step exited "
                           r"with code (\d+).*trainctl resume (\S+)$", text, re.M)
        check(reason and reason.group(1) != "0" and reason.group(2) == run_dir,
              f"the script's one-line reason is missing\n{shown}")
        deadline = time.monotonic() + 60  # generous: the claim is "none is left", not how fast
        while slurm_util.task_pids(job_id):
            check(time.monotonic() < deadline, f"processes of job {job_id} still run: "
                  f"{slurm_util.task_pids(job_id)}")
            time.sleep(0.1)

        # Outside Slurm: the local launcher starts both ranks again from the last checkpoint.
        env = dict(os.environ)
        for name in list(env):
            if name.startswith("SLURM_"):
                del env[name]
        resumed = subprocess.run([binary, *ru.resume_args(run_dir)], cwd=root, env=env,
                                 capture_output=True, text=True, timeout=300)
        check(resumed.returncode == 0, f"trainctl resume failed ({resumed.returncode})\n"
              f"{resumed.stdout}{resumed.stderr}")
        check(re.search(r"resuming from step_\d+ \(the newest valid checkpoint\)", resumed.stderr),
              f"resume did not start from a checkpoint\n{resumed.stderr}")
        reference = os.path.join(tmp, "straight")
        cli_util.run_ok(binary, ru.run_args(reference, STEPS, ["parallel.dp=2",
                                                               "checkpoint.every_steps=0"]), root)
        ru.check_same_run(reference, run_dir, STEPS, "run failed under Slurm, then resumed")


if __name__ == "__main__":
    cli_util.main_wrapper(body)
