#!/usr/bin/env python3
"""slurm:store_security: a 4-rank job (dp 2 x tp 2 over two emulated nodes, cluster.shared_fs:
false) meets through rank 0's TCP store while a stranger on the network tries to get in.

From the moment the job is submitted, the stranger (this test, with no access to the job's
environment) connects to the store's port again and again and answers each greeting with a proof
made of random bytes, and holds one more connection open after sending half a handshake. Checks:
  - the job ends COMPLETED, and its losses equal the same recipe under trainctl's local launcher;
  - every stranger's handshake got the refusal (one zero byte) and a closed connection; at least
    one reached the server while the ranks were meeting or training;
  - the job log counts the refusals ("... (wrong secret); 1 refused so far ... the job goes on",
    and "refused N connection(s) in all" with N at least the stranger's count);
  - the job's secret, read from a rank's environment as only the job's user (and root) can, is
    nowhere else: not in any process's command line (ps), the batch script, the job log, any file
    of the run directory (recipe.yaml, metrics.jsonl, summary.json, the rank logs).
Skips (exit 77) when Slurm cannot be started here. Run as: slurm_store_security.py TRAINCTL REPO.
"""
import os
import re
import time

import cli_resume_util as ru
import cli_util
import slurm_util
import store_util
from cli_util import check

STEPS = 60
EXTRA = ["parallel.dp=2", "parallel.tp=2", "cluster.nodes=2", "cluster.shared_fs=false",
         "checkpoint.every_steps=0"]
SETS = [*cli_util.SMALL_MODEL, *ru.QUIET, f"training.steps={STEPS}", *EXTRA]
def job_secret(job_id, binary, deadline):
    """TRAINCTL_STORE_SECRET from rank 0's environment, and every command line at that time."""
    while time.monotonic() < deadline:
        for pid in slurm_util.task_pids(job_id, 0, binary):
            secret = store_util.secret_of(pid)
            if secret is not None:
                return secret, store_util.command_lines()
        time.sleep(0.02)
    return None, ""


def body(binary, root):
    with cli_util.temp_dir("slurm-store-security") as tmp, \
            slurm_util.local_slurm(root, nodes=2) as cluster:
        run_dir = os.path.join(tmp, "submitted")
        job_id, log = slurm_util.submit(cluster, binary, root, SETS, run_dir)
        stranger = store_util.Stranger(20000 + int(job_id) % 10000)
        try:
            secret, ps = job_secret(job_id, binary, time.monotonic() + 60)
            fields = cluster.wait_done(job_id, 120)
        finally:
            stranger.finish()
        text = slurm_util.read(log)
        shown = slurm_util.without_steps(text)
        check(fields["JobState"] == "COMPLETED",
              f"job {job_id} ended {fields['JobState']} ({fields.get('ExitCode')})\n{shown}")
        store_util.check_refusals(stranger, text, shown, "the job log")

        check(secret and re.fullmatch(r"[0-9a-f]{64}", secret),
              f"no 64-digit TRAINCTL_STORE_SECRET in rank 0's environment: {secret!r}")
        check(secret not in ps, "the secret is on a command line that ps shows")
        check(secret not in text, "the secret is in the job log")
        leaks = store_util.files_holding(run_dir, secret.encode())
        check(not leaks, f"the secret is written in {leaks}")

        local_dir = os.path.join(tmp, "local")
        cli_util.run_ok(binary, ru.run_args(local_dir, STEPS, EXTRA), root)
        ru.check_same_run(local_dir, run_dir, STEPS, "TCP store with a stranger vs local")
        print(f"the stranger was refused {stranger.refused} times")


if __name__ == "__main__":
    cli_util.main_wrapper(body)
