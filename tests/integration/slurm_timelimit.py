#!/usr/bin/env python3
"""slurm:timelimit: a job that reaches its time limit saves, requeues, resumes and finishes.

The job asks for `slurm.time: 1` (minute, Slurm's minimum) and `slurm.signal_grace_s: 55`, so its
batch script gets `--signal=B:USR1@55`. Slurm sends that warning from slurmctld's time-limit check,
which runs every 30 s (first 30 s after slurmctld starts) and fires up to 30 s early: here it comes
at the first check after the job starts. Only the batch shell is signalled (B:); the script forwards
USR1 to srun, srun to the rank, which finishes its step, saves and exits 75; the script requeues
the job; the test lifts Slurm's 120 s requeue hold; the requeued job resumes and finishes.

Timing without a race: the test cannot know how fast the rank trains on a busy machine, so once
the rank has trained a step it is paused (SIGSTOP) until the batch shell logs the warning, then
continued (SIGCONT): the USR1 that srun sent meanwhile is pending and handled at the next step
boundary. A pause changes no number the run computes. The requeued job would get the same
one-minute limit and be warned again at the next check; the test gives it 5 minutes
(`scontrol update TimeLimit=5` while it is pending, with `StartTime=now`), as a user would.

Checks: the batch log shows the warning forwarded, "stopped by SIGUSR1 after step N", the
requeue and "resuming from step_N"; the job ends COMPLETED after exactly one requeue; every step
is in metrics.jsonl once and the run equals an uninterrupted one bit for bit.
Skips (exit 77) when Slurm cannot be started here. Run as: slurm_timelimit.py TRAINCTL REPO_ROOT.
"""
import os
import re
import signal

import cli_resume_util as ru
import cli_util
import slurm_util
from cli_util import check

STEPS = 30
SETS = [*cli_util.SMALL_MODEL, *ru.QUIET, f"training.steps={STEPS}", "checkpoint.every_steps=0",
        "checkpoint.keep_last=100", "slurm.time=1", "slurm.signal_grace_s=55"]


def body(binary, root):
    with cli_util.temp_dir("slurm-timelimit") as tmp, slurm_util.local_slurm(root) as cluster:
        run_dir = os.path.join(tmp, "limited")
        job_id, log = slurm_util.submit(cluster, binary, root, SETS, run_dir)
        script = slurm_util.read(os.path.join(run_dir, "submit.sbatch"))
        check("#SBATCH --time=1\n" in script and "#SBATCH --signal=B:USR1@55\n" in script,
              f"the script lacks the time limit or the warning signal\n{script}")
        # The uninterrupted reference trains while the job waits for its warning.
        reference = os.path.join(tmp, "straight")
        cli_util.run_ok(binary, ru.run_args(reference, STEPS), root)

        slurm_util.wait_for_text(log, r"^step 1/", "the rank's first step", 60, cluster)
        pids = slurm_util.task_pids(job_id, 0, binary)
        check(len(pids) == 1, f"expected one rank process of job {job_id}, found {pids}")
        os.kill(pids[0], signal.SIGSTOP)
        try:
            slurm_util.wait_for_text(log, r"SIGUSR1 received: asking the ranks to save",
                                     "the time-limit warning at the batch shell", 70, cluster)
        finally:
            os.kill(pids[0], signal.SIGCONT)

        cluster.release_requeued(job_id, 1, timeout=60, updates=["TimeLimit=5"])
        fields = cluster.wait_done(job_id, 60)
        text = slurm_util.read(log)
        check(fields["JobState"] == "COMPLETED" and fields.get("ExitCode") == "0:0",
              f"job {job_id} ended {fields['JobState']} ({fields.get('ExitCode')})\n{text}\n"
              f"{cluster.logs()}")
        check(fields.get("Restarts") == "1", f"expected one requeue, got {fields.get('Restarts')}")
        stopped = re.search(r"stopped by SIGUSR1 after step (\d+), checkpoint saved", text)
        check(stopped and int(stopped.group(1)) < STEPS,
              f"the log does not show a save on the warning before the end\n{text}")
        check("requeueing (requeue 1 of 3)" in text, f"the script did not requeue\n{text}")
        check(f"resuming from step_{int(stopped.group(1)):08d}" in text,
              f"the requeued job did not resume from the saved step\n{text}")
        check(": finished" in text, f"the log has no 'finished' line\n{text}")
        ru.check_same_run(reference, run_dir, STEPS, "run saved at its time limit and requeued")


if __name__ == "__main__":
    cli_util.main_wrapper(body)
