#!/usr/bin/env python3
"""cli:stability_*: the stability guard (stability.*, lib/train/stability.hpp) under injected faults.

A NaN in one batch's gradients (--debug-nan-batch: data rank 0's only, so the job-wide decision is
tested too) and a loss spike in one batch (--debug-spike-batch: loss and gradients x100, caught
by stability.loss_z over a 4-step window), each under `skip` and `rollback`: the run continues,
the event is a log line, a metrics.jsonl record and a TensorBoard point, and the run equals, bit
for bit (every step's loss, lr and gradient norm, and the final weights), a run that never saw
the skipped batches (--debug-drop-batch) with the same number of applied steps.

skip:     NaN at batch 5 and a spike at batch 9, one rank.
rollback: NaN at batch 8 with a snapshot every 3 steps: back to step 6, batches 7-8 skipped;
          a spike at batch 9 with a snapshot every step; a rollback with stability.lr_factor 0.5
          for 2 steps (the lowered rate is logged and the rest of the run has the plain one).
layouts:  skip at dp 2 (only rank 0's gradients are NaN), rollback at dp 2 with ZeRO-1 and
          at pp 2 x tp 2.
resume:   with spike tests on, N steps then `trainctl resume --set training.steps=2N`, the
          spike after the resume: equals the straight run (the guard's windows travel in the
          checkpoint).
stop:     three NaN batches in a row with stability.max_events 3: exit 1, the events listed with
          what to try, provenance "failed", the three records in metrics.jsonl.
bad_input: rollback without checkpoint.memory_every_steps: exit 2 naming both keys, nothing
          created.
"""
import json
import os

import cli_resume_util as ru
import cli_util
from cli_util import check

STEPS = 12
SPIKE = ["stability.loss_z=4", "stability.window=4"]
ROLLBACK = ["stability.action=rollback"]
FIELDS = ("loss", "lr", "grad_norm")


def steps_of(run_dir):
    """{step: record} of the run's step records, the last record of a step winning (a rollback
    repeats the steps after its snapshot), and the guard's event records."""
    records = cli_util.read_metrics(run_dir)
    steps = {}
    for r in records:
        if "event" not in r:
            steps[r["step"]] = r
    return steps, [r for r in records if "event" in r]


def train(binary, root, run_dir, extra, flags=(), steps=STEPS):
    return cli_util.run_ok(binary, ru.run_args(run_dir, steps, extra) + list(flags), root)


def check_equal(label, got_dir, want_dir, steps=STEPS, lr_differs=()):
    got, _ = steps_of(got_dir)
    want, _ = steps_of(want_dir)
    check(sorted(got) == list(range(1, steps + 1)), f"{label}: steps {sorted(got)}")
    for step in range(1, steps + 1):
        for field in FIELDS:
            if step in lr_differs:
                continue
            check(got[step][field] == want[step][field],
                  f"{label}: step {step} {field} is {got[step][field]!r}, the run that never saw "
                  f"the skipped batches had {want[step][field]!r}")
    a = cli_util.read_summary(got_dir)["weights_fingerprint"]
    b = cli_util.read_summary(want_dir)["weights_fingerprint"]
    check(a == b, f"{label}: final weights {a} differ from the run without the batches ({b})")


def guarded(binary, root, tmp, name, extra, fault, reference_drop, want_event, want_line,
            tensorboard=False):
    """The guarded run with `fault` (flags), the reference that drops `reference_drop`; checks the
    log line, the event record and (tensorboard) the stability/events point."""
    sets = [*extra, *(["logging.tensorboard=true"] if tensorboard else [])]
    run_dir = os.path.join(tmp, name)
    result = train(binary, root, run_dir, sets, fault)
    reference = os.path.join(tmp, name + "-reference")
    train(binary, root, reference, extra, ["--debug-drop-batch", reference_drop])
    check(want_line in result.stderr, f"{name}: no line {want_line!r}\n{result.describe()}")
    log = open(os.path.join(run_dir, "logs", "rank_0.log"), encoding="utf-8").read()
    check(want_line in log, f"{name}: the rank log lacks {want_line!r}\n{log}")
    _, events = steps_of(run_dir)
    check(len(events) == 1, f"{name}: expected one event record, got {events}")
    for key, value in want_event.items():
        check(events[0].get(key) == value, f"{name}: event {key} is {events[0].get(key)!r}, "
              f"expected {value!r}: {events[0]}")
    steps, _ = steps_of(run_dir)
    check(steps[STEPS].get("stability_events") == 1, f"{name}: {steps[STEPS]}")
    check(cli_util.read_summary(run_dir)["stability_events"] == 1, f"{name}: summary")
    check_equal(name, run_dir, reference)
    if tensorboard:
        import cli_tensorboard
        scalars = cli_tensorboard.load_scalars(run_dir)
        check(scalars.get("stability/events") == {want_event["step"]: 1.0},
              f"{name}: TensorBoard stability/events is {scalars.get('stability/events')}")


def case_skip(binary, root, tmp):
    guarded(binary, root, tmp, "nan", [], ["--debug-nan-batch", "5"], "5",
            {"event": "non_finite", "action": "skip", "step": 5, "batch": 5, "first_batch": 5,
             "to_step": 4, "grad_norm": None, "in_a_row": 1},
            "step 5: non-finite gradient (norm nan): batch 5 skipped, step 5 retried with the "
            "next batch", tensorboard=True)
    guarded(binary, root, tmp, "spike", SPIKE, ["--debug-spike-batch", "9"], "9",
            {"event": "loss_spike", "action": "skip", "step": 9, "batch": 9, "threshold": 4,
             "window": 4}, "step 9: loss spike (loss ")


def case_rollback(binary, root, tmp):
    guarded(binary, root, tmp, "nan", [*ROLLBACK, "checkpoint.memory_every_steps=3"],
            ["--debug-nan-batch", "8"], "7,8",
            {"event": "non_finite", "action": "rollback", "step": 8, "batch": 8,
             "first_batch": 7, "to_step": 6},
            "step 8: non-finite gradient (norm nan): rolled back to the snapshot of step 6, "
            "batches 7-8 skipped")
    guarded(binary, root, tmp, "spike", [*ROLLBACK, *SPIKE, "checkpoint.memory_every_steps=1"],
            ["--debug-spike-batch", "9"], "9",
            {"event": "loss_spike", "action": "rollback", "step": 9, "batch": 9,
             "first_batch": 9, "to_step": 8}, "rolled back to the snapshot of step 8, batch 9")
    # A lowered learning rate for the 2 steps after the rollback, then the schedule's own.
    lowered = os.path.join(tmp, "lowered")
    train(binary, root, lowered, [*ROLLBACK, "checkpoint.memory_every_steps=3",
                                  "stability.lr_factor=0.5", "stability.lr_steps=2"],
          ["--debug-nan-batch", "8"])
    got, _ = steps_of(lowered)
    want, _ = steps_of(os.path.join(tmp, "nan-reference"))
    for step in range(1, STEPS + 1):
        factor = 0.5 if step in (7, 8) else 1.0
        check(got[step]["lr"] == want[step]["lr"] * factor,
              f"lr_factor: step {step} lr {got[step]['lr']}, expected {factor} x "
              f"{want[step]['lr']}")
    check(got[7]["loss"] == want[7]["loss"] and got[9]["loss"] != want[9]["loss"],
          "lr_factor: step 7's loss comes before the lowered update, step 9's after it")


def case_layouts(binary, root, tmp):
    for name, layout, extra, fault, drop in (
            ("dp2", ["parallel.dp=2"], [], "5", "5"),
            ("dp2-zero1", ["parallel.dp=2", "parallel.zero=1"],
             [*ROLLBACK, "checkpoint.memory_every_steps=3"], "8", "7,8"),
            ("pp2-tp2", ["parallel.pp=2", "parallel.tp=2"],
             [*ROLLBACK, "checkpoint.memory_every_steps=3"], "8", "7,8")):
        run_dir = os.path.join(tmp, name)
        train(binary, root, run_dir, [*layout, *extra], ["--debug-nan-batch", fault])
        reference = os.path.join(tmp, name + "-reference")
        train(binary, root, reference, layout, ["--debug-drop-batch", drop])
        _, events = steps_of(run_dir)
        check(len(events) == 1, f"{name}: expected one event, got {events}")
        check_equal(name, run_dir, reference)


def case_resume(binary, root, tmp):
    for name, extra in (("skip", SPIKE),
                        ("rollback", [*SPIKE, *ROLLBACK, "checkpoint.memory_every_steps=2"])):
        sets = [*extra, f"schedule.decay_steps={STEPS}", "checkpoint.every_steps=0"]
        straight = os.path.join(tmp, name + "-straight")
        train(binary, root, straight, sets, ["--debug-spike-batch", "9"])
        resumed = os.path.join(tmp, name + "-resumed")
        train(binary, root, resumed, sets, ["--debug-spike-batch", "9"], steps=STEPS // 2)
        cli_util.run_ok(binary, ru.resume_args(resumed, [f"training.steps={STEPS}"]) +
                        ["--debug-spike-batch", "9"], root)
        _, events = steps_of(resumed)
        check(len(events) == 1 and events[0]["step"] == 9,
              f"{name}: the resumed run must catch the spike at step 9 with the windows it "
              f"saved: {events}")
        check_equal(f"resume ({name})", resumed, straight)


def case_stop(binary, root, tmp):
    run_dir = os.path.join(tmp, "run")
    result = cli_util.run(binary, ru.run_args(run_dir, STEPS, ["stability.max_events=3"]) +
                          ["--debug-nan-batch", "5,6,7"], root)
    check(result.rc == 1, f"three events in a row must stop the run with exit 1\n"
          f"{result.describe()}")
    want = ("stability: 3 events in a row without getting past step 4; the run stops:\n"
            "  step 5: non-finite gradient (norm nan): batch 5 skipped, step 5 retried with the "
            "next batch\n"
            "  step 5: non-finite gradient (norm nan): batch 6 skipped, step 5 retried with the "
            "next batch\n"
            "  step 5: non-finite gradient (norm nan): batch 7 skipped, step 5 retried with the "
            "next batch\n"
            "the data or the learning rate is the likely cause")
    check(want in result.stderr, f"the report must list the events\n{result.describe()}")
    _, events = steps_of(run_dir)
    check([(e["batch"], e["in_a_row"]) for e in events] == [(5, 1), (6, 2), (7, 3)],
          f"metrics.jsonl must hold the three events: {events}")
    with open(os.path.join(run_dir, "provenance.json"), encoding="utf-8") as f:
        segments = json.load(f)["segments"]
    check(segments[-1]["outcome"] == "failed", f"provenance: {segments[-1]}")


def case_bad_input(binary, root, tmp):
    run_dir = os.path.join(tmp, "run")
    cli_util.check_refused(binary, ru.run_args(run_dir, STEPS, ROLLBACK), root,
                           "checkpoint.memory_every_steps = 0 takes none", run_dir)


if __name__ == "__main__":
    cli_util.cases_main({"skip": case_skip, "rollback": case_rollback, "layouts": case_layouts,
                         "resume": case_resume, "stop": case_stop, "bad_input": case_bad_input},
                        "stability")
