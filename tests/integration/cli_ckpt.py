#!/usr/bin/env python3
"""cli:ckpt: `trainctl ckpt inspect` and `trainctl ckpt verify` on a real run's checkpoints.
  - inspect (text and --json) of a run directory picks the newest checkpoint and shows step,
    recipe hash, layout, model, state, files and the tensor table grouped by kind with totals
  - verify of a run directory: one OK line per checkpoint, exit 0
  - damage: a flipped byte (verify exits 1 naming the shard file and the tensor), a truncated
    shard, a corrupt manifest, a partial .tmp-* directory (listed as partial); inspect then skips
    the broken newer ones and says why; export of a checkpoint whose model bytes are corrupt fails
  - bad input: a missing path and a folder without checkpoints exit 2."""
import json
import os
import re
import shutil

import cli_util
from cli_util import check

STEPS = ["step_00000002", "step_00000004", "step_00000006"]


def main(binary, root):
    with cli_util.temp_dir("ckpt") as tmp:
        run_dir = os.path.join(tmp, "run")
        sets = [*cli_util.SMALL_MODEL, "training.steps=6", "checkpoint.every_steps=2",
                "checkpoint.keep_last=3"]
        cli_util.run_ok(binary, ["run", "recipes/tiny.yaml",
                                 *[a for s in sets for a in ("--set", s)], "--run-dir", run_dir],
                        root)
        ckpts = os.path.join(run_dir, "checkpoints")
        check(sorted(n for n in os.listdir(ckpts) if n.startswith("step_")) == STEPS,
              f"expected {STEPS} in {os.listdir(ckpts)}")

        # inspect, text
        r = cli_util.run_ok(binary, ["ckpt", "inspect", run_dir], root)
        check("using step_00000006" in r.stderr, f"no selection line\n{r.describe()}")
        for text in ("step         6\n", "recipe hash  ", "layout       cp=1 dp=1", "model        ",
                     "layers=2", "state        step 6, tokens 3072", "rank_0.bin",
                     "model: 28 tensors", "master: 28 tensors", "adam_m: 28 tensors",
                     "adam_v: 28 tensors", "total: 112 tensors"):
            check(text in r.stdout, f"inspect text lacks {text!r}\n{r.describe()}")
        row = r"\n  model/layers\.0\.attn\.qkv\.weight +bf16 +\[192, 64\] +24576 +1\n"
        check(re.search(row, r.stdout), f"inspect text lacks the qkv row\n{r.describe()}")

        # inspect --json: one object on stdout
        r = cli_util.run_ok(binary, ["ckpt", "inspect", "--json", run_dir], root)
        summary = json.loads(r.stdout)
        check(summary["step"] == 6 and summary["state"]["step"] == 6, "json step")
        check(summary["model"]["layers"] == 2 and summary["layout"]["world_size"] == 1, "json model")
        check(summary["total"]["tensors"] == 112, f"json total {summary['total']}")
        check(set(summary["kinds"]) == {"model", "master", "adam_m", "adam_v"}, "json kinds")
        wte = [t for t in summary["tensors"] if t["name"] == "model/embed.wte"]
        check(wte == [{"name": "model/embed.wte", "kind": "model", "dtype": "bf16",
                       "shape": [256, 64], "bytes": 256 * 64 * 2, "slices": 1}], f"wte {wte}")
        check(summary["selection"]["selected"] == "step_00000006", "json selection")

        # verify, all good
        r = cli_util.run_ok(binary, ["ckpt", "verify", run_dir], root)
        for step in STEPS:
            check(f"OK {step}: 112 tensors, " in r.stdout, f"no OK line for {step}\n{r.describe()}")
        check("3 entries: 3 valid, 0 corrupt, 0 partial" in r.stdout, r.describe())

        # damage: flip a byte inside model/embed.wte of step 2
        step2 = os.path.join(ckpts, STEPS[0])
        with open(os.path.join(step2, "manifest.json"), encoding="utf-8") as f:
            manifest = json.load(f)
        wte_slice = [t for t in manifest["tensors"] if t["name"] == "model/embed.wte"][0]["slices"][0]
        with open(os.path.join(step2, "rank_0.bin"), "r+b") as f:
            f.seek(wte_slice["offset"] + 100)
            byte = f.read(1)
            f.seek(wte_slice["offset"] + 100)
            f.write(bytes([byte[0] ^ 0x10]))
        r = cli_util.run(binary, ["ckpt", "verify", step2], root)
        check(r.rc == 1 and "CORRUPT step_00000002" in r.stdout and "rank_0.bin" in r.stdout
              and "model/embed.wte" in r.stdout, f"flipped byte\n{r.describe()}")
        # truncate step 4's shard; corrupt step 6's manifest; add a partial save
        shard4 = os.path.join(ckpts, STEPS[1], "rank_0.bin")
        os.truncate(shard4, os.path.getsize(shard4) - 1000)
        with open(os.path.join(ckpts, STEPS[2], "manifest.json"), "w", encoding="utf-8") as f:
            f.write('{"format": "trainctl-checkpoint", "version": 1, "step": ')
        tmp_save = os.path.join(ckpts, ".tmp-step_00000008.4242")
        os.makedirs(tmp_save)
        open(os.path.join(tmp_save, "rank_0.bin"), "wb").close()

        r = cli_util.run(binary, ["ckpt", "verify", ckpts], root)
        check(r.rc == 1, f"verify of a damaged folder must exit 1\n{r.describe()}")
        expect = [".tmp-step_00000008.4242: partial (an interrupted save; never loaded)",
                  "CORRUPT step_00000006: ", "manifest.json",
                  "CORRUPT step_00000004: ", "truncated?",
                  "CORRUPT step_00000002: ", "checksum mismatch",
                  "4 entries: 0 valid, 3 corrupt, 1 partial"]
        for text in expect:
            check(text in r.stdout, f"verify lacks {text!r}\n{r.describe()}")

        # inspect skips the newer broken ones and says why (step 2's damage is in its bytes,
        # which only verify and reads see); export then fails on the corrupt model tensor.
        r = cli_util.run_ok(binary, ["ckpt", "inspect", run_dir], root)
        for text in ("skipped .tmp-step_00000008.4242: partial", "skipped step_00000006: corrupt",
                     "skipped step_00000004: corrupt", "using step_00000002"):
            check(text in r.stderr, f"inspect stderr lacks {text!r}\n{r.describe()}")
        out = os.path.join(tmp, "x.safetensors")
        r = cli_util.run(binary, ["ckpt", "export", run_dir, "--out", out], root)
        check(r.rc == 1 and "model/embed.wte" in r.stderr and not os.path.exists(out),
              f"export of corrupt bytes\n{r.describe()}")
        shutil.rmtree(step2)
        r = cli_util.run(binary, ["ckpt", "inspect", run_dir], root)
        check(r.rc == 1 and "no valid checkpoint" in r.stderr, f"none valid\n{r.describe()}")

        # bad input
        r = cli_util.run(binary, ["ckpt", "verify", os.path.join(tmp, "nope")], root)
        check(r.rc == 2 and "no such file or directory" in r.stderr, r.describe())
        r = cli_util.run(binary, ["ckpt", "inspect", root + "/docs"], root)
        check(r.rc == 2 and "holds no checkpoint" in r.stderr, r.describe())


if __name__ == "__main__":
    cli_util.main_wrapper(main)
