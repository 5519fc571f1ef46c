#!/usr/bin/env python3
"""cli:plan: `trainctl plan` ranks layouts for a cluster file (table and --json), prints the
topology, rejects bad cluster files and impossible requests with exit code 2, and `parallel: auto`
makes `run` train with the planner's layout."""
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
