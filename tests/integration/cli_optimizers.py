#!/usr/bin/env python3
"""cli:optimizers_*: sgd, lion, muon and adafactor (optimizer.name) through the binary.

layouts:   each optimizer trains the small fp32 model of cli_layout_util under dp2 with ZeRO-1 and
           under tp2 to the single rank's loss, gradient norm and final weights (the layout
           tolerance of cli:layouts); muon also under dp2 with ZeRO-3, tp2 x pp2, cp2, a Llama
           model with grouped-query attention at tp2 (q, k and v orthogonalised apart, each split
           over the tp ranks) and a MoE model at ep2 x tp2 and ep2 x dp2 with ZeRO-2 (each expert
           its own matrix, split over tp, its rows cut by ZeRO); adafactor under the same but cp2
           and GQA (its statistics built from the whole gradient). Every run's memory per category
           is what the planner planned for its rank 0, to the byte (the optimizer's moments and
           Muon's working buffers included).
resume:    for each optimizer, N steps, then `trainctl resume` to 2N, equals the straight run bit
           for bit; the checkpoint holds the optimizer's own state tensors (momentum/, lion_m/,
           muon_m/ and adam_v/, adafactor_row/, _col/ and _v/) and no other's. Muon and adafactor
           checkpoints saved at dp2 with ZeRO-1 resume at tp2 and continue the single-rank run
           within the layout tolerance.
snapshots: adafactor's statistics (the optimizer's own state, beside the parameter buffers) in
           the in-memory snapshot and the node-local tiers: a stability rollback to it equals the
           run that never saw the skipped batches (also with bf16 adamw moments), and a dp2 run with rank 1 SIGKILLed resumes
           from the memory tier bit for bit.
state_bf16: optimizer.state_dtype bf16 with adamw, sgd, lion and muon: every layout (dp2 with
           ZeRO-1, tp2; adamw also GQA at tp2 and MoE at ep2 x tp2; muon also tp2 x pp2 and MoE at
           ep2 x dp2 with ZeRO-2) equals one rank (the rounding is keyed by the global index), its
           memory as planned; the checkpoint's state is bf16; bit-for-bit resume, dp2 -> tp2
           resume, and a resume that changes state_dtype converts the saved moments.
bad_input: resuming a lion run as adamw, sgd's Nesterov without momentum, ns_steps 0, an
           unknown optimizer, and bf16 state for optimizers without moments, for fp64 or of an
           unknown type: exit 2 naming the key (and, for the resume, both optimizers), the run
           directory untouched or never created.
"""
import json
import os
import shutil

import cli_layout_util as lu
import cli_resume_util as ru
import cli_stability
import cli_tiers
import cli_util
from cli_util import check

STEPS = 10
# Each optimizer at a learning rate of its own scale (BASE's 3e-4 suits adamw and muon, whose
# update has AdamW's RMS): SGD's steps are lr times the gradient, Lion's lr per element.
SETTINGS = {
    "sgd": ["optimizer.name=sgd", "optimizer.lr=0.05", "schedule.min_lr=0.005"],
    "lion": ["optimizer.name=lion", "optimizer.lr=1e-4", "schedule.min_lr=1e-5",
             "optimizer.betas=[0.9,0.99]"],
    "muon": ["optimizer.name=muon"],
    "adafactor": ["optimizer.name=adafactor", "optimizer.lr=0.01", "schedule.min_lr=0.001"],
}
LAYOUTS = {
    "sgd": [("gpt", "dp2-zero1"), ("gpt", "tp2")],
    "lion": [("gpt", "dp2-zero1"), ("gpt", "tp2")],
    "muon": [("gpt", "dp2-zero1"), ("gpt", "tp2"), ("gpt", "dp2-zero3"), ("gpt", "tp2-pp2"),
             ("gpt", "cp2"), ("llama", "tp2"), ("moe", "ep2-tp2"), ("moe", "ep2-dp2-zero2")],
    "adafactor": [("gpt", "dp2-zero1"), ("gpt", "tp2"), ("gpt", "dp2-zero3"), ("gpt", "tp2-pp2"),
                  ("moe", "ep2-tp2"), ("moe", "ep2-dp2-zero2")],
}
# The checkpoint's state tensors of each optimizer (the prefix before the parameter's name).
STATE = {"sgd": {"momentum"}, "lion": {"lion_m"}, "muon": {"muon_m", "adam_v"},
         "adafactor": {"adafactor_row", "adafactor_col", "adafactor_v"}}


def case_layouts(binary, root, tmp):
    for optimizer, layouts in LAYOUTS.items():
        sets = [*SETTINGS[optimizer], f"schedule.decay_steps={STEPS}"]
        references = {}
        for family in sorted({f for f, _ in layouts}):
            run_dir = os.path.join(tmp, f"{optimizer}-{family}-1")
            lu.train(binary, root, run_dir, family, "1", STEPS, sets)
            lu.check_memory_planned(run_dir, "1", f"{optimizer} {family} one rank")
            references[family] = (run_dir, lu.final_weights(binary, root, run_dir))
        for family, layout in layouts:
            label = f"{optimizer} {family} {layout}"
            run_dir = os.path.join(tmp, f"{optimizer}-{family}-{layout}")
            lu.train(binary, root, run_dir, family, layout, STEPS, sets)
            want_dir, want_weights = references[family]
            lu.check_losses(want_dir, run_dir, label, grad_norm=True)
            lu.check_weights(want_weights, lu.final_weights(binary, root, run_dir), label)
            lu.check_memory_planned(run_dir, layout, label)


def state_prefixes(run_dir):
    """The tensor-name prefixes (model, master, the optimizer's) of run_dir's newest checkpoint."""
    checkpoints = os.path.join(run_dir, "checkpoints")
    newest = sorted(d for d in os.listdir(checkpoints) if d.startswith("step_"))[-1]
    with open(os.path.join(checkpoints, newest, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    return {t["name"].split("/")[0] for t in manifest["tensors"]}


def case_resume(binary, root, tmp):
    half = STEPS // 2
    for optimizer in SETTINGS:
        sets = [*SETTINGS[optimizer], f"schedule.decay_steps={STEPS}"]
        straight = os.path.join(tmp, f"{optimizer}-straight")
        lu.train(binary, root, straight, "gpt", "1", STEPS, sets)
        prefixes = state_prefixes(straight) - {"model", "master"}
        check(prefixes == STATE[optimizer],
              f"{optimizer}: the checkpoint holds the state tensors {sorted(prefixes)}, expected "
              f"{sorted(STATE[optimizer])}")
        resumed = os.path.join(tmp, f"{optimizer}-resumed")
        lu.train(binary, root, resumed, "gpt", "1", half, sets)
        cli_util.run_ok(binary, ["resume", resumed, "--set", f"training.steps={STEPS}"], root)
        ru.check_same_run(straight, resumed, STEPS, f"{optimizer} resume")

    # Muon's momentum and Adafactor's statistics saved at dp2 with ZeRO-1 (each rank's part of
    # the momentum; the statistics whole on both) resume at tp2 (each rank's columns or rows).
    for optimizer in ("muon", "adafactor"):
        sets = [*SETTINGS[optimizer], f"schedule.decay_steps={STEPS}"]
        straight = os.path.join(tmp, f"{optimizer}-straight")
        saved = os.path.join(tmp, f"{optimizer}-dp2-zero1")
        lu.train(binary, root, saved, "gpt", "dp2-zero1", half, sets)
        run_dir = os.path.join(tmp, f"{optimizer}-to-tp2")
        shutil.copytree(saved, run_dir)
        moves = ["parallel.dp=1", "parallel.zero=0", "parallel.tp=2", f"training.steps={STEPS}"]
        cli_util.run_ok(binary, ["resume", run_dir, *[a for s in moves for a in ("--set", s)]],
                        root)
        label = f"{optimizer} dp2-zero1 -> tp2"
        lu.check_losses(straight, run_dir, label, 1, STEPS, grad_norm=True)
        lu.check_weights(lu.final_weights(binary, root, straight),
                         lu.final_weights(binary, root, run_dir), label)


def case_snapshots(binary, root, tmp):
    adafactor = SETTINGS["adafactor"]
    # A NaN at batch 8 with a snapshot every 3 steps: back to step 6, batches 7 and 8 skipped.
    guarded = os.path.join(tmp, "rollback")
    cli_stability.train(binary, root, guarded,
                        [*adafactor, "stability.action=rollback", "checkpoint.memory_every_steps=3"],
                        ["--debug-nan-batch", "8"])
    reference = os.path.join(tmp, "dropped")
    cli_stability.train(binary, root, reference, adafactor, ["--debug-drop-batch", "7,8"])
    _, events = cli_stability.steps_of(guarded)
    check([e["action"] for e in events] == ["rollback"], f"adafactor rollback: events {events}")
    cli_stability.check_equal("adafactor rollback", guarded, reference)

    # bf16 moments (optimizer.state_dtype) in the snapshot: the same rollback, bit for bit.
    guarded = os.path.join(tmp, "rollback-bf16")
    cli_stability.train(binary, root, guarded,
                        [*BF16, "stability.action=rollback", "checkpoint.memory_every_steps=3"],
                        ["--debug-nan-batch", "8"])
    reference = os.path.join(tmp, "dropped-bf16")
    cli_stability.train(binary, root, reference, BF16, ["--debug-drop-batch", "7,8"])
    cli_stability.check_equal("adamw bf16-state rollback", guarded, reference)

    # The memory tier: rank 1 of a dp2 run killed after step 30, the resume from the tier.
    sets = [*cli_tiers.MEMORY, *adafactor, "schedule.min_lr=0.0001"]
    run_dir = os.path.join(tmp, "tier")
    cli_tiers.killed_run(binary, root, run_dir, sets)
    output = cli_tiers.resume(binary, root, run_dir)
    check("of the memory tier" in cli_tiers.resumed_from(output), output)
    ru.check_same_run(cli_tiers.straight(binary, root, tmp, sets), run_dir, cli_tiers.STEPS,
                      "adafactor memory tier")


# optimizer.state_dtype bf16: the moments' stochastic rounding draws its bits from each element's
# global index, so every layout rounds as one rank does. The layouts cover the placements a range
# can have: ZeRO parts cut inside parameters (dp2), column- and row-split matrices (tp2), q, k and
# v head groups (GQA at tp2), stages (pp2) and experts split over ep and tp.
BF16_LAYOUTS = {
    "adamw": [("gpt", "dp2-zero1"), ("gpt", "tp2"), ("llama", "tp2"), ("moe", "ep2-tp2")],
    "sgd": [("gpt", "dp2-zero1"), ("gpt", "tp2")],
    "lion": [("gpt", "dp2-zero1"), ("gpt", "tp2")],
    "muon": [("gpt", "dp2-zero1"), ("gpt", "tp2"), ("gpt", "tp2-pp2"), ("moe", "ep2-dp2-zero2")],
}
BF16 = ["optimizer.state_dtype=bf16"]
BF16_TENSOR_TOLERANCE = 1e-3


def moment_dtypes(run_dir):
    """{prefix: {dtype}} of the optimizer-state tensors in run_dir's newest checkpoint."""
    checkpoints = os.path.join(run_dir, "checkpoints")
    newest = sorted(d for d in os.listdir(checkpoints) if d.startswith("step_"))[-1]
    with open(os.path.join(checkpoints, newest, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    out = {}
    for t in manifest["tensors"]:
        prefix = t["name"].split("/")[0]
        if prefix not in ("model", "master"):
            out.setdefault(prefix, set()).add(t["dtype"])
    return out


def case_state_bf16(binary, root, tmp):
    for optimizer, layouts in BF16_LAYOUTS.items():
        base = SETTINGS.get(optimizer, [])
        sets = [*base, *BF16, f"schedule.decay_steps={STEPS}"]
        references = {}
        for family in sorted({f for f, _ in layouts}):
            run_dir = os.path.join(tmp, f"{optimizer}-{family}-1")
            lu.train(binary, root, run_dir, family, "1", STEPS, sets)
            lu.check_memory_planned(run_dir, "1", f"{optimizer} bf16 {family} one rank")
            references[family] = (run_dir, lu.final_weights(binary, root, run_dir))
        dtypes = moment_dtypes(references["gpt"][0])
        check(dtypes and all(d == {"bf16"} for d in dtypes.values()),
              f"{optimizer} bf16: the checkpoint's optimizer state is {dtypes}, expected bf16")
        # The rounding is not a no-op: the fp32-state run is near but not equal.
        fp32_dir = os.path.join(tmp, f"{optimizer}-fp32")
        lu.train(binary, root, fp32_dir, "gpt", "1", STEPS, [*base, f"schedule.decay_steps={STEPS}"])
        want, got = lu.losses(fp32_dir), lu.losses(references["gpt"][0])
        error = lu.relative(want[STEPS]["loss"], got[STEPS]["loss"])
        check(0 < error < 1e-2, f"{optimizer}: step {STEPS} loss with bf16 moments "
              f"{got[STEPS]['loss']!r}, with fp32 {want[STEPS]['loss']!r} ({error:.3g} relative)")
        for family, layout in layouts:
            label = f"{optimizer} bf16 {family} {layout}"
            run_dir = os.path.join(tmp, f"{optimizer}-{family}-{layout}")
            lu.train(binary, root, run_dir, family, layout, STEPS, sets)
            want_dir, want_weights = references[family]
            worst = lu.check_losses(want_dir, run_dir, label, grad_norm=True)
            whole, tensor = lu.check_weights(want_weights, lu.final_weights(binary, root, run_dir),
                                             label, tensor_tolerance=BF16_TENSOR_TOLERANCE)
            lu.check_memory_planned(run_dir, layout, label)
            print(f"{label}: worst loss error {worst:.3g}, weights {whole:.3g}, worst tensor "
                  f"{tensor}")

    # Resumes: bf16 moments bit for bit; saved at dp2 with ZeRO-1, continued at tp2 within the
    # layout tolerance; and a run whose recipe changes state_dtype converts the saved moments
    # (fp32 to bf16 rounded to nearest, bf16 to fp32 exactly) and continues near the straight run.
    half = STEPS // 2
    sets = [*BF16, f"schedule.decay_steps={STEPS}"]
    straight = os.path.join(tmp, "adamw-gpt-1")
    resumed = os.path.join(tmp, "adamw-bf16-resumed")
    lu.train(binary, root, resumed, "gpt", "1", half, sets)
    cli_util.run_ok(binary, ["resume", resumed, "--set", f"training.steps={STEPS}"], root)
    ru.check_same_run(straight, resumed, STEPS, "adamw bf16 resume")
    saved = os.path.join(tmp, "muon-bf16-dp2-zero1")
    lu.train(binary, root, saved, "gpt", "dp2-zero1", half, [*SETTINGS["muon"], *sets])
    moves = ["parallel.dp=1", "parallel.zero=0", "parallel.tp=2", f"training.steps={STEPS}"]
    cli_util.run_ok(binary, ["resume", saved, *[a for s in moves for a in ("--set", s)]], root)
    label = "muon bf16 dp2-zero1 -> tp2"
    muon_straight = os.path.join(tmp, "muon-gpt-1")
    lu.check_losses(muon_straight, saved, label, 1, STEPS, grad_norm=True)
    lu.check_weights(lu.final_weights(binary, root, muon_straight),
                     lu.final_weights(binary, root, saved), label,
                     tensor_tolerance=BF16_TENSOR_TOLERANCE)
    for before, after, reference in (("fp32", "bf16", "adamw-fp32"), ("bf16", "fp32", "adamw-gpt-1")):
        run_dir = os.path.join(tmp, f"adamw-{before}-to-{after}")
        lu.train(binary, root, run_dir, "gpt", "1", half,
                 [f"optimizer.state_dtype={before}", f"schedule.decay_steps={STEPS}"])
        cli_util.run_ok(binary, ["resume", run_dir, "--set", f"optimizer.state_dtype={after}",
                                 "--set", f"training.steps={STEPS}"], root)
        dtypes = moment_dtypes(run_dir)
        stored = {"fp32": "f32", "bf16": "bf16"}[after]  # the manifest's dtype names
        check(dtypes == {"adam_m": {stored}, "adam_v": {stored}},
              f"adamw {before} -> {after}: the resumed run saved moments {dtypes}")
        lu.check_losses(os.path.join(tmp, reference), run_dir, f"adamw {before} -> {after}",
                        1, STEPS, tolerance=1e-3)


def case_bad_input(binary, root, tmp):
    # A lion run resumed as adamw: its checkpoint holds lion_m, not Adam's moments.
    run_dir = os.path.join(tmp, "lion")
    lu.train(binary, root, run_dir, "gpt", "1", 2, [*SETTINGS["lion"], "schedule.warmup_steps=1"])
    before = {name: os.path.getmtime(os.path.join(run_dir, name))
              for name in cli_util.tree(run_dir)}
    result = cli_util.run(binary, ["resume", run_dir, "--set", "optimizer.name=adamw", "--set",
                                   "training.steps=4"], root)
    check(result.rc == 2 and "saved by optimizer lion" in result.stderr and
          "optimizer.name is adamw" in result.stderr,
          f"resuming a lion run as adamw: expected exit 2 naming both optimizers\n"
          f"{result.describe()}")
    after = {name: os.path.getmtime(os.path.join(run_dir, name))
             for name in cli_util.tree(run_dir)}
    check(set(before) <= set(after), f"the refused resume lost {sorted(set(before) - set(after))}")
    changed = sorted(n for n in before if after[n] != before[n] and not n.endswith((".log", ".lock")))
    check(not changed, f"the refused resume rewrote {changed}")
    for sets, words in (
            (["optimizer.name=sgd", "optimizer.momentum=0"], "optimizer.nesterov"),
            (["optimizer.name=muon", "optimizer.ns_steps=0"], "optimizer.ns_steps"),
            (["optimizer.name=adam"], "optimizer.name"),
            (["optimizer.name=adafactor", "optimizer.state_dtype=bf16"], "optimizer.state_dtype"),
            (["optimizer.name=sgd", "optimizer.momentum=0", "optimizer.nesterov=false",
              "optimizer.state_dtype=bf16"], "optimizer.state_dtype"),
            (["precision.compute=fp64", "optimizer.state_dtype=bf16"], "optimizer.state_dtype"),
            (["optimizer.state_dtype=fp16"], "optimizer.state_dtype")):
        target = os.path.join(tmp, "refused")
        args = ["run", "recipes/tiny.yaml", *[a for s in sets for a in ("--set", s)],
                "--run-dir", target]
        cli_util.check_refused(binary, args, root, words, target)


if __name__ == "__main__":
    cli_util.cases_main({"layouts": case_layouts, "resume": case_resume,
                         "state_bf16": case_state_bf16,
                         "snapshots": case_snapshots, "bad_input": case_bad_input}, "optimizers")
