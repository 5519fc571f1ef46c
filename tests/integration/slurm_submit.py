#!/usr/bin/env python3
"""slurm:submit: `trainctl submit` against a real single-machine Slurm (scripts/slurm-local).

  (a) A single-rank small recipe submitted with `trainctl submit` runs to completion: the job
      ends COMPLETED with exit code 0, metrics.jsonl holds every step once, the log has the
      script's "finished" line, and the losses equal those of the same recipe run directly.
  (b) Preemption: `scancel --signal=USR1` on the running job reaches the rank, which saves and
      exits 75; the batch script requeues the job (SLURM_RESTART_COUNT 1), the test lifts Slurm's
      120 s requeue hold, and the requeued job resumes from the checkpoint and finishes. Every
      step appears once and equals the uninterrupted run bit for bit.

Skips (exit 77) when Slurm cannot be started here. Run as: slurm_submit.py TRAINCTL REPO_ROOT.
"""
import os
import re
import subprocess
import time

import cli_resume_util as ru
import cli_util
import slurm_util
from cli_util import check

STEPS_SHORT = 4
STEPS_LONG = 40  # long enough to signal the job mid-run on a busy machine


def settings(steps):
    sets = [*cli_util.SMALL_MODEL, *ru.QUIET, f"training.steps={steps}",
            "checkpoint.every_steps=0", "checkpoint.keep_last=100"]
    return [a for s in sets for a in ("--set", s)]


def submit(cluster, binary, root, run_dir, steps):
    done = subprocess.run([binary, "submit", "recipes/tiny.yaml", *settings(steps), "--run-dir",
                           run_dir], cwd=root, env=cluster.env, capture_output=True, text=True,
                          timeout=60)
    check(done.returncode == 0, f"trainctl submit failed ({done.returncode})\n{done.stdout}"
          f"{done.stderr}")
    match = re.fullmatch(r"submitted job (\d+), run directory (\S+), log (\S+)\n", done.stdout)
    check(match, f"unexpected submit output: {done.stdout!r}")
    check(match.group(2) == run_dir, f"submit used run directory {match.group(2)}, not {run_dir}")
    check(os.path.isfile(os.path.join(run_dir, "submit.sbatch")), "no submit.sbatch written")
    return match.group(1), match.group(3)


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def reference_run(binary, root, tmp, steps):
    run_dir = os.path.join(tmp, f"direct-{steps}")
    cli_util.run_ok(binary, ["run", "recipes/tiny.yaml", *settings(steps), "--run-dir", run_dir],
                    root)
    return run_dir


def check_completed(cluster, job_id, log, timeout):
    fields = cluster.wait_done(job_id, timeout)
    text = read(log) if os.path.exists(log) else "(no log)"
    check(fields["JobState"] == "COMPLETED" and fields.get("ExitCode") == "0:0",
          f"job {job_id} ended {fields['JobState']} with exit code {fields.get('ExitCode')}\n"
          f"--- {log} ---\n{text}")
    check(": finished" in text, f"the log has no 'finished' line\n{text}")
    return text


def body(binary, root):
    with cli_util.temp_dir("slurm-submit") as tmp, slurm_util.local_slurm(root) as cluster:
        # (a) a plain submit
        run_dir = os.path.join(tmp, "plain")
        job_id, log = submit(cluster, binary, root, run_dir, STEPS_SHORT)
        check(log == os.path.join(run_dir, "logs", f"slurm-{job_id}.out"), f"log path {log}")
        check_completed(cluster, job_id, log, 60)
        ru.check_same_run(reference_run(binary, root, tmp, STEPS_SHORT), run_dir, STEPS_SHORT,
                          "submitted run")

        # (b) preemption: signal, save, requeue, resume
        run_dir = os.path.join(tmp, "preempted")
        job_id, log = submit(cluster, binary, root, run_dir, STEPS_LONG)
        deadline = time.monotonic() + 60
        while not (os.path.exists(log) and re.search(r"^step 2/", read(log), re.M)):
            check(time.monotonic() < deadline, f"job {job_id} did not reach step 2 in 60 s\n"
                  f"{read(log) if os.path.exists(log) else '(no log)'}\n{cluster.logs()}")
            time.sleep(0.1)
        cluster.command(["scancel", "--signal=USR1", job_id])
        cluster.release_requeued(job_id, 1)
        text = check_completed(cluster, job_id, log, 90)
        stopped = re.search(r"stopped by SIGUSR1 after step (\d+), checkpoint saved", text)
        check(stopped and int(stopped.group(1)) < STEPS_LONG,
              f"the log does not show a save on SIGUSR1 before the end\n{text}")
        check("requeueing (requeue 1 of 3)" in text, f"the script did not requeue\n{text}")
        check(f"resuming from step_{int(stopped.group(1)):08d}" in text,
              f"the requeued job did not resume from the saved step\n{text}")
        check(cluster.job(job_id).get("Restarts") == "1", "expected exactly one requeue")
        ru.check_same_run(reference_run(binary, root, tmp, STEPS_LONG), run_dir, STEPS_LONG,
                          "preempted and requeued run")


if __name__ == "__main__":
    cli_util.main_wrapper(body)
