#!/usr/bin/env python3
"""cli:tensorboard: the event file of a run loads in TensorBoard's own reader and holds, for every
step, exactly the float32 values of metrics.jsonl: train/loss, train/lr, train/grad_norm,
perf/tokens_per_s, perf/step_ms, perf/mfu, memory/bytes, val/loss at evaluation steps; plus
train/loss_scale with fp16 and moe/aux_loss (and a per-layer expert_load in metrics.jsonl whose
loads sum to 1) with MoE."""
import math
import os
import struct

import cli_util
from cli_util import check

STEPS = 6
EVAL_EVERY = 3


def as_float32(x):
    """The float32 nearest to x, widened back to a Python float (what TensorBoard stores)."""
    if x is None:  # metrics.jsonl writes non-finite numbers as null
        return None
    return struct.unpack("<f", struct.pack("<f", x))[0]


def load_scalars(run_dir):
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as error:
        raise cli_util.CheckFailed(f"cannot import tensorboard ({error}); "
                                   "run scripts/setup --tests")
    events = [n for n in os.listdir(run_dir) if n.startswith("events.out.tfevents.")]
    check(len(events) == 1, f"{run_dir}: expected one event file, found {events}")
    accumulator = event_accumulator.EventAccumulator(
        run_dir, size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    return {tag: {e.step: e.value for e in accumulator.Scalars(tag)}
            for tag in accumulator.Tags()["scalars"]}


def same(expected, got):
    if expected is None:
        return got is not None and not math.isfinite(got)
    return got == expected


def compare(run_dir, tag_to_field):
    """Every tag holds, at every step, the float32 value of its metrics.jsonl field."""
    records = cli_util.read_metrics(run_dir)
    check([r["step"] for r in records] == list(range(1, STEPS + 1)),
          f"{run_dir}: metrics steps {[r['step'] for r in records]}")
    scalars = load_scalars(run_dir)
    for tag, field in tag_to_field.items():
        check(tag in scalars, f"{run_dir}: TensorBoard has no tag {tag}; tags: {sorted(scalars)}")
        expected = {r["step"]: as_float32(r[field]) for r in records if field in r}
        check(expected, f"{run_dir}: metrics.jsonl has no field {field}")
        check(sorted(scalars[tag]) == sorted(expected),
              f"{tag}: steps {sorted(scalars[tag])} but metrics.jsonl has {field} at steps "
              f"{sorted(expected)}")
        for step, value in expected.items():
            check(same(value, scalars[tag][step]),
                  f"{tag} at step {step}: TensorBoard {scalars[tag][step]!r} != float32 of "
                  f"metrics.jsonl {field} {value!r}")
    return records, scalars


BASE_TAGS = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm",
             "perf/tokens_per_s": "tokens_per_s", "perf/step_ms": "step_ms", "perf/mfu": "mfu",
             "memory/bytes": "memory_bytes", "val/loss": "val_loss"}


def main(binary, root):
    with cli_util.temp_dir("tensorboard") as tmp:
        plain = os.path.join(tmp, "plain")
        cli_util.run_ok(binary, cli_util.small_run_args(
            plain, STEPS, [f"logging.eval_every_steps={EVAL_EVERY}"]), root)
        records, scalars = compare(plain, BASE_TAGS)
        val_steps = sorted(scalars["val/loss"])
        check(val_steps == list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY)),
              f"val/loss at steps {val_steps}, expected every {EVAL_EVERY} steps")
        for tag in ("train/loss_scale", "moe/aux_loss"):
            check(tag not in scalars, f"{tag} written for a bf16 dense run")

        fp16 = os.path.join(tmp, "fp16")
        cli_util.run_ok(binary, cli_util.small_run_args(
            fp16, STEPS, ["precision.compute=fp16", "logging.eval_every_steps=0"]), root)
        records, scalars = compare(fp16, {**BASE_TAGS, "train/loss_scale": "loss_scale"})
        check(all(r["loss_scale"] > 0 for r in records), "fp16: loss_scale not positive")

        moe = os.path.join(tmp, "moe")
        cli_util.run_ok(binary, cli_util.small_run_args(
            moe, STEPS, ["moe.experts=4", "moe.top_k=2", "logging.eval_every_steps=0"]), root)
        records, scalars = compare(moe, {**BASE_TAGS, "moe/aux_loss": "aux_loss",
                                         "moe/z_loss": "z_loss"})
        for r in records:
            # 2 layers with moe.every 2: layer 1 is the only MoE layer.
            load = r["expert_load"]
            check(len(load) == 1 and len(load[0]) == 4,
                  f"step {r['step']}: expected one MoE layer of 4 experts, got {load}")
            check(abs(sum(load[0]) - 1.0) < 1e-6,
                  f"step {r['step']}: expert loads {load[0]} sum to {sum(load[0])}, not 1")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
