#!/usr/bin/env python3
"""cli:tiny_trains: the default recipe (recipes/tiny.yaml, 200 steps on the bundled text) trains to
a loss below 2.5 nats/byte, writes a complete run directory, and its resolved recipe.yaml
re-validates to the same hash. Wall time is printed, not asserted."""
import math
import os
import re
import time

import cli_util
from cli_util import check

STEPS = 200
EVAL_STEPS = [50, 100, 150, 200]
FIELDS = ("step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "step_ms")
TOKENS_PER_STEP = 16 * 128  # global_batch * seq_len


def main(binary, root):
    with cli_util.temp_dir("tiny") as tmp:
        run_dir = os.path.join(tmp, "run")
        start = time.monotonic()
        result = cli_util.run_ok(binary, ["run", "recipes/tiny.yaml", "--run-dir", run_dir], root)
        seconds = time.monotonic() - start

        for name in ("recipe.yaml", "metrics.jsonl", "summary.json",
                     os.path.join("logs", "rank_0.log")):
            check(os.path.isfile(os.path.join(run_dir, name)), f"run directory lacks {name}")
        events = [n for n in os.listdir(run_dir) if n.startswith("events.out.tfevents.")]
        check(len(events) == 1, f"expected one TensorBoard event file, found {events}")

        records = cli_util.read_metrics(run_dir)
        check(len(records) == STEPS, f"metrics.jsonl has {len(records)} lines, expected {STEPS}")
        for number, r in enumerate(records, 1):
            missing = [f for f in FIELDS if not isinstance(r.get(f), (int, float))]
            check(not missing, f"metrics line {number} lacks numbers for {missing}: {r}")
            check(r["step"] == number, f"metrics line {number} has step {r['step']}")
            check(r["tokens"] == number * TOKENS_PER_STEP,
                  f"step {number}: tokens {r['tokens']} != {number} * {TOKENS_PER_STEP}")
            check(math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 and r["step_ms"] > 0,
                  f"step {number}: implausible record {r}")
        val_steps = [r["step"] for r in records if "val_loss" in r]
        check(val_steps == EVAL_STEPS, f"val_loss at steps {val_steps}, expected {EVAL_STEPS}")
        last = records[-1]
        check(last["loss"] < 2.5, f"final loss {last['loss']} is not below 2.5 nats/byte")
        check(last["val_loss"] < 2.5, f"final val_loss {last['val_loss']} is not below 2.5")

        # The resolved recipe re-validates to the hash it was written with.
        with open(os.path.join(run_dir, "recipe.yaml"), encoding="utf-8") as f:
            header = f.readline()
        written = re.fullmatch(r"# resolved recipe \(hash ([0-9a-f]{16})\)\n", header)
        check(written, f"recipe.yaml does not start with its hash: {header!r}")
        validated = cli_util.run_ok(binary, ["validate", os.path.join(run_dir, "recipe.yaml")],
                                    root)
        again = re.search(r"^# recipe hash: ([0-9a-f]{16})$", validated.stdout, re.M)
        check(again, f"validate printed no hash\n{validated.describe()}")
        check(again.group(1) == written.group(1),
              f"recipe.yaml was written with hash {written.group(1)} but validates to "
              f"{again.group(1)}")
        original = cli_util.run_ok(binary, ["validate", "recipes/tiny.yaml"], root)
        check(f"# recipe hash: {written.group(1)}" in original.stdout,
              "recipes/tiny.yaml validates to another hash than the run's recipe.yaml")

        summary = cli_util.read_summary(run_dir)
        memory = summary.get("memory_bytes", {})
        planned = summary.get("memory_planned_bytes") or {}
        for category in ("params", "grads", "optimizer", "activations"):
            check(memory.get(category, 0) > 0, f"summary memory_bytes.{category} is not > 0: "
                  f"{memory}")
            # trainctl plan's memory model of this rank: the engine's bytes exactly.
            check(planned.get(category) == memory[category],
                  f"memory_planned_bytes.{category} {planned.get(category)} != the run's "
                  f"{memory[category]}")
        check(summary["steps"] == STEPS and summary["final_loss"] == last["loss"],
              f"summary disagrees with metrics.jsonl: {summary}")

        # MFU against the CPU's GEMM peak measured at start-up, the rank's memory (the summary's
        # categories added up) and the elapsed time, in metrics.jsonl and on the progress line.
        check("MFU against: " in result.stderr and "GEMM peak of this CPU" in result.stderr,
              f"the run does not say what its MFU is measured against\n{result.stderr[:2000]}")
        total = sum(memory[c] for c in ("params", "grads", "optimizer", "activations"))
        elapsed = [r["elapsed_s"] for r in records]
        check(all(b >= a for a, b in zip(elapsed, elapsed[1:])) and elapsed[-1] <= seconds,
              f"elapsed_s is not a clock of the run: {elapsed[:5]}...{elapsed[-1]}")
        # MFU = 3 x forward FLOPs per token x tokens per step / (step time x peak): with the peak
        # the log states (rounded to 0.1 GFLOP/s) and the summary's FLOPs per token. (Not
        # bounded by 1: the peak is measured once, and the machine may be busier then.)
        peak = float(re.search(r"MFU against: ([\d.]+) GFLOP/s", result.stderr).group(1)) * 1e9
        model_flops = 3 * summary["forward_flops_per_token"] * TOKENS_PER_STEP
        for r in records:
            want = model_flops / (r["step_ms"] / 1000) / peak
            check(r["mfu"] > 0 and abs(r["mfu"] / want - 1) < 0.01,
                  f"step {r['step']}: MFU {r['mfu']}, expected {want} from the step time")
            check(r["memory_bytes"] == total, f"step {r['step']}: memory_bytes "
                  f"{r['memory_bytes']} != the summary's {total}")
        line = next(l for l in result.stderr.splitlines() if l.startswith("step 200/200"))
        check(re.search(r"\| MFU \d+\.\d% \| mem [\d.]+ MiB \| elapsed \d+:\d\d:\d\d", line),
              f"the progress line lacks MFU, memory or elapsed time: {line}")
        check(re.fullmatch(r"[0-9a-f]{16}", summary.get("weights_fingerprint", "")),
              f"summary weights_fingerprint is not 16 hex digits: {summary}")
        with open(os.path.join(run_dir, "logs", "rank_0.log"), encoding="utf-8") as f:
            log = f.read()
        check("done: 200 steps" in log, "logs/rank_0.log lacks the final 'done:' line")
        check("done: 200 steps" in result.stderr, "stderr lacks the final 'done:' line")
        print(f"final loss {last['loss']:.4f}, val_loss {last['val_loss']:.4f}, "
              f"{seconds:.1f} s wall")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
