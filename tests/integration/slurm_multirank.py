#!/usr/bin/env python3
"""slurm:multirank: a 4-rank (dp 2 x tp 2) recipe submitted to two emulated nodes, 2 tasks each.

The job ends COMPLETED on both nodes (node[1-2]); every rank wrote logs/rank_<N>.log whose first
line says which rank, local rank and node Slurm made it ("rank 3 of 4 (local rank 1 of 2) on
node2, via slurm": block distribution puts ranks 0-1 on node1 and 2-3 on node2) and which GPU index
it would take (its local rank); the same recipe under trainctl's local launcher logs "via trainctl"
on this host, and its losses equal the Slurm job's bit for bit (trainctl diff agrees), and so do the
data digests in provenance.json (the Slurm ranks each read a quarter and add their parts up).

Then `parallel: auto` under srun (a batch script of 2 nodes x 2 tasks running `srun trainctl run`):
every task plans for Slurm's world on its own, rank 0 says so ("for a world of 4 (slurm started 4
ranks on 2 nodes)"), the job completes, and it equals the layout it chose written out by hand under
the local launcher, bit for bit.

Skips (exit 77) when Slurm cannot be started here. Run as: slurm_multirank.py TRAINCTL REPO_ROOT.
"""
import json
import os
import re
import shlex
import socket
import subprocess

import cli_resume_util as ru
import cli_util
import slurm_util
from cli_util import check

STEPS = 6
LAYOUT = ["parallel.dp=2", "parallel.tp=2", "cluster.nodes=2"]


LAYOUT_SETTINGS_BASE = ["cluster.nodes=2"]


def settings(layout=None):
    layout = LAYOUT if layout is None else layout
    sets = [*cli_util.SMALL_MODEL, *ru.QUIET, *layout, f"training.steps={STEPS}",
            "checkpoint.every_steps=0"]
    return [a for s in sets for a in ("--set", s)]


def auto_settings():
    return settings([*LAYOUT_SETTINGS_BASE, "parallel=auto"])


def resolved_layout(run_dir):
    """The parallel.* values and micro_batch that run_dir/recipe.yaml records, as settings; the
    layout must be of 4 ranks."""
    with open(os.path.join(run_dir, "recipe.yaml"), encoding="utf-8") as f:
        text = f.read()
    block = re.search(r"^parallel:\n((?:  .*\n)+)", text, re.M)
    check(block and "parallel: auto" not in text, f"{run_dir}/recipe.yaml:\n{text}")
    keys = dict(re.findall(r"^  (\w+): (.*)$", block.group(1), re.M))
    world = 1
    for k in ("dp", "tp", "pp", "cp", "ep"):
        world *= int(keys[k])
    check(world == 4, f"parallel: auto under 4 Slurm tasks chose a layout of {world}: {keys}")
    micro = re.search(r"^  micro_batch: (\d+)$", text, re.M).group(1)
    return [f"parallel.{k}={keys[k]}" for k in ("dp", "tp", "pp", "cp", "ep", "zero",
                                                 "recompute", "sequence_parallel", "pp_schedule",
                                                 "pp_virtual")] + [f"training.micro_batch={micro}"]


def check_rank_lines(run_dir, where, context):
    """Each rank's log has "rank R of 4 " + where(R) as a line of its own."""
    for rank in range(4):
        path = os.path.join(run_dir, "logs", f"rank_{rank}.log")
        check(os.path.isfile(path), f"no logs/rank_{rank}.log\n{context}")
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        want = f"rank {rank} of 4 {where(rank)}"
        check(want in lines, f"{path} lacks the line {want!r}\n" + "\n".join(lines[:12]))
        others = [line for line in lines if re.fullmatch(r"rank \d+ of \d+ \(local rank .*", line)]
        check(others == [want], f"{path}: expected one rank line, found {others}")


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
        check_rank_lines(run_dir, lambda rank: f"(local rank {rank % 2} of 2) on node"
                         f"{rank // 2 + 1}, via slurm", text)

        local_dir = os.path.join(tmp, "local")
        cli_util.run_ok(binary, ["run", "recipes/tiny.yaml", *settings(), "--run-dir", local_dir],
                        root)
        host = socket.gethostname()
        check_rank_lines(local_dir, lambda rank: f"(local rank {rank} of 4) on {host}, via "
                         "trainctl", "")
        ru.check_same_run(local_dir, run_dir, STEPS, "4 ranks under Slurm vs the local launcher")
        # provenance.json's data digests: each Slurm rank read a quarter of the data and the
        # ranks added their parts up; the local launcher read it all. The same digests.
        digests = []
        for d in (run_dir, local_dir):
            with open(os.path.join(d, "provenance.json"), encoding="utf-8") as f:
                digests.append([(p["train_digest"], p["val_digest"])
                                for p in json.load(f)["segments"][0]["data"]])
        check(digests[0] == digests[1] and None not in digests[0][0],
              f"data digests: Slurm job {digests[0]}, local launcher {digests[1]}")
        same = cli_util.run(binary, ["diff", local_dir, run_dir, "--json"], root)
        check(same.rc == 0 and json.loads(same.stdout)["identical"],
              f"trainctl diff of the two runs\n{same.describe()}")

        # parallel: auto under srun: every task plans for Slurm's world (4 ranks, 2 a node) on
        # its own and reaches the same layout, which trains like that layout written out by hand
        # under the local launcher.
        auto_dir = os.path.join(tmp, "auto")
        script = os.path.join(tmp, "auto.sbatch")
        out = os.path.join(tmp, "auto-%j.out")
        command = [binary, "run", "recipes/tiny.yaml", *auto_settings(), "--run-dir", auto_dir]
        with open(script, "w", encoding="utf-8") as f:
            f.write("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n"
                    f"#SBATCH --output={out}\ncd {shlex.quote(root)} || exit 1\n"
                    f"srun --kill-on-bad-exit=0 --wait=30 {shlex.join(command)}\n")
        job_id = cluster.command(["sbatch", "--parsable", script]).strip().split(";")[0]
        fields = cluster.wait_done(job_id, 120)
        log = out.replace("%j", job_id)
        text = open(log, encoding="utf-8", errors="replace").read() if os.path.exists(log) else ""
        check(fields["JobState"] == "COMPLETED", f"the parallel: auto job {job_id} ended "
              f"{fields['JobState']} ({fields.get('ExitCode')})\n{text}")
        note = re.search(r"parallel: auto -> (.*) for a world of 4 \(slurm started 4 ranks on 2 "
                         r"nodes\)", text)
        check(note, f"rank 0 should say it planned for Slurm's world:\n{text}")
        layout = resolved_layout(auto_dir)
        by_hand = os.path.join(tmp, "auto-by-hand")
        cli_util.run_ok(binary, ["run", "recipes/tiny.yaml", *settings(LAYOUT_SETTINGS_BASE),
                                 *[a for s in layout for a in ("--set", s)], "--run-dir", by_hand],
                        root)
        ru.check_same_run(by_hand, auto_dir, STEPS, "parallel: auto under srun vs its layout")


if __name__ == "__main__":
    cli_util.main_wrapper(body)
