#!/usr/bin/env python3
"""cli:ckpt_export: `trainctl ckpt export RUN --format safetensors --out FILE` writes a file the real
`safetensors` package loads, with Hugging Face names and layouts, every tensor equal to the
checkpoint's parameter under the mapping of lib/ckpt/export.hpp (recomputed here in numpy by
tests/python/read_safetensors.py):
  - GPT-2 fp32 (tied, biases): full numeric comparison via safetensors.numpy.load_file
  - Llama MoE fp32 (GQA, untied, MoE every 2nd layer): Mixtral/Llama names, full comparison
  - GPT-2 bf16: numpy has no bfloat16, so the bits are compared through our own header reader and
    the real package must still accept the file (safe_open keys and metadata)
and the errors: no checkpoint (exit 2), a missing path (2), --out in a missing folder (2), GQA
under GPT-2 names (1)."""
import os
import sys

import numpy as np

import cli_util
from cli_util import check

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import read_safetensors  # noqa: E402

try:
    import safetensors
    import safetensors.numpy
except ImportError:
    print("the safetensors package is missing: run scripts/setup --tests (TRAINCTL_TEST_PYTHON)",
          file=sys.stderr)
    sys.exit(1)

LLAMA_MOE = os.path.join("tests", "fixtures", "recipes", "llama_moe.yaml")


def train(binary, root, run_dir, recipe, sets):
    sets = [*sets, "training.steps=2", "checkpoint.every_steps=2"]
    args = ["run", recipe, *[a for s in sets for a in ("--set", s)], "--run-dir", run_dir]
    cli_util.run_ok(binary, args, root)


def export(binary, root, run_dir, out):
    result = cli_util.run_ok(binary, ["ckpt", "export", run_dir, "--format", "safetensors",
                                      "--out", out], root)
    check("using step_00000002" in result.stderr, f"no 'using' line\n{result.describe()}")
    return result


def compare(run_dir, out, numeric):
    """Checks every tensor of `out` against the checkpoint; returns the naming and count."""
    manifest, params = read_safetensors.read_checkpoint(
        os.path.join(run_dir, "checkpoints", "step_00000002"))
    naming, expected = read_safetensors.hf_expectations(manifest["model"])
    metadata, raw = read_safetensors.read_safetensors_raw(out)
    check(sorted(raw) == sorted(expected),
          f"names differ: extra {sorted(set(raw) - set(expected))}, "
          f"missing {sorted(set(expected) - set(raw))}")
    with safetensors.safe_open(out, framework="numpy") as f:
        check(sorted(f.keys()) == sorted(expected), "safe_open lists other names")
        check(f.metadata() == metadata, f"safe_open metadata {f.metadata()} != {metadata}")
    check(metadata == {"format": "pt", "trainctl_step": "2", "trainctl_naming": naming,
                       "trainctl_recipe_hash": manifest["recipe_hash"]},
          f"unexpected metadata {metadata}")
    loaded = safetensors.numpy.load_file(out) if numeric else None
    for name, derive in expected.items():
        want = np.ascontiguousarray(derive(params))
        dtype, shape, got = raw[name]
        check(list(shape) == list(want.shape), f"{name}: shape {shape} != {list(want.shape)}")
        check(np.array_equal(got, want), f"{name}: stored values differ from the checkpoint")
        if numeric:
            check(loaded[name].dtype == want.dtype and np.array_equal(loaded[name], want),
                  f"{name}: safetensors.numpy loads other values")
    return naming, len(expected)


def main(binary, root):
    with cli_util.temp_dir("ckpt-export") as tmp:
        gpt = os.path.join(tmp, "gpt")
        train(binary, root, gpt, "recipes/tiny.yaml",
              [*cli_util.SMALL_MODEL, "precision.compute=fp32", "precision.loss_scale=none"])
        out = os.path.join(tmp, "gpt.safetensors")
        result = export(binary, root, gpt, out)
        check("naming gpt2: 28 tensors" in result.stdout, f"no naming line\n{result.describe()}")
        check(compare(gpt, out, numeric=True) == ("gpt2", 28), "gpt2 export")

        moe = os.path.join(tmp, "moe")
        train(binary, root, moe, LLAMA_MOE, [])
        out = os.path.join(tmp, "moe.safetensors")
        result = export(binary, root, moe, out)
        check("naming mixtral" in result.stdout and "note: MoE on every 2 layers" in result.stdout,
              f"no mixtral naming line or note\n{result.describe()}")
        naming, count = compare(moe, out, numeric=True)
        check(naming == "mixtral", naming)

        bf16 = os.path.join(tmp, "bf16")
        train(binary, root, bf16, "recipes/tiny.yaml", cli_util.SMALL_MODEL)
        out = os.path.join(tmp, "bf16.safetensors")
        export(binary, root, bf16, out)
        _, raw = read_safetensors.read_safetensors_raw(out)
        check(all(d == "BF16" for d, _, _ in raw.values()), "bf16 checkpoint not exported as BF16")
        compare(bf16, out, numeric=False)

        # Errors: nothing is written.
        empty = os.path.join(tmp, "empty")
        os.makedirs(empty)
        bad = cli_util.run(binary, ["ckpt", "export", empty, "--out", os.path.join(tmp, "x")], root)
        check(bad.rc == 2 and "holds no checkpoint" in bad.stderr, f"empty dir\n{bad.describe()}")
        bad = cli_util.run(binary, ["ckpt", "export", os.path.join(tmp, "nope"), "--out",
                                    os.path.join(tmp, "x")], root)
        check(bad.rc == 2 and "no such file or directory" in bad.stderr,
              f"missing path\n{bad.describe()}")
        bad = cli_util.run(binary, ["ckpt", "export", gpt, "--out",
                                    os.path.join(tmp, "no", "x.safetensors")], root)
        check(bad.rc == 2 and "does not exist" in bad.stderr, f"missing folder\n{bad.describe()}")
        gqa = os.path.join(tmp, "gqa")
        train(binary, root, gqa, "recipes/tiny.yaml", [*cli_util.SMALL_MODEL, "model.kv_heads=2"])
        bad = cli_util.run(binary, ["ckpt", "export", gqa, "--out", os.path.join(tmp, "x")], root)
        check(bad.rc == 1 and "grouped-query attention" in bad.stderr, f"gqa\n{bad.describe()}")
        check(not os.path.exists(os.path.join(tmp, "x")), "a failed export left a file")
        print(f"gpt2 28 tensors, mixtral {count} tensors, bf16 bits equal")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
