#!/usr/bin/env python3
"""cli:lineage: `trainctl lineage` on runs of the small tiny model. A run trained at seed 1
descends from seed 1 (p < 1e-6) and not from seed 2 (p > 1e-3); a seed-1 sibling with another
learning rate shares its initialisation (--against: small p) and a seed-2 run on the same data does
not (large p); the step, checkpoints and run directory forms name the same checkpoint; --json is a
document with the statistic; bad input exits 2 naming the value and the fix: a missing path, a
folder that holds no checkpoint, a --seed that is not an integer >= 0, neither --seed nor
--against, and --against a checkpoint of another model (naming both).
"""
import json
import math
import os

import cli_util
from cli_util import check

STEPS = 30


def train(binary, root, run_dir, seed, extra=()):
    cli_util.run_ok(binary, cli_util.small_run_args(
        run_dir, STEPS, [f"determinism.seed={seed}", "logging.tensorboard=false",
                         "logging.eval_every_steps=0", *extra]), root)


def lineage(binary, root, args):
    """The --json document of a lineage test that must exit 0."""
    result = cli_util.run_ok(binary, ["lineage", *args, "--json"], root)
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError as error:
        raise cli_util.CheckFailed(f"--json output is not JSON ({error})\n{result.describe()}")


def log10_p(doc):
    """log10 p of a document, checked against its p where p has not underflowed."""
    if doc["p"] > 0:
        check(math.isclose(math.log10(doc["p"]), doc["log10_p"], rel_tol=1e-6, abs_tol=1e-9),
              f"log10_p {doc['log10_p']} is not log10(p = {doc['p']})")
    return doc["log10_p"]


def expect_bad_input(binary, root, args, *needles):
    result = cli_util.run(binary, ["lineage", *args], root)
    check(result.rc == 2, f"expected exit code 2 (bad input)\n{result.describe()}")
    for needle in needles:
        check(needle in result.stderr, f"the message does not name {needle!r}\n{result.describe()}")


def body(binary, root):
    with cli_util.temp_dir("lineage") as tmp:
        a, sibling, other = (os.path.join(tmp, name) for name in ("a", "sibling", "other"))
        train(binary, root, a, 1)
        train(binary, root, sibling, 1, ["optimizer.lr=1.0e-3"])
        train(binary, root, other, 2)
        step = os.path.join(a, "checkpoints", f"step_{STEPS:08d}")
        check(os.path.isfile(os.path.join(step, "manifest.json")), f"{step} was not saved")

        own = lineage(binary, root, [a, "--seed", "1"])
        check(log10_p(own) < -6 and own["descends"],
              f"seed 1's run against seed 1: p = 10^{own['log10_p']}, expected < 1e-6: {own}")
        check(own["seed"] == 1 and own["step"] == STEPS, f"the document names the test: {own}")
        check(own["elements"] > 0 and any(t["used"] for t in own["tensors"]),
              f"no tensor used: {own}")
        check("descends from seed 1" in own["verdict"], f"verdict: {own['verdict']}")
        # The same checkpoint named as a step directory and as a checkpoints directory.
        for form in (step, os.path.join(a, "checkpoints")):
            again = lineage(binary, root, [form, "--seed", "1"])
            check(again["statistic"] == own["statistic"] and again["step"] == STEPS,
                  f"{form} gives another result: {again['statistic']} vs {own['statistic']}")

        wrong = lineage(binary, root, [a, "--seed", "2"])
        check(log10_p(wrong) > -3 and not wrong["descends"],
              f"seed 1's run against seed 2: p = {wrong['p']}, expected > 1e-3")
        check("no evidence" in wrong["verdict"], f"verdict: {wrong['verdict']}")

        related = lineage(binary, root, [a, "--against", sibling])
        check(log10_p(related) < -6 and related["descends"],
              f"two seed-1 runs (lr 3e-3 and 1e-3): p = 10^{related['log10_p']}, expected small")
        unrelated = lineage(binary, root, [a, "--against", other])
        check(log10_p(unrelated) > -3 and not unrelated["descends"],
              f"seed-1 and seed-2 runs on the same data: p = {unrelated['p']}, expected large")

        text = cli_util.run_ok(binary, ["lineage", a, "--seed", "1"], root).stdout
        for needle in ("statistic", "log10 p", "verdict", "descends from seed 1"):
            check(needle in text, f"the report has no {needle!r}:\n{text}")

        # Bad input: exit 2, naming what is wrong and what to give.
        missing = os.path.join(tmp, "missing")
        expect_bad_input(binary, root, [missing, "--seed", "1"], missing, "run directory")
        empty = os.path.join(tmp, "empty")
        os.mkdir(empty)
        expect_bad_input(binary, root, [empty, "--seed", "1"], empty, "no checkpoint")
        expect_bad_input(binary, root, [a, "--seed", "abc"], "abc", "determinism.seed")
        expect_bad_input(binary, root, [a, "--seed", "-1"], "-1", "determinism.seed")
        expect_bad_input(binary, root, [a], "--seed", "--against")
        expect_bad_input(binary, root, [a, "--against", missing], missing)
        narrow = os.path.join(tmp, "narrow")
        cli_util.run_ok(binary, cli_util.small_run_args(
            narrow, 2, ["model.hidden=32", "logging.tensorboard=false",
                        "logging.eval_every_steps=0"]), root)
        expect_bad_input(binary, root, [a, "--against", narrow], a, narrow, "different models")


if __name__ == "__main__":
    cli_util.main_wrapper(body)
