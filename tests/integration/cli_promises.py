#!/usr/bin/env python3
"""cli:promises_<case>: documented promises of README.md ("Exit codes", "Multi-rank"),
docs/checkpoints.md and docs/recipe.md, each proved end to end through the trainctl binary.

  every_minutes   checkpoint.every_minutes takes fractional minutes: 1e-9 (60 ns, less than any
                  step takes) saves after every step; 60 saves only at the end; with every_steps
                  4 and 60 minutes the steps win ("whichever comes first").
  keep_last       saving every step, keep_last 2 leaves exactly the newest two (a corrupt
                  checkpoint newer than all of them, planted mid-run, stays); a resume with
                  keep_last 3 keeps the newest three valid ones, deletes older ones (a corrupt one
                  included) and leaves another process's .tmp-step_* folder byte for byte alone.
  sigint          one rank, Ctrl-C (SIGINT): saves the step it finished, exits 75, says how to
                  continue; the resumed run equals one that never stopped, bit for bit.
  signal_mid_save SIGTERM while a periodic save is being written (the process is frozen with
                  SIGSTOP mid-save, the signal queued, the process continued), with async saves
                  and without: the save in flight is committed, not abandoned; the run then stops
                  after the next step (async: within the steps the save overlapped), saves it,
                  exits 75; nothing temporary is left; resume equals the straight run.
  sigusr1_twice   SIGUSR1, then SIGUSR1 again while the stop's save is being written: the second
                  one changes nothing (one save, one "stopped by SIGUSR1" line, exit 75), on one
                  rank (resume equals the straight run) and at dp2 through the launcher (every
                  rank saved the same step).
  second_sigint   Ctrl-C, then Ctrl-C again while the stop's save is being written (slowed to take
                  a minute): one rank dies of SIGINT at once (the shell's 130); at dp2 the launcher
                  kills every rank and exits 130 at once; no checkpoint is committed.
  launcher_sigkill  SIGKILL of the launcher of a dp2 run while its ranks train: every rank is
                  gone within seconds (PR_SET_PDEATHSIG), and no process of the run is left.
  failed_rank     a rank of a dp2 run exits 1 by itself (its data file was truncated): the
                  launcher exits exactly 1, naming the rank, its exit code and its reason.
  overwrite       `run --overwrite` on a run directory holding checkpoints (one rank and dp2):
                  exit 0, the old checkpoints are gone, and the new run is a fresh one (another
                  seed, fewer steps) equal bit for bit to the same run in an empty directory.
  no_shared_fs    cluster.shared_fs: false and a stop signal: the run stops after the step
                  without a save and exits 1 (one rank, and dp2 through the launcher), saying the
                  run cannot be continued; no checkpoint folder is written.
  moe_dp_ep       a MoE model at dp2 x ep2 (4 ranks) trains like one rank: per-step losses and
                  final weights within cli_layout_util's 1e-5 relative, tokens dropped alike.

No outcome is decided by the clock: every wait is for an event (a progress line, a file, a
frozen process) under a deadline of 60 s that only fails when nothing happened; the one bound
that is a claim ("a second Ctrl-C stops at once") is generous and says so.
Usage: cli_promises.py TRAINCTL_BINARY REPO_ROOT [CASE...] (all cases by default)."""
import glob
import json
import os
import re
import signal
import subprocess
import time

import cli_layout_util as lu
import cli_resume_util as ru
import cli_util
import multirank_util as mu
from cli_util import check

DEADLINE = 60  # seconds any awaited event may take on 2 busy cores before the test gives up


def tiny_args(run_dir, steps, extra=(), layout=("parallel.dp=2",)):
    """The multi-rank runs: multirank_util's tiny fp32 GPT, with plain progress lines."""
    return mu.tiny_run_args(run_dir, steps, ["logging.progress=plain", *extra], layout)


class Background:
    """trainctl started in the background, stdout and stderr into one file (a pipe nobody reads
    would block it once full)."""

    def __init__(self, binary, root, args, output):
        self.args = [binary, *args]
        self.output = output
        self.file = open(output, "w+")
        self.process = subprocess.Popen(self.args, cwd=root, env=mu.rank_free_env(), stdout=self.file,
                                        stderr=subprocess.STDOUT, text=True)
        self.pid = self.process.pid

    def text(self):
        with open(self.output, encoding="utf-8", errors="replace") as f:
            return f.read()

    def describe(self):
        return (f"command: {' '.join(self.args)}\nexit code: {self.process.poll()}\n"
                f"--- output ---\n{self.text()}")

    def wait_for(self, what, predicate):
        """Polls `predicate` until it returns something true; fails when the process ends first
        or nothing happened within DEADLINE."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            found = predicate()
            if found:
                return found
            check(self.process.poll() is None,
                  f"the run ended before {what}\n{self.describe()}")
            time.sleep(0.002)
        raise cli_util.CheckFailed(f"{what}: nothing within {DEADLINE} s\n{self.describe()}")

    def wait_for_line(self, prefix):
        return self.wait_for(f"a line starting {prefix!r}",
                             lambda: any(l.startswith(prefix) for l in self.text().splitlines()))

    def finish(self, timeout=DEADLINE):
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise cli_util.CheckFailed(f"the run did not exit within {timeout} s\n"
                                       f"{self.describe()}")
        finally:
            self.file.close()
        return self.process.returncode, self.text()


def tmp_saves(run_dir):
    """The .tmp-step_* folders of run_dir/checkpoints (saves being written)."""
    return sorted(glob.glob(os.path.join(run_dir, "checkpoints", ".tmp-step_*")))


def committed(run_dir):
    """The committed step_* folders of run_dir/checkpoints, by name."""
    path = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(path):
        return []
    return sorted(n for n in os.listdir(path)
                  if n.startswith("step_") and os.path.isfile(os.path.join(path, n,
                                                                           "manifest.json")))


def latest(run_dir):
    with open(os.path.join(run_dir, "checkpoints", "latest"), encoding="utf-8") as f:
        return f.read().strip()


def freeze(pid):
    """SIGSTOP, then waits until every thread of `pid` is stopped: from here nothing it does can
    move on until thaw()."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass  # a thread that just ended
        if states and all(s in "tT" for s in states):
            return
        time.sleep(0.002)
    raise cli_util.CheckFailed(f"pid {pid} did not stop within {DEADLINE} s of SIGSTOP")


def thaw(pid):
    os.kill(pid, signal.SIGCONT)


def signal_mid_save(run, run_dir, saver_pid, signum, pattern=".tmp-step_"):
    """Waits until a save (a checkpoints/<pattern>* folder) is being written, freezes the process
    that commits it, checks that the save is still unfinished (no manifest, not renamed), queues
    `signum` to run.pid and lets the frozen process go on: the signal lands mid-save, whatever
    the timing. Returns the temporary folder's name."""
    where = os.path.join(run_dir, "checkpoints", pattern + "*")
    run.wait_for(f"a save ({where})", lambda: glob.glob(where))
    freeze(saver_pid)
    try:
        tmps = glob.glob(where)
        check(len(tmps) == 1 and not os.path.exists(os.path.join(tmps[0], "manifest.json")),
              f"the save finished before the process could be frozen (found {tmps}); slow the "
              f"saves further with --debug-save-delay-ms\n{run.describe()}")
        os.kill(run.pid, signum)
    finally:
        thaw(saver_pid)
    return os.path.basename(tmps[0])


def stopped_line(text, name, run_dir):
    """The steps N of every 'stopped by NAME after step N, checkpoint saved; ...' line."""
    return [int(n) for n in re.findall(
        rf"stopped by {name} after step (\d+), checkpoint saved; continue with: trainctl resume "
        rf"{re.escape(run_dir)}\n", text)]


def verify(binary, root, run_dir, entries):
    result = cli_util.run(binary, ["ckpt", "verify", run_dir], root, timeout=120)
    check(result.rc == 0 and f"{entries} entries: {entries} valid, 0 corrupt, 0 partial"
          in result.stdout, f"expected {entries} valid checkpoints\n{result.describe()}")


def rank_log(run_dir, rank):
    with open(os.path.join(run_dir, "logs", f"rank_{rank}.log"), encoding="utf-8") as f:
        return f.read()


def rank_pids(run, run_dir):
    path = os.path.join(run_dir, "logs", "ranks.json")
    run.wait_for(f"{path}", lambda: os.path.isfile(path))
    with open(path) as f:
        return [r["pid"] for r in json.load(f)["ranks"]]


def wait_for_metrics_step(run, run_dir, step):
    path = os.path.join(run_dir, "metrics.jsonl")

    def reached():
        if not os.path.isfile(path):
            return False
        with open(path) as f:
            return sum(1 for _ in f) >= step
    run.wait_for(f"step {step} in {path}", reached)


# ---- checkpoint cadence and retention ----

def case_every_minutes(binary, root, tmp):
    # 1e-9 minutes is 60 ns: every step (a forward and backward pass, milliseconds) is longer, so
    # every step is due; 60 minutes is far longer than the whole run, so only the end saves.
    # Neither outcome depends on how fast this machine is.
    runs = [("every 60 ns", ["checkpoint.every_steps=0", "checkpoint.every_minutes=1e-9"],
             [1, 2, 3, 4, 5, 6]),
            ("every 60 min", ["checkpoint.every_steps=0", "checkpoint.every_minutes=60"], [6]),
            ("every 4 steps or 60 min", ["checkpoint.every_steps=4",
                                         "checkpoint.every_minutes=60"], [4, 6])]
    for label, extra, want in runs:
        run_dir = os.path.join(tmp, label.replace(" ", "-"))
        cli_util.run_ok(binary, ru.run_args(run_dir, 6, [*extra, "checkpoint.keep_last=100"]),
                        root)
        got = committed(run_dir)
        check(got == [f"step_{s:08d}" for s in want],
              f"{label}: checkpoints {got}, expected steps {want}")
        verify(binary, root, run_dir, len(want))
    with open(os.path.join(tmp, "every-60-ns", "recipe.yaml")) as f:
        check("every_minutes: 1e-09" in f.read(), "recipe.yaml does not record every_minutes 1e-9")


def case_keep_last(binary, root, tmp):
    run_dir = os.path.join(tmp, "run")
    cli_util.run_ok(binary, ru.run_args(run_dir, 6, ["checkpoint.every_steps=1",
                                                     "checkpoint.keep_last=2"]), root)
    names = ru.checkpoint_names(run_dir)
    check(names == ["latest", "step_00000005", "step_00000006"],
          f"keep_last 2 after 6 saves: checkpoints/ holds {names}, expected the newest two")
    check(latest(run_dir) == "step_00000006", f"latest names {latest(run_dir)}")
    # The same run with keep_last 100 keeps all six: the four were saved, then deleted.
    every = os.path.join(tmp, "all")
    cli_util.run_ok(binary, ru.run_args(every, 6, ["checkpoint.every_steps=1",
                                                   "checkpoint.keep_last=100"]), root)
    check(len(committed(every)) == 6, f"saving every step kept {committed(every)}")

    # Another process's save in progress (older than every kept one) and a corrupt old
    # checkpoint; then resume to step 9 with keep_last 3.
    checkpoints = os.path.join(run_dir, "checkpoints")
    foreign = os.path.join(checkpoints, ".tmp-step_00000001.4242424")
    os.makedirs(foreign)
    with open(os.path.join(foreign, "rank_0.bin"), "wb") as f:
        f.write(b"another process is writing this")
    corrupt = os.path.join(checkpoints, "step_00000003")
    os.makedirs(corrupt)
    with open(os.path.join(corrupt, "manifest.json"), "w") as f:
        f.write("{ not json")
    resumed = cli_util.run_ok(binary, ru.resume_args(
        run_dir, ["training.steps=9", "checkpoint.keep_last=3"]), root)
    check("resuming from step_00000006" in resumed.stderr, f"resume\n{resumed.describe()}")
    names = ru.checkpoint_names(run_dir)
    check(names == [".tmp-step_00000001.4242424", "latest", "step_00000007", "step_00000008",
                    "step_00000009"],
          f"keep_last 3 after resuming to step 9: checkpoints/ holds {names}, expected the "
          "newest three valid ones and the other process's .tmp folder (the corrupt step 3 and "
          "steps 5 and 6 deleted)")
    with open(os.path.join(foreign, "rank_0.bin"), "rb") as f:
        check(f.read() == b"another process is writing this", "the foreign .tmp file changed")
    check(os.listdir(foreign) == ["rank_0.bin"], "the foreign .tmp folder changed")

    # A corrupt checkpoint newer than every valid one is evidence (scan reports it): retention
    # never deletes it. It is planted while the run is frozen, then three more saves (each
    # followed by retention) must pass before the run is stopped.
    live = os.path.join(tmp, "live")
    run = Background(binary, root, ru.run_args(live, 100000, ["checkpoint.every_steps=1",
                                                              "checkpoint.keep_last=2"]),
                     live + ".out")

    def newest_step():
        return max([int(n[len("step_"):]) for n in committed(live) if n != "step_99999999"],
                   default=0)
    run.wait_for("step 3's checkpoint", lambda: newest_step() >= 3)
    freeze(run.pid)
    try:
        planted_after = newest_step()
        evidence = os.path.join(live, "checkpoints", "step_99999999")
        os.makedirs(evidence)
        with open(os.path.join(evidence, "manifest.json"), "w") as f:
            f.write("{ not json")
    finally:
        thaw(run.pid)
    run.wait_for("three more checkpoints", lambda: newest_step() >= planted_after + 3)
    run.process.send_signal(signal.SIGTERM)
    rc, text = run.finish()
    check(rc == 75, f"SIGTERM must save and exit 75\n{run.describe()}")
    stop = stopped_line(text, "SIGTERM", live)
    check(len(stop) == 1, f"no 'stopped by SIGTERM' line\n{text}")
    names = ru.checkpoint_names(live)
    want = ["latest", f"step_{stop[0] - 1:08d}", f"step_{stop[0]:08d}", "step_99999999"]
    check(names == want, f"keep_last 2 with a corrupt newer checkpoint planted at step "
          f"{planted_after}: checkpoints/ holds {names}, expected {want}")
    with open(os.path.join(evidence, "manifest.json")) as f:
        check(f.read() == "{ not json", "the corrupt newer checkpoint was changed")


# ---- stop signals, one rank ----

def case_sigint(binary, root, tmp):
    steps, extra = 200, ["checkpoint.every_steps=0", "checkpoint.keep_last=100",
                         "schedule.decay_steps=200"]
    reference = os.path.join(tmp, "straight")
    cli_util.run_ok(binary, ru.run_args(reference, steps, extra), root)
    run_dir = os.path.join(tmp, "stopped")
    stopped = ru.stop_with_signal(binary, ru.run_args(run_dir, steps, extra), root, run_dir, 2,
                                  steps, signal.SIGINT)
    check(committed(run_dir) == [f"step_{stopped:08d}"],
          f"one checkpoint, of step {stopped}, expected: {committed(run_dir)}")
    cli_util.run_ok(binary, ru.resume_args(run_dir), root)
    ru.check_same_run(reference, run_dir, steps, f"stopped by SIGINT after step {stopped}")


def case_signal_mid_save(binary, root, tmp):
    steps = 8
    base = ["checkpoint.every_steps=2", "checkpoint.keep_last=100", f"schedule.decay_steps={steps}"]
    reference = os.path.join(tmp, "straight")
    cli_util.run_ok(binary, ru.run_args(reference, steps, base), root)
    # 15 ms after each of the 112 tensors: a save takes about 1.7 s.
    for mode, last_stop in (("async=false", 3), ("async=true", 5)):
        run_dir = os.path.join(tmp, mode)
        args = [*ru.run_args(run_dir, steps, [*base, f"checkpoint.{mode}"]),
                "--debug-save-delay-ms=15"]
        run = Background(binary, root, args, run_dir + ".out")
        saving = signal_mid_save(run, run_dir, run.pid, signal.SIGTERM, ".tmp-step_00000002.")
        rc, text = run.finish()
        check(rc == 75, f"{mode}: SIGTERM during {saving} must save and exit 75\n"
              f"{run.describe()}")
        found = stopped_line(text, "SIGTERM", run_dir)
        # The signal came while step 2 was being saved. A blocking save (async false) runs inside
        # step 2's end, so step 3 is the first to see it. A background save overlaps steps 3 and
        # 4, and step 4's save waits for step 2's, so step 5 is the last that can see it first.
        check(len(found) == 1 and 3 <= found[0] <= last_stop,
              f"{mode}: expected one 'stopped by SIGTERM after step N' with 3 <= N <= "
              f"{last_stop}, got {found}\n{text}")
        stop = found[0]
        want = [f"step_{s:08d}" for s in range(2, stop + 1) if s % 2 == 0 or s == stop]
        check(committed(run_dir) == want,
              f"{mode}: the save in flight must be committed and the stop saved: checkpoints "
              f"{ru.checkpoint_names(run_dir)}, expected {want}")
        check(not tmp_saves(run_dir), f"{mode}: left {tmp_saves(run_dir)}")
        check(latest(run_dir) == f"step_{stop:08d}", f"{mode}: latest is {latest(run_dir)}")
        verify(binary, root, run_dir, len(want))
        cli_util.run_ok(binary, ru.resume_args(run_dir), root)
        ru.check_same_run(reference, run_dir, steps, f"{mode}, SIGTERM during {saving}")
        print(f"{mode}: SIGTERM during {saving}: committed {want}, exit 75, resume equal")


def case_sigusr1_twice(binary, root, tmp):
    # One rank.
    steps, extra = 200, ["checkpoint.every_steps=0", "checkpoint.keep_last=100",
                         "schedule.decay_steps=200"]
    reference = os.path.join(tmp, "straight")
    cli_util.run_ok(binary, ru.run_args(reference, steps, extra), root)
    run_dir = os.path.join(tmp, "one-rank")
    run = Background(binary, root, [*ru.run_args(run_dir, steps, extra),
                                    "--debug-save-delay-ms=15"], run_dir + ".out")
    run.wait_for_line("step 2/")
    run.process.send_signal(signal.SIGUSR1)
    saving = signal_mid_save(run, run_dir, run.pid, signal.SIGUSR1)
    rc, text = run.finish()
    check(rc == 75, f"SIGUSR1 twice (the second during {saving}) must exit 75\n{run.describe()}")
    found = stopped_line(text, "SIGUSR1", run_dir)
    check(len(found) == 1 and 2 <= found[0] < steps,
          f"expected one 'stopped by SIGUSR1 after step N', got {found}\n{text}")
    check(ru.checkpoint_names(run_dir) == ["latest", f"step_{found[0]:08d}"],
          f"one save, of step {found[0]}, expected: {ru.checkpoint_names(run_dir)}")
    verify(binary, root, run_dir, 1)
    cli_util.run_ok(binary, ru.resume_args(run_dir), root)
    ru.check_same_run(reference, run_dir, steps, "stopped by SIGUSR1 twice")

    # dp2 through the launcher, which forwards both signals to every rank. Rank 0 commits the
    # save, so freezing it holds the save unfinished.
    run_dir = os.path.join(tmp, "dp2")
    run = Background(binary, root, [*tiny_args(run_dir, 100000, ["checkpoint.every_steps=0"]),
                                    "--debug-save-delay-ms=15"], run_dir + ".out")
    pids = rank_pids(run, run_dir)
    wait_for_metrics_step(run, run_dir, 2)
    run.process.send_signal(signal.SIGUSR1)
    saving = signal_mid_save(run, run_dir, pids[0], signal.SIGUSR1)
    rc, text = run.finish()
    check(rc == 75, f"dp2: SIGUSR1 twice (the second during {saving}) must exit 75\n{text}")
    check("all 2 ranks stopped after saving a checkpoint; continue with: trainctl resume "
          f"{run_dir}" in text, f"dp2: the launcher does not say the ranks saved\n{text}")
    stops = [stopped_line(rank_log(run_dir, rank), "SIGUSR1", run_dir) for rank in (0, 1)]
    check(len(stops[0]) == 1 and stops[0] == stops[1],
          f"dp2: each rank must stop once, after the same step: {stops}")
    check(ru.checkpoint_names(run_dir) == ["latest", f"step_{stops[0][0]:08d}"],
          f"dp2: one save expected: {ru.checkpoint_names(run_dir)}")
    check(not mu.processes_of_run(run_dir), f"dp2: left running: {mu.processes_of_run(run_dir)}")
    verify(binary, root, run_dir, 1)


def case_second_sigint(binary, root, tmp):
    # 500 ms after each of the 112 tensors: the stop's save would take about a minute. Both runs
    # must end within 15 s of the second Ctrl-C: generous for "at once" (a kill and a reap), and
    # far below the save's minute, so a run that finished its save cannot pass.
    slow, bound = "--debug-save-delay-ms=500", 15
    run_dir = os.path.join(tmp, "one-rank")
    run = Background(binary, root, [*ru.run_args(run_dir, 100000, ["checkpoint.every_steps=0"]),
                                    slow], run_dir + ".out")
    run.wait_for_line("step 2/")
    run.process.send_signal(signal.SIGINT)
    run.wait_for("the stop's save", lambda: tmp_saves(run_dir))
    run.process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    rc, text = run.finish()
    took = time.monotonic() - sent
    # Killed by SIGINT itself (the default action), which a shell reports as 130 (128 + 2).
    check(rc == -signal.SIGINT, f"one rank: a second Ctrl-C must kill the run by SIGINT (the "
          f"shell's 130), got {rc}\n{text}")
    check(took < bound, f"one rank: the second Ctrl-C took {took:.1f} s to stop the run")
    print(f"one rank: killed by SIGINT {took:.2f} s after the second Ctrl-C, mid-save")
    check(not committed(run_dir), f"one rank: a checkpoint was committed: {committed(run_dir)}")
    check("stopped by" not in text, f"one rank: the run says it stopped cleanly\n{text}")

    run_dir = os.path.join(tmp, "dp2")
    run = Background(binary, root, [*tiny_args(run_dir, 100000, ["checkpoint.every_steps=0"]),
                                    slow], run_dir + ".out")
    pids = rank_pids(run, run_dir)
    wait_for_metrics_step(run, run_dir, 2)
    run.process.send_signal(signal.SIGINT)
    run.wait_for("the ranks' save", lambda: tmp_saves(run_dir))
    run.process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    rc, text = run.finish()
    took = time.monotonic() - sent
    check(rc == 130, f"dp2: a second Ctrl-C during the save must exit 130, got {rc}\n{text}")
    check(took < bound, f"dp2: the second Ctrl-C took {took:.1f} s to stop the run")
    print(f"dp2: exit 130 {took:.2f} s after the second Ctrl-C, mid-save")
    check("interrupted twice: every rank was killed at once (no checkpoint saved)" in text,
          f"dp2: the launcher does not say why it stopped\n{text}")
    check(not committed(run_dir), f"dp2: a checkpoint was committed: {committed(run_dir)}")
    for pid in pids:
        check(mu.process_identity(pid) is None, f"dp2: rank pid {pid} is still there")
    check(not mu.processes_of_run(run_dir), f"dp2: left running: {mu.processes_of_run(run_dir)}")


def case_launcher_sigkill(binary, root, tmp):
    run_dir = os.path.join(tmp, "dp2")
    run = Background(binary, root, tiny_args(run_dir, 100000, ["checkpoint.every_steps=0"]),
                     run_dir + ".out")
    pids = rank_pids(run, run_dir)
    wait_for_metrics_step(run, run_dir, 2)
    before = {pid: mu.process_identity(pid) for pid in pids}
    for pid, identity in before.items():
        check(identity and identity[1] != "Z" and identity[2] == run.pid,
              f"rank pid {pid} is not a live child of the launcher {run.pid}: {identity}")
    run.process.send_signal(signal.SIGKILL)
    rc, _ = run.finish()
    check(rc == -signal.SIGKILL, f"the launcher should have died of SIGKILL, got {rc}")

    def all_gone():  # gone: no such process, a zombie, or the pid reused by another process
        now = {pid: mu.process_identity(pid) for pid in pids}
        return all(n is None or n[1] == "Z" or n[0] != before[pid][0] for pid, n in now.items())
    deadline = time.monotonic() + DEADLINE  # PR_SET_PDEATHSIG acts at once; 60 s is generous
    while not all_gone() and time.monotonic() < deadline:
        time.sleep(0.01)
    check(all_gone(), f"ranks outlived the SIGKILLed launcher by {DEADLINE} s: "
          f"{[p for p in pids if mu.process_identity(p)]}")
    check(not mu.processes_of_run(run_dir), f"left running: {mu.processes_of_run(run_dir)}")
    print(f"ranks {pids} gone {time.monotonic() - deadline + DEADLINE:.2f} s after the launcher")


def case_failed_rank(binary, root, tmp):
    """A rank that fails on its own (exit 1: its data file was truncated under it) makes the
    launcher exit 1 (not 75, not 2), naming the rank and its exit code; nothing is left running.
    (A rank killed by a signal, or one that stops answering: cli:multirank_sigkill, _sigstop.)"""
    data = os.path.join(tmp, "kjv.txt")
    with open(os.path.join(root, "data", "kjv.txt"), "rb") as src, open(data, "wb") as dst:
        dst.write(src.read())
    run_dir = os.path.join(tmp, "dp2")
    run = Background(binary, root, tiny_args(run_dir, 100000, ["checkpoint.every_steps=0",
                                                               f"data.path={data}"]),
                     run_dir + ".out")
    rank_pids(run, run_dir)
    wait_for_metrics_step(run, run_dir, 2)
    os.truncate(data, 100000)
    rc, text = run.finish()
    check(rc == 1, f"a rank that exits 1 must make the launcher exit 1, got {rc}\n{text}")
    check(re.search(r"trainctl run: error: rank [01] \(pid \d+\) failed: exit code 1; ", text),
          f"the launcher does not name the failed rank and its exit code 1\n{text}")
    check("the data file changed while the run was reading it" in text,
          f"the launcher does not show the rank's reason (its log's last lines)\n{text}")
    check(not mu.processes_of_run(run_dir), f"left running: {mu.processes_of_run(run_dir)}")


# ---- the run directory ----

def case_overwrite(binary, root, tmp):
    for label, make_args in (("one rank", lambda d, s, e: ru.run_args(d, s, e)),
                             ("dp2", lambda d, s, e: tiny_args(d, s, e))):
        old = os.path.join(tmp, label.replace(" ", "-"))
        cli_util.run_ok(binary, make_args(old, 6, ["checkpoint.every_steps=2",
                                                   "checkpoint.keep_last=100"]), root)
        check(committed(old) == ["step_00000002", "step_00000004", "step_00000006"],
              f"{label}: the first run saved {committed(old)}")
        # Another seed and fewer steps: a run that read any old file would not equal `fresh`.
        new = ["checkpoint.every_steps=2", "checkpoint.keep_last=100", "determinism.seed=7"]
        fresh = old + "-fresh"
        cli_util.run_ok(binary, make_args(fresh, 4, new), root)
        result = cli_util.run_ok(binary, [*make_args(old, 4, new), "--overwrite"], root)
        check("resum" not in result.stderr, f"{label}: --overwrite resumed\n{result.describe()}")
        check(ru.checkpoint_names(old) == ["latest", "step_00000002", "step_00000004"],
              f"{label}: after --overwrite checkpoints/ holds {ru.checkpoint_names(old)}, "
              "expected only the new run's")
        check(latest(old) == "step_00000004", f"{label}: latest is {latest(old)}")
        check(cli_util.read_summary(old)["resumed_from_step"] == 0,
              f"{label}: summary.json says the run resumed")
        ru.check_same_run(fresh, old, 4, f"{label}: run --overwrite vs an empty directory")
        verify(binary, root, old, 2)


def case_no_shared_fs(binary, root, tmp):
    extra = ["cluster.shared_fs=false", "checkpoint.every_steps=0"]

    def check_stopped(label, text, run_dir):
        found = [int(n) for n in re.findall(
            r"stopped by SIGTERM after step (\d+) without a checkpoint \(cluster\.shared_fs: "
            r"false turns them off\): the run cannot be continued", text)]
        check(len(found) == 1, f"{label}: expected one 'stopped by SIGTERM after step N without "
              f"a checkpoint' line\n{text}")
        check(not os.path.exists(os.path.join(run_dir, "checkpoints")) or
              not os.listdir(os.path.join(run_dir, "checkpoints")),
              f"{label}: checkpoints written: {ru.checkpoint_names(run_dir)}")
        ru.step_records(run_dir, found[0])
        return found[0]

    run_dir = os.path.join(tmp, "one-rank")
    run = Background(binary, root, ru.run_args(run_dir, 100000, extra), run_dir + ".out")
    run.wait_for_line("step 2/")
    run.process.send_signal(signal.SIGTERM)
    rc, text = run.finish()
    check(rc == 1, f"one rank: a stop without checkpoints must exit 1, got {rc}\n{text}")
    check_stopped("one rank", text, run_dir)

    run_dir = os.path.join(tmp, "dp2")
    run = Background(binary, root, tiny_args(run_dir, 100000, extra), run_dir + ".out")
    rank_pids(run, run_dir)
    wait_for_metrics_step(run, run_dir, 2)
    run.process.send_signal(signal.SIGTERM)
    rc, text = run.finish()
    check(rc == 1, f"dp2: a stop without checkpoints must exit 1, got {rc}\n{text}")
    stops = [check_stopped(f"dp2 rank {rank}", rank_log(run_dir, rank), run_dir)
             for rank in (0, 1)]
    check(stops[0] == stops[1], f"dp2: the ranks stopped after different steps: {stops}")
    check(not mu.processes_of_run(run_dir), f"dp2: left running: {mu.processes_of_run(run_dir)}")


# ---- layouts ----

def case_moe_dp_ep(binary, root, tmp):
    steps = 20
    one = os.path.join(tmp, "moe-1")
    lu.train(binary, root, one, "moe", "1", steps)
    got = os.path.join(tmp, "moe-dp2-ep2")
    lu.train(binary, root, got, "moe", "dp2-ep2", steps)
    label = "moe dp2 x ep2"
    loss_error = lu.check_losses(one, got, label, 1, steps)
    weight_error, worst = lu.check_weights(lu.final_weights(binary, root, one),
                                           lu.final_weights(binary, root, got), label)
    want = [r["dropped_tokens"] for r in lu.losses(one).values()]
    check(sum(sum(d) for d in want) > 0, "the one-rank MoE run dropped no tokens")
    have = [r["dropped_tokens"] for r in lu.losses(got).values()]
    check(want == have, f"{label}: dropped tokens per step {have}, one rank {want}")
    for step, record in lu.losses(got).items():
        check(record.get("comm_background_ms", -1) >= 0,
              f"{label}: step {step} lacks comm_background_ms (the dp x ep reduction overlaps "
              "backward)")
    print(f"{label}: loss {loss_error:.2g}, weights {weight_error:.2g} (worst tensor {worst})")


CASES = {"every_minutes": case_every_minutes, "keep_last": case_keep_last,
         "sigint": case_sigint, "signal_mid_save": case_signal_mid_save,
         "sigusr1_twice": case_sigusr1_twice, "second_sigint": case_second_sigint,
         "launcher_sigkill": case_launcher_sigkill, "failed_rank": case_failed_rank,
         "overwrite": case_overwrite,
         "no_shared_fs": case_no_shared_fs, "moe_dp_ep": case_moe_dp_ep}


if __name__ == "__main__":
    cli_util.cases_main(CASES, "promises")
