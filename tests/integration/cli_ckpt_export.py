#!/usr/bin/env python3
"""cli:ckpt_export: `trainctl ckpt export RUN --format safetensors --out FILE` writes a file the real
`safetensors` package loads, with Hugging Face names and layouts, every tensor equal to the
checkpoint's parameter under the mapping of lib/ckpt/export.hpp (recomputed here in numpy by
tests/python/read_safetensors.py):
  - GPT-2 fp32 (tied, biases): full numeric comparison via safetensors.numpy.load_file
  - Llama MoE fp32 (GQA, untied, MoE every 2nd layer): Mixtral/Llama names, full comparison
  - GPT-2 bf16: numpy has no bfloat16, so the bits are compared through our own header reader and
    the real package must still accept the file (safe_open keys and metadata)
The comparisons above share the name/transpose mapping with the code they check, so an independent
judge decides whether the exported file is the model: tests/python/hf_forward.py, a numpy forward
pass written from the Hugging Face GPT-2 and Llama definitions, computes the loss of the exported
tensors on the run's validation windows, and it must equal the val_loss trainctl logged for the
same weights (the final evaluation runs on the weights the last checkpoint saves):
  - the GPT-2 fp32 run above (tied head, LayerNorm with bias, gelu tanh): within 1e-5 relative
  - GPT-2 fp64, odd sizes (hidden 48, 3 heads, vocab 263): within 1e-9 relative
  - Llama fp64 (RMSNorm, RoPE theta 500, SwiGLU, 4 heads on 2 kv heads, untied): within 1e-9
and the errors: no checkpoint (exit 2), a missing path (2), --out in a missing folder (2), GQA
under GPT-2 names (1)."""
import os
import sys

import numpy as np

import cli_util
from cli_util import check

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import hf_forward  # noqa: E402
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


# Validation text for the judged runs: the final evaluation reads its windows from this file.
VAL_TEXT = (b"In the beginning God created the heaven and the earth. And the earth was without "
            b"form, and void; and darkness was upon the face of the deep. And the Spirit of God "
            b"moved upon the face of the waters. And God said, Let there be light: and there was "
            b"light. And God saw the light, that it was good: and God divided the light from the "
            b"darkness. And God called the light Day, and the darkness he called Night.")


def val_windows(path, seq_len, micro_batch, eval_batches):
    """The windows trainctl's final evaluation reads (docs: data.val_path, logging.eval_batches):
    byte tokens, window i = tokens[i * seq_len : i * seq_len + seq_len + 1], not shuffled, the
    first min(eval_batches, windows // micro_batch) micro-batches."""
    with open(path, "rb") as f:
        tokens = np.frombuffer(f.read(), dtype=np.uint8).astype(np.int64)
    windows = (len(tokens) - 1) // seq_len
    batches = min(eval_batches, windows // micro_batch)
    check(batches >= 2, f"{path}: too little validation text for {eval_batches} batches")
    return np.stack([tokens[i * seq_len:i * seq_len + seq_len + 1]
                     for i in range(batches * micro_batch)])


def judge(run_dir, out, loss_fn, windows, rtol):
    """The numpy forward pass of the exported file must give trainctl's final val_loss."""
    logged = cli_util.read_metrics(run_dir)[-1]
    check(logged.get("step") == 2 and "val_loss" in logged, f"no final val_loss in {logged}")
    ours = logged["val_loss"]
    theirs = loss_fn(safetensors.numpy.load_file(out), windows)
    check(abs(theirs - ours) <= rtol * abs(ours),
          f"{out}: the Hugging Face forward pass of the exported tensors gives loss {theirs!r}, "
          f"trainctl logged val_loss {ours!r} for the same weights (relative difference "
          f"{abs(theirs - ours) / abs(ours):.3g} > {rtol})")
    return abs(theirs - ours) / abs(ours)


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
        val = os.path.join(tmp, "val.txt")
        with open(val, "wb") as f:
            f.write(VAL_TEXT)
        # init_std 0.2: after 2 steps every layer still matters to the loss (at 0.02 a swapped
        # gate/up projection moved it by 6e-5 only; now by 7%).
        judged = ["data.val_path=" + val, "logging.eval_batches=3", "training.micro_batch=2",
                  "training.global_batch=4", "model.seq_len=16", "model.init_std=0.2",
                  "precision.loss_scale=none", "logging.tensorboard=false"]
        windows = val_windows(val, 16, 2, 3)
        differences = []

        gpt = os.path.join(tmp, "gpt")
        train(binary, root, gpt, "recipes/tiny.yaml",
              [*cli_util.SMALL_MODEL, "precision.compute=fp32", *judged])
        out = os.path.join(tmp, "gpt.safetensors")
        result = export(binary, root, gpt, out)
        check("naming gpt2: 28 tensors" in result.stdout, f"no naming line\n{result.describe()}")
        check(compare(gpt, out, numeric=True) == ("gpt2", 28), "gpt2 export")
        differences.append(judge(gpt, out, lambda t, w: hf_forward.gpt2_loss(t, w, heads=4),
                                 windows, 1e-5))

        odd = os.path.join(tmp, "gpt-odd")
        train(binary, root, odd, "recipes/tiny.yaml",
              ["model.layers=2", "model.hidden=48", "model.heads=3", "model.kv_heads=3",
               "model.ffn_hidden=96", "model.vocab=263", "precision.compute=fp64",
               "schedule.warmup_steps=1", *judged])
        out = os.path.join(tmp, "gpt-odd.safetensors")
        export(binary, root, odd, out)
        differences.append(judge(odd, out, lambda t, w: hf_forward.gpt2_loss(t, w, heads=3),
                                 windows, 1e-9))

        llama = os.path.join(tmp, "llama")
        train(binary, root, llama, "recipes/tiny.yaml",
              ["model.arch=llama", "model.layers=2", "model.hidden=48", "model.heads=4",
               "model.kv_heads=2", "model.ffn_hidden=64", "model.rope_theta=500",
               "model.norm_eps=1e-6", "precision.compute=fp64", "schedule.warmup_steps=1",
               *judged])
        out = os.path.join(tmp, "llama.safetensors")
        result = export(binary, root, llama, out)
        check("naming llama" in result.stdout, f"no llama naming line\n{result.describe()}")
        naming, _ = compare(llama, out, numeric=True)
        check(naming == "llama", naming)
        differences.append(judge(llama, out, lambda t, w: hf_forward.llama_loss(
            t, w, heads=4, kv_heads=2, rms_norm_eps=1e-6, rope_theta=500.0), windows, 1e-9))

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
        print(f"gpt2 28 tensors, mixtral {count} tensors, bf16 bits equal; HF forward pass vs "
              f"trainctl val_loss (gpt2 fp32, gpt2 fp64 odd, llama fp64): relative differences "
              f"{', '.join(f'{d:.2g}' for d in differences)}")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
