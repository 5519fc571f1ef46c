"""Helpers shared by the checkpoint and resume CLI tests (cli_resume_*.py, cli_crash_*.py,
cli_disk_full.py): small runs of recipes/tiny.yaml, stopping a run with a signal once its log shows
a given step, and comparing two runs step by step.

Two runs are "the same" when metrics.jsonl holds every step exactly once, in order, with equal
loss, learning rate, gradient norm (and loss scale / skipped flag for fp16, router losses for MoE),
and summary.json has the same weights_fingerprint: bit-identical, not merely close.
"""
import os
import re
import signal
import subprocess
import threading

import cli_util
from cli_util import check

# Every step on its own plain progress line ("step 3/16 | loss ..."), no evaluation before the
# end and no TensorBoard file: the runs stay small and the log says where a run is.
QUIET = ["logging.eval_every_steps=0", "logging.tensorboard=false", "logging.every_steps=1",
         "logging.progress=plain"]

# The fields of a metrics.jsonl record that a resumed run must reproduce exactly.
EXACT_FIELDS = ("loss", "lr", "grad_norm", "loss_scale", "skipped", "aux_loss", "z_loss",
                "expert_load", "dropped_tokens")


def run_args(run_dir, steps, extra=()):
    """`trainctl run recipes/tiny.yaml` with the small model, `steps` steps, QUIET and `extra`."""
    return cli_util.small_run_args(run_dir, steps, [*QUIET, *extra])


def resume_args(run_dir, sets=()):
    """`trainctl resume RUN_DIR` with `--set` for each of `sets`."""
    return ["resume", run_dir, *[a for s in sets for a in ("--set", s)]]


def step_records(run_dir, steps):
    """metrics.jsonl's records, checked to be steps 1..`steps` exactly once and in order."""
    records = cli_util.read_metrics(run_dir)
    seen = [r.get("step") for r in records]
    check(seen == list(range(1, steps + 1)),
          f"{run_dir}/metrics.jsonl holds steps {seen}; expected 1..{steps}, each once, in order")
    return records


def check_same_run(expected_dir, got_dir, steps, label):
    """Fails unless the run in `got_dir` equals the one in `expected_dir` bit for bit."""
    want, got = step_records(expected_dir, steps), step_records(got_dir, steps)
    for a, b in zip(want, got):
        for field in EXACT_FIELDS:
            check(a.get(field) == b.get(field),
                  f"{label}: step {a['step']} {field} is {b.get(field)!r}, the straight run had "
                  f"{a.get(field)!r}")
    want_weights = cli_util.read_summary(expected_dir)["weights_fingerprint"]
    got_weights = cli_util.read_summary(got_dir)["weights_fingerprint"]
    check(want_weights == got_weights,
          f"{label}: final weights {got_weights} differ from the straight run's {want_weights}")


def checkpoint_names(run_dir):
    """The entries of <run_dir>/checkpoints (step dirs, tmp dirs, latest, rejected)."""
    path = os.path.join(run_dir, "checkpoints")
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


class Stopped:
    """The outcome of run_until_signal: exit code, merged stdout+stderr, the step it stopped at."""

    def __init__(self, args, rc, output, sent_at):
        self.args, self.rc, self.output, self.sent_at = args, rc, output, sent_at

    def describe(self):
        return (f"command: {' '.join(self.args)}\nexit code: {self.rc}\nsignal sent after step "
                f"{self.sent_at}\n--- output ---\n{self.output}")


def run_until_signal(binary, args, cwd, at_step, signum, timeout=120):
    """Runs trainctl and sends `signum` as soon as its progress shows step `at_step` done."""
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    process = subprocess.Popen([binary, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(timeout, process.kill)
    watchdog.start()
    lines, sent_at = [], None
    try:
        for line in process.stdout:
            lines.append(line)
            if sent_at is None and line.startswith(f"step {at_step}/"):
                process.send_signal(signum)
                sent_at = at_step
        rc = process.wait()
    finally:
        watchdog.cancel()
    return Stopped([binary, *args], rc, "".join(lines), sent_at)


def stop_with_signal(binary, args, cwd, run_dir, at_step, total_steps, signum):
    """Runs to `at_step`, stops the run with `signum` and checks the documented outcome: exit code
    75, a "stopped by SIG..." line naming the step and the resume command, that step's checkpoint
    committed, metrics.jsonl holding steps 1..that step, report.html drawn. Returns the step it stopped after."""
    result = run_until_signal(binary, args, cwd, at_step, signum)
    name = signal.Signals(signum).name
    check(result.sent_at is not None,
          f"the run never printed 'step {at_step}/', so {name} was never sent\n"
          f"{result.describe()}")
    check(result.rc == 75, f"a run stopped by {name} must exit 75 (saved, resumable)\n"
          f"{result.describe()}")
    match = re.search(rf"stopped by {name} after step (\d+), checkpoint saved; continue with: "
                      rf"trainctl resume {re.escape(run_dir)}\n", result.output)
    check(match, f"no 'stopped by {name} after step N, checkpoint saved; continue with: trainctl "
          f"resume {run_dir}' line\n{result.describe()}")
    stopped = int(match.group(1))
    check(at_step <= stopped < total_steps,
          f"stopped after step {stopped}, expected a step in [{at_step}, {total_steps}) (the "
          f"signal came after step {at_step})\n{result.describe()}")
    check(f"step_{stopped:08d}" in checkpoint_names(run_dir),
          f"no checkpoint step_{stopped:08d} after the stop: {checkpoint_names(run_dir)}")
    step_records(run_dir, stopped)
    page = os.path.join(run_dir, "report.html")
    check(f"report: {page}\n" in result.output and os.path.isfile(page),
          f"a stopped run draws its report too: no 'report: {page}' line or no file\n"
          f"{result.describe()}")
    return stopped
