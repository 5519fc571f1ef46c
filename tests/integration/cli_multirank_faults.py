#!/usr/bin/env python3
"""cli:multirank_faults: the local launcher and its supervision, end to end, on a tiny fp32 GPT at
dp2 (two rank processes started by `trainctl run` itself).

  - a clean run: exit 0, logs/rank_0.log and rank_1.log, one progress display (rank 0's), one
    metrics record per step;
  - SIGKILL of one rank mid-run: the launcher exits 1 within seconds naming the rank and
    "signal 9", no process of the run is left, the last checkpoint verifies, resume finishes;
  - SIGSTOP of one rank (parallel.timeout_s: 3): the launcher exits 1 within the timeout
    plus the grace period, naming the collective and the silent rank; nothing is left running;
    the last checkpoint verifies and resume finishes;
  - SIGINT to the launcher: every rank saves the same step and exits 75; resume finishes;
  - cluster.shared_fs: false: the ranks meet through the TCP store the launcher serves; a
    stranger knocking on it is refused and counted while the run goes on; the secret is in no
    command line, output or file of the run directory;
  - layout errors (world size of an external launcher, tp not dividing heads) and a Slurm rank
    without (or with a malformed) TRAINCTL_STORE_SECRET where the ranks meet through the TCP
    store: exit 2 before any process starts, no run directory created.
Usage: cli_multirank_faults.py TRAINCTL_BINARY REPO_ROOT [CASE...] (all cases by default)."""
import json
import os
import re
import signal
import subprocess
import time

import cli_util
import multirank_util as mu
import store_util
from cli_util import check

STEPS = 400  # about 10 ms a step: long enough to hit a run mid-way


def run_args(run_dir, steps=STEPS, extra=(), layout=("parallel.dp=2",)):
    return mu.tiny_run_args(run_dir, steps, extra, layout)


def check_nothing_left(run_dir):
    deadline = time.monotonic() + 10  # the launcher reaped them all: generous, not a race
    left = mu.processes_of_run(run_dir)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = mu.processes_of_run(run_dir)
    check(not left, f"processes of the run are still alive after the launcher exited: {left}")


def start(binary, root, args):
    """Starts the launcher in the background; its output goes to files (a pipe nobody reads
    would block rank 0's progress output once full)."""
    run_dir = args[args.index("--run-dir") + 1]
    out = open(run_dir + ".stdout", "w+")
    err = open(run_dir + ".stderr", "w+")
    process = subprocess.Popen([binary, *args], cwd=root, env=mu.rank_free_env(), stdout=out,
                               stderr=err, text=True)
    process.output_files = (out, err)
    return process


def finish(process, timeout):
    out, err = process.output_files
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        err.seek(0)
        raise cli_util.CheckFailed(f"the launcher did not exit within {timeout} s\n{err.read()}")
    out.seek(0)
    err.seek(0)
    texts = out.read(), err.read()
    out.close()
    err.close()
    return process.returncode, texts[0], texts[1]


def rank_pids(run_dir, timeout=30):
    """The pids of logs/ranks.json once the launcher has written it."""
    path = os.path.join(run_dir, "logs", "ranks.json")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.isfile(path):
            with open(path) as f:
                return [r["pid"] for r in json.load(f)["ranks"]]
        time.sleep(0.02)
    raise cli_util.CheckFailed(f"{path} did not appear within {timeout} s")


def wait_for_step(run_dir, step, process, timeout=60):
    """Waits until metrics.jsonl holds `step` (training is under way)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check(process.poll() is None, "the run ended before the fault could be injected:\n" +
              log_text(run_dir, 0))
        if os.path.isfile(path):
            with open(path) as f:
                if sum(1 for _ in f) >= step:
                    return
        time.sleep(0.02)
    raise cli_util.CheckFailed(f"step {step} not reached within {timeout} s")


def log_text(run_dir, rank):
    try:
        with open(os.path.join(run_dir, "logs", f"rank_{rank}.log")) as f:
            return f.read()
    except OSError as error:
        return str(error)


def committed_steps(run_dir):
    path = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(path):
        return []
    return sorted(int(n[len("step_"):]) for n in os.listdir(path)
                  if n.startswith("step_") and
                  os.path.isfile(os.path.join(path, n, "manifest.json")))


def check_resume_finishes(binary, root, run_dir):
    verify = cli_util.run(binary, ["ckpt", "verify", run_dir], root, timeout=120)
    check(verify.rc == 0, f"the checkpoints do not verify\n{verify.describe()}")
    resumed = cli_util.run(binary, ["resume", run_dir], root, timeout=300)
    check(resumed.rc == 0, f"resume did not finish\n{resumed.describe()}")
    steps = [r["step"] for r in cli_util.read_metrics(run_dir)]
    check(steps == list(range(1, STEPS + 1)),
          f"metrics.jsonl after resume should hold steps 1..{STEPS} once each, got {steps}")
    return resumed


def case_clean(binary, root, tmp):
    run_dir = os.path.join(tmp, "clean")
    result = cli_util.run(binary, run_args(run_dir, steps=6), root, timeout=300)
    check(result.rc == 0, f"a dp2 run should exit 0\n{result.describe()}")
    for rank in (0, 1):
        log = os.path.join(run_dir, "logs", f"rank_{rank}.log")
        check(os.path.isfile(log), f"{log} is missing")
        with open(log) as f:
            text = f.read()
        check(f"rank {rank} of 2" in text, f"{log} does not say which rank wrote it:\n{text}")
        check("OPENBLAS_NUM_THREADS=" in text, f"{log} does not record the BLAS threads:\n{text}")
    steps = [r["step"] for r in cli_util.read_metrics(run_dir)]
    check(steps == list(range(1, 7)), f"metrics.jsonl should hold steps 1..6 once, got {steps}")
    # Only rank 0 shows progress: each step's line appears once on the terminal.
    shown = [line for line in result.stderr.splitlines() if line.lstrip().startswith("step 3/")]
    check(len(shown) == 1, f"step 3 should be shown once (rank 0 only), got {len(shown)}:\n"
          f"{result.stderr}")
    check(not os.path.isdir(os.path.join(run_dir, "rendezvous")) or
          not os.listdir(os.path.join(run_dir, "rendezvous")),
          "the launcher should remove its rendezvous folder")
    check_nothing_left(run_dir)


def case_sigkill(binary, root, tmp):
    run_dir = os.path.join(tmp, "sigkill")
    process = start(binary, root, run_args(run_dir, extra=["checkpoint.every_steps=20"]))
    pids = rank_pids(run_dir)
    wait_for_step(run_dir, 50, process)
    try:
        os.kill(pids[1], signal.SIGKILL)
    except ProcessLookupError:
        raise cli_util.CheckFailed("rank 1 was gone before the test killed it:\n" +
                                   log_text(run_dir, 1))
    killed_at = time.monotonic()
    rc, _, err = finish(process, 60)
    elapsed = time.monotonic() - killed_at
    check(rc == 1, f"the launcher should exit 1 when a rank is killed, got {rc}\n{err}")
    check(elapsed < 15, f"the launcher took {elapsed:.1f} s to notice a killed rank")
    check("rank 1" in err and "signal 9" in err,
          f"the message should name rank 1 and signal 9:\n{err}")
    check_nothing_left(run_dir)
    check(committed_steps(run_dir), "no checkpoint was committed before the kill")
    check_resume_finishes(binary, root, run_dir)


def case_sigstop(binary, root, tmp):
    run_dir = os.path.join(tmp, "sigstop")
    process = start(binary, root,
                    run_args(run_dir, extra=["parallel.timeout_s=3", "checkpoint.every_steps=20"]))
    pids = rank_pids(run_dir)
    wait_for_step(run_dir, 30, process)
    os.kill(pids[1], signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        rc, _, err = finish(process, 60)
    finally:
        try:
            os.kill(pids[1], signal.SIGKILL)  # only if the launcher failed to
        except ProcessLookupError:
            pass
    elapsed = time.monotonic() - stopped_at
    check(rc == 1, f"the launcher should exit 1 when a rank stops answering, got {rc}\n{err}")
    check(elapsed < 3 + 12, f"the launcher took {elapsed:.1f} s (timeout 3 s)")
    check("rank 0" in err, f"the message should name the rank that reported the hang:\n{err}")
    check(any(op in err for op in ("all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                   "barrier", "send", "recv")),
          f"the message should name the collective:\n{err}")
    check("peer 1" in err or "rank 1" in err,
          f"the message should name the silent rank 1:\n{err}")
    check_nothing_left(run_dir)
    check_resume_finishes(binary, root, run_dir)


def case_sigint(binary, root, tmp):
    run_dir = os.path.join(tmp, "sigint")
    process = start(binary, root, run_args(run_dir))
    rank_pids(run_dir)
    wait_for_step(run_dir, 30, process)
    process.send_signal(signal.SIGINT)
    rc, _, err = finish(process, 60)
    check(rc == 75, f"SIGINT should save and exit 75, got {rc}\n{err}")
    check_nothing_left(run_dir)
    stopped_after = []
    for rank in (0, 1):
        found = re.findall(r"stopped by .* after step (\d+), checkpoint saved", log_text(run_dir, rank))
        check(len(found) == 1, f"rank {rank} did not stop after saving:\n{log_text(run_dir, rank)}")
        stopped_after.append(int(found[0]))
    check(stopped_after[0] == stopped_after[1],
          f"the ranks stopped after different steps: {stopped_after}")
    check(os.path.isfile(os.path.join(run_dir, "report.html")),
          "rank 0 drew no report.html for the stopped run")
    steps = committed_steps(run_dir)
    check(steps and steps[-1] == stopped_after[0],
          f"the newest checkpoint should be step {stopped_after[0]}, got {steps}")
    check_resume_finishes(binary, root, run_dir)


def case_layout_errors(binary, root, tmp):
    run_dir = os.path.join(tmp, "layout")
    env = mu.rank_free_env()
    env.update(RANK="0", WORLD_SIZE="3")  # torchrun's variables, for a 3-rank launch
    completed = subprocess.run([binary, *run_args(run_dir)], cwd=root, env=env,
                               capture_output=True, text=True, timeout=60)
    check(completed.returncode == 2, f"world size 3 for dp2 should exit 2, got "
          f"{completed.returncode}\n{completed.stderr}")
    check("= 2" in completed.stderr and "3 ranks" in completed.stderr,
          f"the message should show the formula and the launcher's world size:\n"
          f"{completed.stderr}")
    check(not os.path.exists(run_dir), "a layout error must not create the run directory")
    # trainctl's own rank variables left in a shell (no launcher started this process): named.
    env = mu.rank_free_env()
    env.update(TRAINCTL_RANK="1", TRAINCTL_WORLD_SIZE="2")
    completed = subprocess.run([binary, *run_args(run_dir)], cwd=root, env=env,
                               capture_output=True, text=True, timeout=60)
    check(completed.returncode == 2 and "TRAINCTL_RANK=1 and TRAINCTL_WORLD_SIZE=2 are in the "
          "environment, but TRAINCTL_LAUNCHER_PID is not" in completed.stderr,
          f"left-over rank variables should exit 2 naming them, got {completed.returncode}\n"
          f"{completed.stderr}")
    check(not os.path.exists(run_dir), "left-over rank variables must not create the run directory")
    result = cli_util.run(binary, run_args(run_dir, layout=("parallel.tp=3",)), root, timeout=60)
    check(result.rc == 2, f"tp3 with 4 heads should exit 2\n{result.describe()}")
    check("model.heads % parallel.tp == 0 fails" in result.stderr,
          f"the message should show the divisibility rule\n{result.describe()}")
    check(not os.path.exists(run_dir), "a layout error must not create the run directory")
    check("starting" not in result.stderr, "no rank may start on a layout error")

    # A rank of a Slurm step without a shared file system meets the others through the TCP
    # store, which needs the job's secret: missing or malformed, it is refused before anything.
    slurm = mu.rank_free_env()
    slurm.update(SLURM_PROCID="0", SLURM_NTASKS="2", SLURM_STEP_ID="0", SLURM_JOB_ID="7",
                 SLURM_NODELIST="node1", SLURM_STEP_NODELIST="node1", SLURM_LOCALID="0",
                 SLURM_NODEID="0", SLURM_STEP_TASKS_PER_NODE="2")
    bad = "0123456789abcdef" * 3 + "0123456789abcdeZ"
    for secret, expected in ((None, "TRAINCTL_STORE_SECRET is not set: without a shared file "
                                    "system (cluster.shared_fs: false) the ranks meet through "
                                    "rank 0's TCP store"),
                             ("12ab", "TRAINCTL_STORE_SECRET: the store secret has 4 characters, "
                                      "not 64 hexadecimal digits"),
                             (bad, "TRAINCTL_STORE_SECRET: the store secret has a character that "
                                   "is not a hexadecimal digit at position 64")):
        env = dict(slurm)
        if secret is not None:
            env["TRAINCTL_STORE_SECRET"] = secret
        completed = subprocess.run(
            [binary, *run_args(run_dir, extra=("cluster.shared_fs=false", "checkpoint.every_steps=0"))],
            cwd=root, env=env,
            capture_output=True, text=True, timeout=60)
        check(completed.returncode == 2 and expected in completed.stderr,
              f"secret {secret!r}: expected exit 2 and '{expected}'\n{completed.stderr}")
        check("od -An -tx1 -N32 /dev/urandom" in completed.stderr,
              f"the message should say how to make a secret\n{completed.stderr}")
        check(secret is None or secret not in completed.stderr,
              f"the message repeats the secret\n{completed.stderr}")
        check(not os.path.exists(run_dir), "a missing secret must not create the run directory")


def case_tcp_store(binary, root, tmp):
    """cluster.shared_fs: false on one machine: the launcher serves a TCP store on loopback with a
    secret of its own; a stranger knocking on it is refused and counted, the run goes on, and the
    secret is in no command line and no file of the run directory."""
    run_dir = os.path.join(tmp, "tcp")
    process = start(binary, root, run_args(run_dir, steps=300, extra=(
        "cluster.shared_fs=false", "checkpoint.every_steps=0")))
    log = os.path.join(run_dir, "logs", "rank_0.log")
    deadline = time.monotonic() + 60
    port = None
    while port is None and time.monotonic() < deadline and process.poll() is None:
        if os.path.exists(log):
            with open(log) as f:
                found = re.search(r"rendezvous tcp store 127\.0\.0\.1:(\d+) \(served by "
                                  r"trainctl's launcher\)", f.read())
            port = int(found.group(1)) if found else None
        time.sleep(0.02)
    check(port is not None, "rank 0's log does not name the launcher's TCP store")
    stranger = store_util.Stranger(port)
    secrets = {store_util.secret_of(pid) for pid in rank_pids(run_dir)}
    lines = store_util.command_lines()
    time.sleep(0.5)
    stranger.finish()
    rc, _, err = finish(process, 120)
    check(rc == 0, f"the run should exit 0 with a stranger at its store\n{err}")
    store_util.check_refusals(stranger, err, err, "the launcher")
    check(len(secrets) == 1 and None not in secrets,
          f"every rank should hold the one secret of the run: {len(secrets)} values")
    secret = secrets.pop()
    check(secret not in lines, "the secret is on a command line")
    check(secret not in err, "the secret is in the launcher's output")
    leaks = store_util.files_holding(run_dir, secret.encode())
    check(not leaks, f"the secret is written in {leaks}")
    check_nothing_left(run_dir)


CASES = {"layout_errors": case_layout_errors, "clean": case_clean, "sigkill": case_sigkill,
         "sigstop": case_sigstop, "sigint": case_sigint, "tcp_store": case_tcp_store}


if __name__ == "__main__":
    cli_util.cases_main(CASES, "multirank")
