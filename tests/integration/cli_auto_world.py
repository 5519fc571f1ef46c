#!/usr/bin/env python3
"""cli:auto_world_*: `parallel: auto` plans for the world the job has, and trains it.

local:     `run --ranks 2` with parallel: auto: the planner's layout for 2 CPU ranks of this machine
           (a layout of 2 ranks), the note says which world and why (the next layout and what it
           loses), trainctl starts the 2 ranks, recipe.yaml records the layout, and the run equals
           the same layout written out by hand, bit for bit. `trainctl plan --ranks 2` ranks the
           same layout first.
torchrun:  two processes started as a torchrun-style launcher would (RANK, WORLD_SIZE,
           LOCAL_RANK, LOCAL_WORLD_SIZE), each planning on its own: both reach the same layout,
           rank 0 says the launcher's world was planned for, and the run equals the local one
           bit for bit.
submit:    `submit --ranks 4` on 2 CPU nodes and `submit` for 2 GPU nodes of a cluster file plan
           for the tasks the job asks for, and the batch script asks for that many; without
           --ranks, with a --ranks that the nodes do not divide, or GPUs without a cluster file:
           exit 2.
bad_input: --ranks with an explicit layout of another size, --ranks against a launcher's world,
           --ranks 0, and `plan --ranks` for a GPU cluster: exit 2 naming the value, nothing
           created. Ranks that run different recipes (another --set on one of them) stop with
           both recipes named, instead of building mismatched groups.

(Under Slurm: slurm_multirank.py's srun case.)
"""
import os
import re
import subprocess

import cli_resume_util as ru
import cli_util
import multirank_util as mu
from cli_util import check

STEPS = 4
SETS = [*cli_util.SMALL_MODEL, *ru.QUIET, f"training.steps={STEPS}", "checkpoint.every_steps=0"]
AUTO = [*SETS, "parallel=auto"]
H100 = "configs/clusters/dgx-h100.yaml"


def args_of(sets, run_dir, *extra):
    return ["run", "recipes/tiny.yaml", *[a for s in sets for a in ("--set", s)], "--run-dir",
            run_dir, *extra]


def resolved_parallel(run_dir):
    """The parallel.* degrees and micro_batch recipe.yaml records, as KEY=VALUE settings."""
    with open(os.path.join(run_dir, "recipe.yaml"), encoding="utf-8") as f:
        text = f.read()
    check("parallel: auto" not in text and "automatic" not in text,
          f"{run_dir}/recipe.yaml does not record the layout that ran:\n{text}")
    block = re.search(r"^parallel:\n((?:  .*\n)+)", text, re.M)
    check(block, f"no parallel section in {run_dir}/recipe.yaml")
    keys = dict(re.findall(r"^  (\w+): (.*)$", block.group(1), re.M))
    micro = re.search(r"^  micro_batch: (\d+)$", text, re.M)
    sets = [f"parallel.{k}={keys[k]}" for k in ("dp", "tp", "pp", "cp", "ep", "zero", "recompute",
                                               "sequence_parallel", "pp_schedule", "pp_virtual")]
    world = 1
    for k in ("dp", "tp", "pp", "cp", "ep"):
        world *= int(keys[k])
    return sets + [f"training.micro_batch={micro.group(1)}"], world


def torchrun(binary, root, rank_args, job):
    """Starts one process per entry of rank_args as a torchrun-style launcher would (RANK,
    WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID=job), all on this machine;
    returns each one's (exit code, stdout + stderr)."""
    world = len(rank_args)
    procs = []
    for rank, args in enumerate(rank_args):
        env = mu.rank_free_env()
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), TORCHELASTIC_RUN_ID=job)
        procs.append(subprocess.Popen([binary, *args], cwd=root, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    ended = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        ended.append((p.returncode, out + err))
    return ended


def note_of(output):
    match = re.search(r"^.*parallel: auto -> .*$", output, re.M)
    check(match, f"no 'parallel: auto ->' note in the output:\n{output}")
    return match.group(0)


def case_local(binary, root, tmp):
    run_dir = os.path.join(tmp, "auto")
    result = cli_util.run_ok(binary, args_of(AUTO, run_dir, "--ranks", "2"), root, timeout=300)
    note = note_of(result.stdout + result.stderr)
    check("for a world of 2 (--ranks 2)" in note and "ranked first of" in note and "next, " in note,
          f"the note must name the world, where it came from, and why this layout:\n{note}")
    layout, world = resolved_parallel(run_dir)
    check(world == 2, f"parallel: auto for 2 ranks chose a layout of {world} ranks: {layout}")
    check(os.path.isfile(os.path.join(run_dir, "logs", "rank_1.log")),
          f"no rank 1 ran: {cli_util.tree(run_dir)}")
    chosen = re.search(r"-> (tp=\S+ pp=\S+ dp=\S+)", note).group(1)
    plan = cli_util.run_ok(binary, ["plan", "recipes/tiny.yaml",
                                    *[a for s in AUTO for a in ("--set", s)], "--ranks", "2"], root)
    check("2 CPU ranks" in plan.stderr and f"best: {chosen}" in plan.stdout,
          f"plan --ranks 2 should rank {chosen} first\n{plan.describe()}")
    by_hand = os.path.join(tmp, "by-hand")
    cli_util.run_ok(binary, args_of([*SETS, *layout], by_hand), root, timeout=300)
    ru.check_same_run(by_hand, run_dir, STEPS, "parallel: auto --ranks 2 vs its layout by hand")


def case_torchrun(binary, root, tmp):
    run_dir = os.path.join(tmp, "torchrun")
    ended = torchrun(binary, root, [args_of(AUTO, run_dir)] * 2, "auto-world")
    for rc, output in ended:
        check(rc == 0, f"a torchrun-style rank exited {rc}\n{output}")
    note = note_of(ended[0][1])
    check("for a world of 2 (torchrun started 2 ranks)" in note,
          f"rank 0 should plan for the launcher's world:\n{note}")
    layout, world = resolved_parallel(run_dir)
    check(world == 2, f"a layout of {world} ranks for torchrun's 2: {layout}")
    local = os.path.join(tmp, "local")
    cli_util.run_ok(binary, args_of(AUTO, local, "--ranks", "2"), root, timeout=300)
    ru.check_same_run(local, run_dir, STEPS, "parallel: auto under torchrun vs --ranks 2")


def case_submit(binary, root, tmp):
    # CPU nodes: --ranks over cluster.nodes; the batch script asks for the planned world.
    run_dir = os.path.join(tmp, "submitted")
    result = cli_util.run_ok(binary, ["submit", "recipes/tiny.yaml",
                                      *[a for s in [*AUTO, "cluster.nodes=2"] for a in ("--set", s)],
                                      "--ranks", "4", "--run-dir", run_dir, "--dry-run"], root)
    note = note_of(result.stderr)
    check("for a world of 4 (submit: 4 tasks on 2 nodes)" in note,
          f"submit should plan for the tasks it asks for:\n{note}")
    check("#SBATCH --nodes=2\n" in result.stdout and "#SBATCH --ntasks-per-node=2\n" in
          result.stdout, f"the script should ask for 2 nodes of 2 tasks\n{result.stdout}")
    check(not os.path.exists(run_dir), "--dry-run created the run directory")
    # GPU nodes: cluster.nodes x cluster.gpus_per_node of the cluster file's GPUs.
    gpu = [*AUTO, "cluster.nodes=2", "cluster.device=cuda", "cluster.gpus_per_node=8",
           f"cluster.file={H100}"]
    result = cli_util.run_ok(binary, ["submit", "recipes/tiny.yaml",
                                      *[a for s in gpu for a in ("--set", s)], "--run-dir",
                                      run_dir, "--dry-run"], root)
    check("for a world of 16 (submit: 16 tasks on 2 nodes)" in note_of(result.stderr)
          and "dgx-h100" in result.stderr and "#SBATCH --gpus-per-node=8" in result.stdout,
          f"submit for 2 DGX H100 nodes\n{result.describe()}")
    for sets, extra, words in (
            ([*AUTO, "cluster.nodes=2"], [], "pass --ranks N with N a multiple of cluster.nodes"),
            ([*AUTO, "cluster.nodes=2"], ["--ranks", "3"], "(got --ranks 3)"),
            ([*AUTO, "cluster.device=cuda", "cluster.gpus_per_node=8"], [], "cluster.file")):
        args = ["submit", "recipes/tiny.yaml", *[a for s in sets for a in ("--set", s)],
                "--run-dir", run_dir, "--dry-run", *extra]
        cli_util.check_refused(binary, args, root, words, run_dir)


def case_bad_input(binary, root, tmp):
    target = os.path.join(tmp, "refused")
    cli_util.check_refused(binary, args_of([*SETS, "parallel.dp=2"], target, "--ranks", "3"),
                           root, "--ranks 3 sets the world that parallel: auto plans for", target)
    result = cli_util.run(binary, args_of(AUTO, target, "--ranks", "0"), root)
    check(result.rc == 2 and "--ranks" in result.stderr and not os.path.exists(target),
          f"--ranks 0: expected exit 2 naming --ranks\n{result.describe()}")
    env = mu.rank_free_env()
    env.update(RANK="0", WORLD_SIZE="3")
    done = subprocess.run([binary, *args_of(AUTO, target, "--ranks", "2")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    check(done.returncode == 2 and "--ranks 2, but torchrun started 3 ranks" in done.stderr
          and not os.path.exists(target),
          f"--ranks against a launcher's world: expected exit 2\n{done.stdout}{done.stderr}")
    result = cli_util.run(binary, ["plan", "recipes/tiny.yaml", "--cluster", H100, "--ranks", "2"],
                          root)
    check(result.rc == 2 and "--ranks 2 plans CPU ranks" in result.stderr,
          f"plan --ranks for a GPU cluster: expected exit 2\n{result.describe()}")
    # Two torchrun-style ranks whose recipes differ (rank 1 has another seed): rank 1 stops
    # naming both recipes before any group forms; rank 0 then times out waiting for it.
    run_dir = os.path.join(tmp, "disagree")
    ended = torchrun(binary, root, [args_of([*SETS, "parallel.dp=2", "parallel.timeout_s=5",
                                             f"determinism.seed={1 + rank}"], run_dir)
                                    for rank in range(2)], "disagree")
    check(ended[1][0] != 0 and "rank 1 runs the recipe" in ended[1][1]
          and "and rank 0 the recipe" in ended[1][1],
          f"rank 1 with another recipe: exit {ended[1][0]}\n{ended[1][1]}")
    check(ended[0][0] != 0, f"rank 0 should not train alone\n{ended[0][1]}")


if __name__ == "__main__":
    cli_util.cases_main({"local": case_local, "torchrun": case_torchrun, "submit": case_submit,
                         "bad_input": case_bad_input}, "auto_world")
