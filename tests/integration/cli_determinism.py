#!/usr/bin/env python3
"""cli:determinism: two runs of the same recipe write identical metrics (every field but the
timings) and identical final weights; a different seed gives different losses and weights."""
import os

import cli_util
from cli_util import check

TIMING_FIELDS = {"tokens_per_s", "step_ms", "mfu", "elapsed_s"}
STEPS = 12


def train(binary, root, run_dir, extra=()):
    cli_util.run_ok(binary, cli_util.small_run_args(run_dir, STEPS, extra), root)
    records = cli_util.read_metrics(run_dir)
    check(len(records) == STEPS, f"{run_dir}: {len(records)} metrics lines, expected {STEPS}")
    for r in records:
        check(TIMING_FIELDS <= r.keys(), f"{run_dir}: step {r.get('step')} lacks a timing field")
    stripped = [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]
    return stripped, cli_util.read_summary(run_dir)["weights_fingerprint"]


def main(binary, root):
    with cli_util.temp_dir("determinism") as tmp:
        first, first_weights = train(binary, root, os.path.join(tmp, "a"))
        second, second_weights = train(binary, root, os.path.join(tmp, "b"))
        for a, b in zip(first, second):
            check(a == b, f"step {a['step']} differs between identical runs:\n{a}\n{b}")
        check(first_weights == second_weights,
              f"weights differ between identical runs: {first_weights} != {second_weights}")
        # A real test of the seed: it must reach the weights and the losses.
        other, other_weights = train(binary, root, os.path.join(tmp, "c"),
                                     ["determinism.seed=4321"])
        check(other_weights != first_weights, "seed 4321 gave the same weights as seed 1234")
        check(other[0]["loss"] != first[0]["loss"] and other[-1]["loss"] != first[-1]["loss"],
              "seed 4321 gave the same first/last loss as seed 1234")
        print(f"weights {first_weights}, seed 4321: {other_weights}")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
