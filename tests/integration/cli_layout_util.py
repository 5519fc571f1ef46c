"""Helpers of the multi-rank equivalence tests (cli_layouts.py, cli_reshard.py): small fp32 runs of
one model under different parallel layouts, and the comparisons "same loss curve" and "same final
weights" within a relative tolerance.

The weights are read from the run's final checkpoint, exported with `trainctl ckpt export --format
safetensors` (global tensors, whatever layout saved them) and parsed here with the standard library
(8-byte header length, JSON header, raw little-endian data), so the test needs no numpy.
"""
import array
import json
import math
import os
import struct

import cli_util
from cli_util import check

# Relative tolerance of the issue, against the single-rank run: each step's loss, and the final
# weights as one vector, |a - b| / |a| in L2 norm over every parameter. Each tensor must also be
# within TENSOR_TOLERANCE on its own. Why not every element, or every tensor, within 1e-5: two
# single-rank runs that cut the same work differently (micro_batch 2 instead of 1, so the same sums
# in another order) already differ by 9e-6 in one Llama tensor after 20 steps, almost all of it one
# element whose gradient crossed zero, which Adam turns into a step of up to lr. The layouts sit at
# that floor (measured: whole model 1e-8 to 2.5e-7, worst tensor 1.2e-5 for llama tp2); a real bug
# (a missing all-reduce, a bias added twice, a wrong shard) is off by 1e-3 or more.
TOLERANCE = 1e-5
TENSOR_TOLERANCE = 1e-4

# 4 layers (pp2 gets 2 a stage), 4 heads, byte vocabulary 256 (divisible by tp), 32-token
# sequences, 4 sequences a step in micro-batches of 1: 4 micro-batches on one rank, 2 on each of
# two data ranks. fp32 without a loss scale, no evaluation or TensorBoard, a checkpoint at the end
# only, every step on its own plain progress line.
BASE = ["model.layers=4", "model.hidden=64", "model.heads=4", "model.kv_heads=4",
        "model.ffn_hidden=128", "model.seq_len=32", "training.global_batch=4",
        "training.micro_batch=1", "schedule.warmup_steps=2", "optimizer.lr=3e-4",
        "schedule.min_lr=3e-5", "precision.compute=fp32", "precision.loss_scale=none",
        "checkpoint.every_steps=0", "checkpoint.keep_last=1",
        "logging.eval_every_steps=0", "logging.eval_batches=1", "logging.tensorboard=false",
        "logging.every_steps=1", "logging.progress=plain"]

# Model families: GPT (LayerNorm, GELU, learned positions, tied embeddings); a GPT with MoE layers
# (4 experts, top-2, capacity factor 1.0 so tokens are dropped); Llama (RMSNorm, SwiGLU, RoPE,
# untied) with grouped-query attention (4 query heads, 2 key/value heads).
FAMILIES = {
    "gpt": [],
    "moe": ["moe.experts=4", "moe.top_k=2", "moe.capacity_factor=1.0", "moe.every=2"],
    "llama": ["model.arch=llama", "model.heads=4", "model.kv_heads=2"],
    # Mixtral's model: Llama with GQA, MoE on every layer, top-2 gates renormalised, no dropping.
    "mixtral": ["model.arch=llama", "model.heads=4", "model.kv_heads=2", "moe.experts=4",
                "moe.top_k=2", "moe.every=1", "moe.capacity_factor=0",
                "moe.router=softmax_topk_renorm"],
    # Sizes that are not powers of two, so ZeRO parts, gradient buckets and stages do not align:
    # 3 layers (pp2: 2 + 1), hidden 96, 3 heads, ffn 210, vocab 263 (prime), 6 sequences a step
    # (dp3: 2 each). "odd-tp": vocab 261 = 3 * 87, as tp must divide the vocabulary.
    "odd": ["model.layers=3", "model.hidden=96", "model.heads=3", "model.kv_heads=3",
            "model.ffn_hidden=210", "model.vocab=263", "training.global_batch=6"],
    "odd-tp": ["model.layers=3", "model.hidden=96", "model.heads=3", "model.kv_heads=3",
               "model.ffn_hidden=210", "model.vocab=261", "training.global_batch=6"],
}


def layout_sets(layout):
    """'dp2-tp2-pp2', 'dp2-zero1', 'tp2-sp' (sequence parallel), 'pp2-v2' (the interleaved
    schedule, two chunks per rank) or 'pp2-zb' (the zb-h1 schedule) -> --set values; '1' is the
    single rank."""
    sets = []
    if layout == "1":
        return sets
    for part in layout.split("-"):
        if part == "sp":
            sets.append("parallel.sequence_parallel=true")
            continue
        if part == "zb":
            sets.append("parallel.pp_schedule=zb-h1")
            continue
        if part.startswith("v") and part[1:].isdigit():  # interleaved, that many chunks per rank
            sets += ["parallel.pp_schedule=interleaved", f"parallel.pp_virtual={part[1:]}"]
            continue
        axis, degree = part.rstrip("0123456789"), part[len(part.rstrip("0123456789")):]
        check(axis in ("dp", "tp", "pp", "ep", "cp", "zero") and degree, f"bad layout {layout!r}")
        sets.append(f"parallel.{axis}={degree}")
    return sets


def train(binary, root, run_dir, family, layout, steps, extra=()):
    """Runs `steps` steps of `family` under `layout` into run_dir; fails unless it exits 0."""
    sets = [*BASE, *FAMILIES[family], *layout_sets(layout), f"training.steps={steps}", *extra]
    args = ["run", "recipes/tiny.yaml", *[a for s in sets for a in ("--set", s)],
            "--run-dir", run_dir]
    return cli_util.run_ok(binary, args, root, timeout=600)


def losses(run_dir, first=1, last=None):
    """{step: record} of metrics.jsonl, checked to hold each step first..last once, in order."""
    records = cli_util.read_metrics(run_dir)
    steps = [r.get("step") for r in records]
    if last is None:
        last = steps[-1] if steps else 0
    check(steps == list(range(first, last + 1)),
          f"{run_dir}/metrics.jsonl holds steps {steps}; expected {first}..{last} once each")
    return {r["step"]: r for r in records}


def relative(a, b):
    return abs(a - b) / max(abs(a), 1e-30)


def check_losses(want_dir, got_dir, label, first=1, last=None, tolerance=TOLERANCE,
                 grad_norm=False):
    """Each step's loss (and with grad_norm=True its gradient norm: the loss alone does not see a
    gradient scaled by a constant, which Adam's normalisation hides from the weights) within
    `tolerance` relative of the reference run's; returns the worst loss error."""
    want, got = losses(want_dir), losses(got_dir, first, last)
    worst = 0.0
    for step, record in got.items():
        check(step in want, f"{label}: step {step} is not in the reference run")
        error = relative(want[step]["loss"], record["loss"])
        worst = max(worst, error)
        check(error <= tolerance,
              f"{label}: step {step} loss {record['loss']!r} differs from the single-rank "
              f"{want[step]['loss']!r} by {error:.3g} relative (tolerance {tolerance})")
        if grad_norm:
            error = relative(want[step]["grad_norm"], record["grad_norm"])
            check(error <= tolerance,
                  f"{label}: step {step} grad_norm {record['grad_norm']!r} differs from the "
                  f"single-rank {want[step]['grad_norm']!r} by {error:.3g} relative (tolerance "
                  f"{tolerance})")
        check(want[step]["tokens"] == record["tokens"],
              f"{label}: step {step} counts {record['tokens']} tokens, the reference "
              f"{want[step]['tokens']}")
    return worst


def read_safetensors(path):
    """{name: (dtype, shape, array of floats)} of a safetensors file (F32 tensors only)."""
    with open(path, "rb") as f:
        blob = f.read()
    (header_bytes,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_bytes])
    data = blob[8 + header_bytes:]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        check(entry["dtype"] == "F32", f"{path}: {name} is {entry['dtype']}, expected F32")
        begin, end = entry["data_offsets"]
        values = array.array("f")
        values.frombytes(data[begin:end])
        tensors[name] = (entry["dtype"], tuple(entry["shape"]), values)
    return tensors


def final_weights(binary, root, run_dir):
    """The weights of run_dir's newest checkpoint, exported to safetensors and read back."""
    out = os.path.join(run_dir, "final.safetensors")
    cli_util.run_ok(binary, ["ckpt", "export", run_dir, "--format", "safetensors", "--out", out],
                    root)
    return read_safetensors(out)


def key_bias_range(name, shape):
    """The elements of a fused qkv bias [3C] that are the key bias, else None (GPT-2's c_attn.bias,
    or trainctl's own attn.qkv.bias for models exported under trainctl names; the models with
    biases here have as many key as query heads, so the key bias is the middle third).

    The loss does not depend on the key bias (q.b_k adds the same number to every score of a
    query's softmax row), so its exact gradient is zero and what it receives is rounding noise
    that Adam normalises into steps of up to lr. Its trained value is noise in every run,
    single-rank included (another micro-batch size changes it as much); it is checked to be small
    instead of equal."""
    fused = name.endswith(("attn.c_attn.bias", "attn.qkv.bias"))
    if fused and len(shape) == 1 and shape[0] % 3 == 0:
        third = shape[0] // 3
        return range(third, 2 * third)
    return None


# The key bias may wander at most this far (a few hundred Adam steps of noise at lr 3e-3 would be
# needed to reach it; the real biases are larger than this after 20 steps).
KEY_BIAS_LIMIT = 0.05


def check_weights(want, got, label, exact=False, tensor_tolerance=TENSOR_TOLERANCE):
    """`got` equals `want`: the whole model within TOLERANCE and each tensor within
    tensor_tolerance, relative in L2 norm (the key bias of a fused qkv excepted: see
    key_bias_range); or, with exact, bit for bit. Returns (whole-model error, worst tensor)."""
    check(sorted(want) == sorted(got),
          f"{label}: tensors {sorted(set(want) ^ set(got))} are in only one of the checkpoints")
    worst, worst_name = 0.0, ""
    total_norm, total_diff = 0.0, 0.0
    for name, (_, shape, values) in want.items():
        _, got_shape, got_values = got[name]
        check(shape == got_shape, f"{label}: {name} has shape {got_shape}, expected {shape}")
        if exact:
            check(values.tobytes() == got_values.tobytes(),
                  f"{label}: {name} is not bit-identical to the first run's")
            continue
        noise = key_bias_range(name, shape)
        if noise is not None:
            for i in noise:
                check(abs(values[i]) <= KEY_BIAS_LIMIT and abs(got_values[i]) <= KEY_BIAS_LIMIT,
                      f"{label}: key bias {name}[{i}] is {got_values[i]!r} (reference "
                      f"{values[i]!r}); its gradient is zero, it must stay near 0")
            keep = [i for i in range(len(values)) if i not in noise]
            values = array.array("f", (values[i] for i in keep))
            got_values = array.array("f", (got_values[i] for i in keep))
        norm = sum(v * v for v in values)
        diff = sum((a - b) ** 2 for a, b in zip(values, got_values))
        total_norm, total_diff = total_norm + norm, total_diff + diff
        error = math.sqrt(diff / max(norm, 1e-60))
        if error > worst:
            worst, worst_name = error, name
        check(error <= tensor_tolerance,
              f"{label}: final {name} differs from the single-rank run by {error:.3g} relative "
              f"(L2 norm; tolerance {tensor_tolerance} per tensor)")
    if exact:
        return 0.0, ""
    whole = math.sqrt(total_diff / max(total_norm, 1e-60))
    check(whole <= TOLERANCE,
          f"{label}: the final weights differ from the single-rank run by {whole:.3g} relative "
          f"(L2 norm over all parameters; tolerance {TOLERANCE}); worst tensor {worst_name} "
          f"{worst:.3g}")
    return whole, f"{worst_name} {worst:.2g}"


def check_memory_planned(run_dir, layout, label):
    """The run's memory per category (rank 0, summary.json) is what trainctl plan's model planned
    for the same rank, to the byte; only `comm` under tp may be planned higher, by at most 64 KiB
    (the planner counts the vocab-parallel loss's host vectors, N * (8 * (4 + tp) + 8) bytes: an
    upper bound the run does not hold as a buffer)."""
    summary = cli_util.read_summary(run_dir)
    used, planned = summary.get("memory_bytes", {}), summary.get("memory_planned_bytes") or {}
    for category in ("params", "grads", "optimizer", "activations", "comm"):
        u, p = used.get(category), planned.get(category)
        ok = u == p or (category == "comm" and "tp" in layout and u is not None and p is not None
                        and u <= p <= u + 65536)
        check(ok, f"{label}: memory {category}: the run used {u} bytes, the planner planned {p}")
