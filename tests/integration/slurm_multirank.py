#!/usr/bin/env python3
"""slurm:multirank: a 4-rank (dp 2 x tp 2) recipe submitted to two emulated nodes, 2 tasks each.

The job ends COMPLETED on both nodes (node[1-2]), every rank wrote logs/rank_<N>.log, and the
losses equal those of the same recipe started by trainctl's local launcher, bit for bit.

Skips (exit 77) when Slurm cannot be started here. Run as: slurm_multirank.py TRAINCTL REPO_ROOT.
"""
import os
import re
import subprocess

import cli_resume_util as ru
import cli_util
import slurm_util
from cli_util import check

STEPS = 6
LAYOUT = ["parallel.dp=2", "parallel.tp=2", "cluster.nodes=2"]


def settings():
    sets = [*cli_util.SMALL_MODEL, *ru.QUIET, *LAYOUT, f"training.steps={STEPS}",
            "checkpoint.every_steps=0"]
    return [a for s in sets for a in ("--set", s)]


def body(binary, root):
    with cli_util.temp_dir("slurm-multirank") as tmp, \
            slurm_util.local_slurm(root, nodes=2) as cluster:
        run_dir = os.path.join(tmp, "submitted")
        done = subprocess.run([binary, "submit", "recipes/tiny.yaml", *settings(), "--run-dir",
                               run_dir], cwd=root, env=cluster.env, capture_output=True,
                              text=True, timeout=60)
        check(done.returncode == 0, f"trainctl submit failed\n{done.stdout}{done.stderr}")
        match = re.fullmatch(r"submitted job (\d+), run directory \S+, log (\S+)\n", done.stdout)
        check(match, f"unexpected submit output: {done.stdout!r}")
        job_id, log = match.group(1), match.group(2)
        fields = cluster.wait_done(job_id, 120)
        text = open(log, encoding="utf-8", errors="replace").read() if os.path.exists(log) else ""
        check(fields["JobState"] == "COMPLETED", f"job {job_id} ended {fields['JobState']} "
              f"({fields.get('ExitCode')})\n{text}")
        check(fields.get("NodeList") == "node[1-2]",
              f"expected the job on node[1-2], it ran on {fields.get('NodeList')}")
        for rank in range(4):
            check(os.path.isfile(os.path.join(run_dir, "logs", f"rank_{rank}.log")),
                  f"no logs/rank_{rank}.log\n{text}")

        local_dir = os.path.join(tmp, "local")
        cli_util.run_ok(binary, ["run", "recipes/tiny.yaml", *settings(), "--run-dir", local_dir],
                        root)
        ru.check_same_run(local_dir, run_dir, STEPS, "4 ranks under Slurm vs the local launcher")


if __name__ == "__main__":
    cli_util.main_wrapper(body)
