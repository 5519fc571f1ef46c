#!/usr/bin/env python3
"""cli:plan: `trainctl plan` ranks layouts for a cluster file (table and --json), previews the
recipe's own layout (or a --layout) first with its memory, step time, place in the ranking and
placement, or the constraint that keeps it from running, prints the topology, rejects bad cluster
files, bad --layout values and impossible requests with exit code 2 (still naming what binds the
previewed layout, and with --json still a document), and `parallel: auto` makes `run` train with
the planner's layout."""
import json
import os

import cli_util
from cli_util import check

H100 = "configs/clusters/dgx-h100.yaml"


def main(binary, root):
    # The table: ranked layouts, the placement grid, the runner-ups' reasons.
    result = cli_util.run_ok(binary, ["plan", "recipes/tiny.yaml", "--cluster", H100,
                                      "--nodes", "2", "--top", "3"], root)
    for text in ("tokens/s/GPU", "best: tp=", "node     0:", "why the runner-ups lost",
                 "rejected"):
        check(text in result.stdout, f"'{text}' missing\n{result.describe()}")

    # --json: the same plan as a stable document.
    result = cli_util.run_ok(binary, ["plan", "recipes/tiny.yaml", "--cluster", H100,
                                      "--nodes", "2", "--top", "3", "--json"], root)
    doc = json.loads(result.stdout)
    check(doc["schema"] == "trainctl.plan/1", f"schema: {doc.get('schema')}")
    check(doc["world"] == 16, f"world: {doc['world']}")
    check(len(doc["ranked"]) == 3, f"ranked: {len(doc['ranked'])}")
    first = doc["ranked"][0]["layout"]
    check(first["tp"] * first["pp"] * first["dp"] * first["ep"] == 16, f"layout {first}")
    check(len(doc["placement"]["ranks"]) == 16, "placement rows")

    # The recipe's own layout (dp1 on 16 GPUs: another world) is previewed first, with why it
    # cannot run there; a --layout that runs gets its figures and its place in the ranking.
    result = cli_util.run_ok(binary, ["plan", "recipes/tiny.yaml", "--cluster", H100,
                                      "--nodes", "2", "--top", "3"], root)
    check(result.stdout.startswith("the recipe's layout (recipes/tiny.yaml): tp=1 pp=1 dp=1 ")
          and "uses tp * pp * dp * ep = 1 GPUs; the cluster has 16" in result.stdout,
          f"the recipe's layout is not previewed first\n{result.describe()}")
    result = cli_util.run_ok(binary, ["plan", "recipes/tiny.yaml", "--cluster", H100, "--nodes",
                                      "2", "--layout", "tp=2,pp=2,zero=3,mb=2", "--json"], root)
    preview = json.loads(result.stdout)["preview"]
    check(preview["layout"]["dp"] == 4 and preview["layout"]["zero"] == 3 and preview["runs"]
          and preview["rank"] >= 1 and preview["memory_bytes"]["total"] > 0
          and preview["time_seconds"]["step"] > 0,
          f"--layout tp=2,pp=2,zero=3,mb=2 (dp the rest: 4) is not scored: {preview}")
    result = cli_util.run_ok(binary, ["plan", "recipes/tiny.yaml", "--cluster", H100, "--nodes",
                                      "2", "--layout", "tp=2,pp=2,zero=3,mb=2"], root)
    check("--layout tp=2,pp=2,zero=3,mb=2: tp=2 pp=2 dp=4 " in result.stdout
          and "  runs: " in result.stdout
          and "GPU placement of tp=2 pp=2 dp=4" in result.stdout,
          f"the --layout preview lacks its figures or placement\n{result.describe()}")
    # Sequence parallelism (sp=1) is scored as such: the same layout's activations shrink.
    activations = {}
    for sp in (0, 1):
        result = cli_util.run_ok(binary, ["plan", "recipes/tiny.yaml", "--cluster", H100,
                                          "--nodes", "2", "--layout", f"tp=2,sp={sp},mb=1", "--json"],
                                 root)
        preview = json.loads(result.stdout)["preview"]
        check(preview["layout"]["sequence_parallel"] == bool(sp),
              f"--layout tp=2,sp={sp},mb=1: not scored with sequence_parallel {bool(sp)}: {preview}")
        activations[sp] = preview["memory_bytes"]["activations"]
    check(activations[1] < activations[0],
          f"sequence parallelism does not shrink the activations: {activations}")
    # Context parallelism (cp=2) is scored with its ring: a rank's activations halve, and the
    # step has a cp ring time.
    previews = {}
    for cp in (1, 2):
        result = cli_util.run_ok(binary, ["plan", "recipes/tiny.yaml", "--cluster", H100,
                                          "--nodes", "2", "--layout", f"cp={cp},mb=1", "--json"],
                                 root)
        previews[cp] = json.loads(result.stdout)["preview"]
    one, two = previews[1], previews[2]
    check(two["layout"]["cp"] == 2 and two["layout"]["dp"] == 8
          and two["time_seconds"]["cp_comm"] > 0 and one["time_seconds"]["cp_comm"] == 0
          and two["memory_bytes"]["activations"] < one["memory_bytes"]["activations"],
          f"--layout cp=2,mb=1: not scored as context parallel: {two} (cp=1: {one})")
    for layout, says in (("tp=3", "does not divide: model.heads % tp = 4 % 3"),
                         ("sp=1", "sequence_parallel with tp = 1; it splits the tokens"),
                         ("dp=16,mb=8", "global_batch % (micro_batch * dp * ep)")):
        result = cli_util.run_ok(binary, ["plan", "recipes/tiny.yaml", "--cluster", H100,
                                          "--nodes", "2", "--layout", layout], root)
        check(says in result.stdout, f"--layout {layout}: not '{says}'\n{result.describe()}")
    for layout, says in (("tp=x", "--layout tp=x: not a whole number"),
                         ("sp=2", "--layout sp=2: use 0 or 1"),
                         ("xp=2", "--layout key 'xp' is unknown"),
                         ("recompute=some", "--layout recompute=some: use none, selective or "
                                            "full")):
        result = cli_util.run(binary, ["plan", "recipes/tiny.yaml", "--cluster", H100,
                                       "--layout", layout], root)
        check(result.rc == 2 and says in result.stderr,
              f"--layout {layout}: expected exit 2 naming '{says}'\n{result.describe()}")

    # --show-topology prints the cluster and exits 0.
    result = cli_util.run_ok(binary, ["plan", "recipes/tiny.yaml", "--cluster", H100,
                                      "--show-topology"], root)
    check(result.stdout.strip(), f"empty topology\n{result.describe()}")

    with cli_util.temp_dir("plan") as tmp:
        # A bad cluster file: exit 2 naming the file.
        bad = os.path.join(tmp, "bad.yaml")
        with open(bad, "w", encoding="utf-8") as f:
            f.write("name: broken\ngpus_per_node: many\n")
        result = cli_util.run(binary, ["plan", "recipes/tiny.yaml", "--cluster", bad], root)
        check(result.rc == 2, f"bad cluster file: expected exit 2\n{result.describe()}")
        check("bad.yaml" in result.stderr, f"the file is not named\n{result.describe()}")

        # Nothing fits: a huge model on one PCIe box.
        result = cli_util.run(binary, [
            "plan", "recipes/tiny.yaml", "--cluster", "configs/clusters/pcie-l40s.yaml",
            "--nodes", "1", "--set", "model.layers=96", "--set", "model.hidden=12288",
            "--set", "model.heads=96", "--set", "model.kv_heads=96",
            "--set", "model.ffn_hidden=49152"], root)
        check(result.rc == 2, f"nothing fits: expected exit 2\n{result.describe()}")
        check("does not fit" in result.stderr, f"no reason\n{result.describe()}")
        # ... and still previews the recipe's layout with what binds it; --json still emits a
        # document, with the error and the preview.
        check("does not run on" in result.stdout and "does not fit: " in result.stdout,
              f"no preview of the recipe's layout\n{result.describe()}")
        result = cli_util.run(binary, [
            "plan", "recipes/tiny.yaml", "--cluster", "configs/clusters/pcie-l40s.yaml",
            "--nodes", "1", "--set", "model.layers=96", "--set", "model.hidden=12288",
            "--set", "model.heads=96", "--set", "model.kv_heads=96",
            "--set", "model.ffn_hidden=49152", "--json", "--layout", "tp=8"], root)
        doc = json.loads(result.stdout)
        check(result.rc == 2 and doc["ranked"] == [] and "does not fit" in doc["error"]
              and "does not fit: " in doc["preview"]["problem"]
              and doc["preview"]["memory_bytes"]["total"] > 0,
              f"nothing fits, --json: no error or preview\n{result.describe()}")

        # More GPUs than the batch can feed (16 sequences, 4096 GPUs).
        result = cli_util.run(binary, ["plan", "recipes/tiny.yaml", "--cluster", H100,
                                       "--nodes", "512"], root)
        check(result.rc == 2, f"too many GPUs: expected exit 2\n{result.describe()}")
        check("more GPUs than the batch can feed" in result.stderr,
              f"no reason\n{result.describe()}")

        # parallel: auto -> run uses the planner's layout for this machine (a world of 1).
        run_dir = os.path.join(tmp, "auto")
        args = cli_util.small_run_args(run_dir, 2, ["parallel=auto"])
        result = cli_util.run_ok(binary, args, root)
        check("parallel: auto -> tp=1 pp=1 dp=1 ep=1" in result.stderr + result.stdout,
              f"the chosen layout is not reported\n{result.describe()}")
        with open(os.path.join(run_dir, "recipe.yaml"), encoding="utf-8") as f:
            resolved = f.read()
        check("parallel: auto" not in resolved and "  tp: 1" in resolved,
              f"recipe.yaml does not record the layout that ran:\n{resolved}")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
