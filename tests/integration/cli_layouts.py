#!/usr/bin/env python3
"""cli:layouts: every parallel layout trains the same model to the same loss as one rank.

For one recipe and seed in fp32, 20 steps under each layout (the local launcher starts the
ranks): the per-step loss and gradient norm and the final weights (all tensors of the exported
final checkpoint; see cli_layout_util for the exact measure) match the single-rank run within
1e-5 relative, for dp2, tp2, pp2 (4 micro-batches), dp2 with ZeRO-1, dp2 x pp2 with ZeRO-1 (the
tied embedding's exchange beside the overlapped reduce-scatters and parameter gathers), the same
two with ZeRO-2 (a reduce-scatter per block and micro-batch, no whole gradient buffer) and with
ZeRO-3 (each block's parameters gathered before its forward and backward, the next one's while a
block computes), tp2 x pp2,
dp2 x tp2 x pp2 (8 ranks), a MoE model with ep2, tp2 (tensor-parallel experts) and ep2 x tp2
(tokens are dropped at capacity: the test checks that dropping really happens, and happens alike),
ep2 x dp2 with ZeRO-2 and 3 (each ep rank's part holds its own experts), and a Llama model with
grouped-query attention at tp2; with sequence parallelism (the norms and residual stream on 1/tp
of the tokens): gpt tp2 and dp2 x tp2 x pp2, llama tp2, moe ep2 x tp2; with context parallelism
(each sequence's chunks split over ranks, attention around a ring): gpt cp2, cp2 x dp2 with ZeRO-1,
cp2 x pp2, llama cp2 x tp2 with sequence parallelism, moe cp2 and ep2 x cp2 (every cp rank routes
the whole micro-batch); with the interleaved schedule (two model chunks per rank, a micro-batch
going around the ranks twice): gpt pp2 and moe dp2 x pp2 with ZeRO-1. Then the same layout run
twice is
bit-identical (losses, and the checkpoint's bytes of every tensor). Every run's memory per
category is what the planner's model planned for its rank 0, to the byte (comm under tp: at most
64 KiB above). A dp2 ZeRO-3 run with the block gradients summed in bf16 (precision.reduce_dtype)
stays within 1e-5 of the single rank (measured 9.4e-7) and differs from the fp32 reduction's run.

The layouts above use powers of two throughout, so gradient buckets, ZeRO-1 parts, tp shards and
pipeline stages always fall on the same boundaries. 10 steps of a model with odd sizes (hidden 96,
3 heads, vocab 263, ffn 210, 3 layers; cli_layout_util's "odd" families) must match its own single
rank the same way under dp3, dp3 with ZeRO-1, 2 and 3 (3 parts of unequal size), pp2 (2 + 1
layers) and tp3
(vocab 261)."""
import os

import cli_layout_util as lu
import cli_util
from cli_util import check

STEPS = 20
LAYOUTS = [
    ("gpt", "dp2"),
    ("gpt", "tp2"),
    ("gpt", "pp2"),
    ("gpt", "dp2-zero1"),
    ("gpt", "dp2-pp2-zero1"),
    ("gpt", "dp2-zero2"),
    ("gpt", "dp2-pp2-zero2"),
    ("gpt", "dp2-zero3"),
    ("gpt", "dp2-pp2-zero3"),
    ("gpt", "tp2-pp2"),
    ("gpt", "dp2-tp2-pp2"),
    ("moe", "ep2"),
    ("moe", "tp2"),
    ("moe", "ep2-tp2"),
    ("moe", "ep2-dp2-zero2"),
    ("moe", "ep2-dp2-zero3"),
    ("llama", "tp2"),
    ("gpt", "tp2-sp"),
    ("gpt", "dp2-tp2-pp2-sp"),
    ("moe", "ep2-tp2-sp"),
    ("llama", "tp2-sp"),
    ("gpt", "cp2"),
    ("gpt", "dp2-cp2-zero1"),
    ("gpt", "cp2-pp2"),
    ("llama", "cp2-tp2-sp"),
    ("moe", "cp2"),
    ("moe", "ep2-cp2"),
    ("gpt", "pp2-v2"),
    ("moe", "dp2-pp2-v2-zero1"),
    ("gpt", "pp2-zb"),
    ("moe", "dp2-pp2-zb-zero1"),
    ("llama", "tp2-pp2-zb-sp"),
]
REPEAT = ("gpt", "tp2-pp2")
ODD_STEPS = 10
BF16_REDUCE_TOLERANCE = 1e-5  # measured 9.4e-7 over 20 steps (fp32 sums: 5e-9)
ODD_LAYOUTS = [
    ("odd", "dp3"),
    ("odd", "dp3-zero1"),
    ("odd", "dp3-zero2"),
    ("odd", "dp3-zero3"),
    ("odd", "pp2"),
    ("odd-tp", "tp3"),
]


def check_comm_fields(records, layout, label):
    """Several ranks report comm_ms; those whose gradient reduction overlaps backward (a data
    group of several: dp or ep > 1, ZeRO-1 included) also its background busy time, which is not
    zero."""
    degrees = {part.rstrip("0123456789"): int(part[len(part.rstrip("0123456789")):])
               for part in layout.split("-") if part not in ("sp", "zb")}
    overlaps = any(degrees.get(axis, 1) > 1 for axis in ("dp", "ep", "cp"))
    for step, record in records.items():
        check(record.get("comm_ms", -1) >= 0, f"{label}: step {step} has no comm_ms: {record}")
        check(("comm_background_ms" in record) == overlaps,
              f"{label}: step {step} {'lacks' if overlaps else 'has'} comm_background_ms "
              f"(the reduction {'overlaps' if overlaps else 'does not overlap'} backward)")
    if overlaps:
        busy = sum(r["comm_background_ms"] for r in records.values())
        check(busy > 0, f"{label}: the background reduction was never busy ({busy} ms)")
    # Context parallel: the ring's exposed exchange, which at least the gradients' last return
    # to their owner always is.
    context = degrees.get("cp", 1) > 1
    for step, record in records.items():
        check(("cp_wait_ms" in record) == context,
              f"{label}: step {step} {'lacks' if context else 'has'} cp_wait_ms")
    if context:
        waits = [r["cp_wait_ms"] for r in records.values()]
        check(min(waits) >= 0 and sum(waits) > 0, f"{label}: cp_wait_ms {waits}")


def body(binary, root):
    with cli_util.temp_dir("layouts") as tmp:
        reference = {}
        for family in sorted({f for f, _ in LAYOUTS}):
            run_dir = os.path.join(tmp, f"{family}-1")
            lu.train(binary, root, run_dir, family, "1", STEPS)
            reference[family] = (run_dir, lu.final_weights(binary, root, run_dir))
        dropped = sum(sum(r.get("dropped_tokens", [0]))
                      for r in lu.losses(reference["moe"][0]).values())
        check(dropped > 0, "the MoE reference run dropped no tokens: capacity dropping would not "
                           "be compared across layouts; lower moe.capacity_factor")

        report = []
        for family, layout in LAYOUTS:
            run_dir = os.path.join(tmp, f"{family}-{layout}")
            lu.train(binary, root, run_dir, family, layout, STEPS)
            label = f"{family} {layout}"
            loss_error = lu.check_losses(reference[family][0], run_dir, label, 1, STEPS,
                                         grad_norm=True)
            weight_error, worst = lu.check_weights(reference[family][1],
                                                   lu.final_weights(binary, root, run_dir), label)
            if family == "moe":
                want = [r["dropped_tokens"] for r in lu.losses(reference[family][0]).values()]
                got = [r["dropped_tokens"] for r in lu.losses(run_dir).values()]
                check(want == got, f"{label}: dropped tokens per step {got} differ from the "
                                   f"single rank's {want}")
            check_comm_fields(lu.losses(run_dir), layout, label)
            lu.check_memory_planned(run_dir, layout, label)
            report.append(f"{label}: loss {loss_error:.2g}, weights {weight_error:.2g} "
                          f"(worst tensor {worst})")

        # zb-h1 splits each backward in two but adds every gradient from the same operands in
        # the same order: 1F1B's run on the same layout, bit for bit.
        one_f_one_b, zero_bubble = (lu.losses(os.path.join(tmp, f"gpt-{layout}"))
                                    for layout in ("pp2", "pp2-zb"))
        for step, record in zero_bubble.items():
            for field in ("loss", "grad_norm"):
                check(record[field] == one_f_one_b[step][field],
                      f"gpt pp2-zb: step {step} {field} {record[field]!r} != 1f1b's "
                      f"{one_f_one_b[step][field]!r}")

        # ZeRO-3 with the block gradients summed in bf16 (precision.reduce_dtype): rounded once
        # per block and micro-batch, still within BF16_REDUCE_TOLERANCE of one rank, not equal to
        # the fp32 reduction's run (the setting is applied), and its memory (the bf16 copies and
        # shares the gradient sync keeps) as planned.
        family, layout = "gpt", "dp2-zero3"
        run_dir = os.path.join(tmp, "gpt-dp2-zero3-bf16-reduce")
        lu.train(binary, root, run_dir, family, layout, STEPS, ["precision.reduce_dtype=bf16"])
        label = "gpt dp2-zero3 reduce bf16"
        loss_error = lu.check_losses(reference[family][0], run_dir, label, 1, STEPS,
                                     tolerance=BF16_REDUCE_TOLERANCE)
        fp32_reduce = lu.losses(os.path.join(tmp, "gpt-dp2-zero3"))
        check(any(r["loss"] != fp32_reduce[step]["loss"]
                  for step, r in lu.losses(run_dir).items()),
              f"{label}: every loss equals the fp32 reduction's: the bf16 sums were not used")
        lu.check_memory_planned(run_dir, layout, label)
        report.append(f"{label}: loss {loss_error:.2g}")

        for family, layout in ODD_LAYOUTS:
            if family not in reference:
                run_dir = os.path.join(tmp, f"{family}-1")
                lu.train(binary, root, run_dir, family, "1", ODD_STEPS)
                reference[family] = (run_dir, lu.final_weights(binary, root, run_dir))
            run_dir = os.path.join(tmp, f"{family}-{layout}")
            lu.train(binary, root, run_dir, family, layout, ODD_STEPS)
            label = f"{family} {layout}"
            loss_error = lu.check_losses(reference[family][0], run_dir, label, 1, ODD_STEPS,
                                         grad_norm=True)
            weight_error, worst = lu.check_weights(reference[family][1],
                                                   lu.final_weights(binary, root, run_dir), label)
            check_comm_fields(lu.losses(run_dir), layout, label)
            lu.check_memory_planned(run_dir, layout, label)
            report.append(f"{label}: loss {loss_error:.2g}, weights {weight_error:.2g} "
                          f"(worst tensor {worst})")

        family, layout = REPEAT
        first = os.path.join(tmp, f"{family}-{layout}")
        again = os.path.join(tmp, f"{family}-{layout}-again")
        lu.train(binary, root, again, family, layout, STEPS)
        a, b = lu.losses(first), lu.losses(again)
        for step in a:
            for field in ("loss", "grad_norm", "lr"):
                check(a[step][field] == b[step][field],
                      f"repeat {layout}: step {step} {field} {b[step][field]!r} != first run's "
                      f"{a[step][field]!r}: the same layout must be bit-identical")
        lu.check_weights(lu.final_weights(binary, root, first),
                         lu.final_weights(binary, root, again), f"repeat {layout}", exact=True)
        print("largest relative differences against one rank:\n  " + "\n  ".join(report))


if __name__ == "__main__":
    cli_util.main_wrapper(body)
