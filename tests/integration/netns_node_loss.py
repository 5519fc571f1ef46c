#!/usr/bin/env python3
"""netns:node_loss: ranks on three hosts (network namespaces with their own addresses on one
switch, netns_util), one host's link cut mid-run, the job resumed.

Each rank is started in its host as an external launcher would (`ip netns exec HOST trainctl run`
with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), at dp 3. TRAINCTL_STORE_PORT makes them meet
through the TCP store rank 0 serves on its host's address (TRAINCTL_STORE_HOST, with the job's
TRAINCTL_STORE_SECRET), and TRAINCTL_GLOO_IFACE puts Gloo on the hosts' interface; the run
directory stays shared (the namespaces share the file system), so checkpoints are written.

  1. A clean run over the hosts: every rank's log says it met the others through the TCP store on
     10.77.0.1 and runs Gloo on its own host's address; the losses and final weights equal those
     of the same recipe under trainctl's local launcher, bit for bit.
  2. The same run with parallel.timeout_s 3: once step 10's checkpoint is committed, host 2's
     cable is pulled at the switch (no reset, no FIN: its packets are dropped). Ranks 0 and 1 exit
     1 within the timeout plus the roll call's window (2 s) plus 2 s of slack for a loaded machine;
     each names the collective and its group, and rank 2 as the one that did not answer, with its
     address. Rank 2 exits too (it cannot reach the store either): nothing hangs.
  3. The cable back in, `trainctl resume` over the hosts the same way: it continues from the newest
     checkpoint, and the run ends bit-identical to the clean run of step 1.

Skips (exit 77) only where network namespaces cannot be made (not root), and never with CI=true.
Run as: netns_node_loss.py TRAINCTL REPO_ROOT.
"""
import os
import re
import subprocess
import sys
import time

import cli_resume_util as ru
import cli_util
import netns_util
from cli_util import check

HOSTS = 3
CUT = 2  # the host whose link is cut: not rank 0's, which serves the store
STEPS = 80  # about 30 ms a step at dp 3 here: the cut lands mid-run
TIMEOUT_S = 3
ROLL_CALL_S = 2  # lib/run/session.cpp kRollCallWindow
SLACK_S = 2  # process exit, and the survivors' timeouts starting a step apart on a busy machine
PORT = 29517
EXTRA = ["parallel.dp=3", "training.global_batch=12", f"parallel.timeout_s={TIMEOUT_S}",
         "checkpoint.every_steps=5"]


def rank_env(net, rank, secret):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(HOSTS), LOCAL_RANK="0",
               LOCAL_WORLD_SIZE="1", OPENBLAS_NUM_THREADS="1",
               TRAINCTL_STORE_HOST=net.address(0), TRAINCTL_STORE_PORT=str(PORT),
               TRAINCTL_STORE_SECRET=secret, TRAINCTL_GLOO_IFACE=netns_util.IFACE)
    for name in ("TRAINCTL_RANK", "TRAINCTL_WORLD_SIZE", "TRAINCTL_LAUNCHER_PID", "SLURM_PROCID"):
        env.pop(name, None)
    return env


def start_ranks(net, binary, root, args, tag):
    """Every rank in its host; each one's output goes to <run_dir>.<tag>.<rank>."""
    run_dir = args[args.index("--run-dir") + 1] if "--run-dir" in args else args[1]
    secret = os.urandom(32).hex()  # fresh per attempt, as a batch script makes it
    ranks = []
    for rank in range(HOSTS):
        out = open(f"{run_dir}.{tag}.{rank}", "w+")
        process = net.popen(rank, [binary, *args], cwd=root, env=rank_env(net, rank, secret),
                            stdout=out, stderr=subprocess.STDOUT, text=True)
        process.output = out
        ranks.append(process)
    return ranks


def output(process):
    process.output.seek(0)
    return process.output.read()


def wait_all(ranks, timeout):
    """Exit codes of every rank once all ended; None for a rank still running at the deadline
    (it is killed then)."""
    deadline = time.monotonic() + timeout
    codes = []
    for process in ranks:
        try:
            codes.append(process.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            codes.append(None)
    return codes


def error_line(text):
    found = re.search(r"error: .*", text)
    return found.group(0) if found else "(no error line)"


def all_outputs(ranks):
    return "".join(f"--- rank {r} ---\n{output(p)}" for r, p in enumerate(ranks))


def run_over_hosts(net, binary, root, args, tag):
    ranks = start_ranks(net, binary, root, args, tag)
    codes = wait_all(ranks, 120)
    check(codes == [0] * HOSTS, f"{tag}: exit codes {codes}\n{all_outputs(ranks)}")
    return ranks


def check_rendezvous(net, run_dir):
    for rank in range(HOSTS):
        log = open(os.path.join(run_dir, "logs", f"rank_{rank}.log")).read()
        check(re.search(rf"rendezvous tcp store {re.escape(net.address(0))}:{PORT} \(rank 0 "
                        rf"serves it, host from TRAINCTL_STORE_HOST.*, gloo on "
                        rf"{re.escape(net.address(rank))}\n", log),
              f"rank {rank}'s log does not say it met the others through rank 0's TCP store on "
              f"{net.address(0)}:{PORT} and runs Gloo on {net.address(rank)}\n{log}")


def wait_for_checkpoint(run_dir, name, ranks, timeout=60):
    path = os.path.join(run_dir, "checkpoints", name, "manifest.json")
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        check(time.monotonic() < deadline, f"no {name} after {timeout} s\n{all_outputs(ranks)}")
        check(all(p.poll() is None for p in ranks),
              f"a rank ended before {name} was committed\n{all_outputs(ranks)}")
        time.sleep(0.01)


def check_cut(net, ranks, cut_at):
    limit = TIMEOUT_S + ROLL_CALL_S + SLACK_S
    survivors = [r for r in range(HOSTS) if r != CUT]
    for rank in survivors:
        process = ranks[rank]
        try:
            process.wait(max(0.1, cut_at + limit - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        took = time.monotonic() - cut_at
        check(process.returncode not in (None, 0),
              f"rank {rank} still running (or exited 0) {took:.1f} s after host {CUT}'s link was "
              f"cut; parallel.timeout_s is {TIMEOUT_S}\n{all_outputs(ranks)}")
        text = output(process)
        failure = re.search(r"error: rank \d: (\w+) on group (\w+) \(3 ranks, this is rank \d\): "
                            r".*roll call through tcp store.*: rank (\d) \(pid \d+ on \S+, "
                            r"address ([\d.]+)\) did not answer within (\d+) ms, ranks (.*?) did",
                            text)
        check(failure, f"rank {rank}'s error does not name the collective, its group and the rank "
                       f"that did not answer\n{text}")
        op, group, silent, address, window, answered = failure.groups()
        check((int(silent), address) == (CUT, net.address(CUT)),
              f"rank {rank} names rank {silent} at {address}, not rank {CUT} at "
              f"{net.address(CUT)}\n{text}")
        check(answered == ", ".join(map(str, survivors)),
              f"rank {rank} says ranks {answered} answered the roll call, expected {survivors}")
        print(f"rank {rank} exited {process.returncode} {took:.1f} s after the cut: {op} on "
              f"{group}, rank {silent} at {address} silent for {window} ms")
    codes = wait_all([ranks[CUT]], 2 * TIMEOUT_S + SLACK_S)
    check(codes[0] not in (None, 0), f"the cut rank {CUT} did not fail (exit {codes[0]})\n"
                                     f"{output(ranks[CUT])}")
    print(f"rank {CUT} (cut off) exited {codes[0]} {time.monotonic() - cut_at:.1f} s after the "
          f"cut: {error_line(output(ranks[CUT]))}")
    return [error_line(output(ranks[r])) for r in survivors]


def body(binary, root):
    with cli_util.temp_dir("netns-node-loss") as tmp:
        try:
            net = netns_util.Network(HOSTS).__enter__()
        except netns_util.Unavailable as why:
            if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
                raise cli_util.CheckFailed(f"CI=true: netns:node_loss must run, but {why}")
            print(f"SKIPPED: {why}")
            sys.exit(77)
        try:
            clean_dir = os.path.join(tmp, "clean")
            run_over_hosts(net, binary, root, ru.run_args(clean_dir, STEPS, EXTRA), "run")
            check_rendezvous(net, clean_dir)
            local_dir = os.path.join(tmp, "local")
            cli_util.run_ok(binary, ru.run_args(local_dir, STEPS, EXTRA), root)
            ru.check_same_run(local_dir, clean_dir, STEPS, "dp3 over three hosts vs local")

            cut_dir = os.path.join(tmp, "cut")
            ranks = start_ranks(net, binary, root, ru.run_args(cut_dir, STEPS, EXTRA), "run")
            wait_for_checkpoint(cut_dir, "step_00000010", ranks)
            net.cut(CUT)
            errors = check_cut(net, ranks, time.monotonic())
            print("\n".join(errors))
            saved = [n for n in ru.checkpoint_names(cut_dir) if n.startswith("step_")]
            check(saved and max(saved) < f"step_{STEPS:08d}",
                  f"the cut run's checkpoints: {saved}")

            net.restore(CUT)
            resumed = run_over_hosts(net, binary, root, ru.resume_args(cut_dir), "resume")
            text = output(resumed[0])
            check(f"resuming from {max(saved)} (the newest valid checkpoint)" in text,
                  f"the resume did not continue from {max(saved)}\n{text}")
            ru.check_same_run(clean_dir, cut_dir, STEPS, "cut at a host's link and resumed")
        finally:
            net.close()


if __name__ == "__main__":
    cli_util.main_wrapper(body)
