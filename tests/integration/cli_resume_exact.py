#!/usr/bin/env python3
"""cli:resume_exact: a run that stops and resumes equals a run that never stopped, bit for bit.

For fp32, bf16, fp16 with a dynamic loss scale (it starts at 1e9 so the first steps overflow and
are skipped, and grows every 3 finite steps, so the scaler's state crosses every boundary), gradient
accumulation (4 micro-batches a step) and a Llama-style MoE model:
  (a) a straight run of 2N steps;
  (b) a run of N steps (schedule.decay_steps = 2N), then `trainctl resume DIR --set
      training.steps=2N`;
  (c) a run of 2N steps stopped by SIGTERM after step K (exit 75, saved on the signal, no periodic
      checkpoints), then `trainctl resume DIR`.
Per-step metrics (every step once, in order) and the final weights' fingerprint of (b) and (c)
equal (a)'s. One configuration is also stopped by SIGUSR1."""
import os
import signal

import cli_resume_util as ru
import cli_util
from cli_util import check

N = 8
STOP_AT = 3  # the signal goes out once the log shows this step

CONFIGS = {
    "fp32": ["precision.compute=fp32", "precision.loss_scale=none"],
    "bf16": ["precision.compute=bf16"],
    "fp16": ["precision.compute=fp16", "precision.loss_scale=dynamic",
             "precision.initial_loss_scale=1e9", "precision.loss_scale_window=3"],
    "accumulation": ["training.global_batch=8", "training.micro_batch=2"],
    "moe": ["model.arch=llama", "moe.experts=4", "moe.top_k=2"],
}


def common(extra):
    # decay_steps = 2N in every run, so the first half of (b) follows the 2N-step schedule.
    return [f"schedule.decay_steps={2 * N}", "checkpoint.every_steps=0",
            "checkpoint.keep_last=100", *extra]


def check_fp16_is_exercised(run_dir):
    """The fp16 case proves the scaler state only if the scale really moves across step N."""
    records = ru.step_records(run_dir, 2 * N)
    skipped = [r["step"] for r in records if r["skipped"]]
    check(skipped and skipped[0] == 1 and STOP_AT in skipped,
          f"fp16: expected the first steps (1..{STOP_AT} at least) skipped by a loss scale of 1e9, "
          f"got skipped steps {skipped}")
    scales = [r["loss_scale"] for r in records]
    check(len(set(scales[N:])) > 1,
          f"fp16: the loss scale does not change after step {N} ({scales}); the test would not "
          "show that the scaler state is restored")


def straight(binary, root, tmp, label, extra):
    run_dir = os.path.join(tmp, f"{label}-straight")
    cli_util.run_ok(binary, ru.run_args(run_dir, 2 * N, common(extra)), root)
    return run_dir


def split_at_end(binary, root, tmp, label, extra, reference):
    run_dir = os.path.join(tmp, f"{label}-split")
    cli_util.run_ok(binary, ru.run_args(run_dir, N, common(extra)), root)
    check(ru.checkpoint_names(run_dir) == ["latest", f"step_{N:08d}"],
          f"{label}: after a run of {N} steps with no periodic saves expected only the final "
          f"checkpoint, found {ru.checkpoint_names(run_dir)}")
    resumed = cli_util.run_ok(binary, ru.resume_args(run_dir, [f"training.steps={2 * N}"]), root)
    check(f"resuming from step_{N:08d}" in resumed.stderr,
          f"{label}: resume does not say which checkpoint it uses\n{resumed.describe()}")
    check(cli_util.read_summary(run_dir)["resumed_from_step"] == N,
          f"{label}: summary.json resumed_from_step is not {N}")
    ru.check_same_run(reference, run_dir, 2 * N, f"{label}, stopped at the end of {N} steps")


def split_by_signal(binary, root, tmp, label, extra, reference, signum):
    run_dir = os.path.join(tmp, f"{label}-{signal.Signals(signum).name}")
    args = ru.run_args(run_dir, 2 * N, common(extra))
    stopped = ru.stop_with_signal(binary, args, root, run_dir, STOP_AT, 2 * N, signum)
    resumed = cli_util.run_ok(binary, ru.resume_args(run_dir), root)
    check(f"resuming from step_{stopped:08d}" in resumed.stderr,
          f"{label}: resume does not use step_{stopped:08d}\n{resumed.describe()}")
    ru.check_same_run(reference, run_dir, 2 * N,
                      f"{label}, stopped by {signal.Signals(signum).name} after step {stopped}")


def main(binary, root):
    with cli_util.temp_dir("resume-exact") as tmp:
        for label, extra in CONFIGS.items():
            reference = straight(binary, root, tmp, label, extra)
            if label == "fp16":
                check_fp16_is_exercised(reference)
            split_at_end(binary, root, tmp, label, extra, reference)
            split_by_signal(binary, root, tmp, label, extra, reference, signal.SIGTERM)
            if label == "bf16":
                split_by_signal(binary, root, tmp, label, extra, reference, signal.SIGUSR1)
            print(f"{label}: split at step {N} and stopped by signal both equal the straight run")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
