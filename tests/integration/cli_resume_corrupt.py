#!/usr/bin/env python3
"""cli:resume_corrupt: a damaged checkpoint is never loaded, and resume says why it skipped it.

One run of 6 steps saves steps 2, 4 and 6 (schedule.decay_steps 8, so it can be extended to 8).
Each case damages a copy of that run directory and resumes it with --set training.steps=8:
  - one byte flipped in the newest shard, the newest shard truncated, the newest manifest
    truncated: resume prints "skipped step_00000006 (REASON): moved to .../rejected/..., never
    read", continues from step_00000004, and the finished run equals a straight 8-step run;
  - every checkpoint damaged: exit 2, each one listed with its reason, nothing written;
  - the checkpoints of a model with another hidden size: exit 2 naming model hidden, nothing
    written.
Every case runs even when an earlier one fails; the failure lists all that failed."""
import os
import re
import shutil

import cli_resume_util as ru
import cli_util
from cli_util import CheckFailed, check

STEPS, EXTENDED = 6, 8
EXTRA = [f"schedule.decay_steps={EXTENDED}", "checkpoint.every_steps=2", "checkpoint.keep_last=100"]
EXTEND = [f"training.steps={EXTENDED}"]


def step_dir(run_dir, step):
    return os.path.join(run_dir, "checkpoints", f"step_{step:08d}")


def flip_byte(path):
    """Flips one bit in the middle of the file (inside a tensor's bytes, past the header)."""
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size // 2)
        byte = f.read(1)[0]
        f.seek(size // 2)
        f.write(bytes([byte ^ 0x10]))


def truncate_half(path):
    with open(path, "r+b") as f:
        f.truncate(f.seek(0, os.SEEK_END) // 2)


def snapshot(path):
    files = {}
    for name in cli_util.tree(path):
        full = os.path.join(path, name)
        files[name] = open(full, "rb").read() if os.path.isfile(full) else None
    return files


def check_falls_back(binary, root, base, reference, tmp, label, damage, reason_words):
    """Damages step 6 of a copy of `base` with `damage(run_dir)`, resumes, and checks the fallback
    to step 4: the skip line names the reason, the entry moves to rejected/, the run completes
    equal to `reference`."""
    run_dir = os.path.join(tmp, label)
    shutil.copytree(base, run_dir)
    damage(run_dir)
    resumed = cli_util.run(binary, ru.resume_args(run_dir, EXTEND), root)
    check(resumed.rc == 0, f"{label}: resume must skip the damaged step_00000006 and continue from "
          f"step_00000004\n{resumed.describe()}")
    rejected = os.path.join(run_dir, "checkpoints", "rejected", "step_00000006")
    match = re.search(r"^skipped step_00000006 \((.+)\): moved to (.+), never read$",
                      resumed.stderr, re.MULTILINE)
    check(match and match.group(2) == rejected,
          f"{label}: expected 'skipped step_00000006 (REASON): moved to {rejected}, never read'\n"
          f"{resumed.describe()}")
    reason = match.group(1)
    check(any(w in reason for w in reason_words),
          f"{label}: the reason '{reason}' names none of {reason_words}")
    check("resuming from step_00000004" in resumed.stderr,
          f"{label}: resume does not continue from step_00000004\n{resumed.describe()}")
    check(os.path.isdir(rejected), f"{label}: {rejected} is missing")
    ru.check_same_run(reference, run_dir, EXTENDED, label)


def check_refused(binary, root, run_dir, label, expected_lines):
    """Resume must exit 2 with every one of `expected_lines` (regexes) in stderr and leave the
    run directory exactly as it was."""
    before = snapshot(run_dir)
    resumed = cli_util.run(binary, ru.resume_args(run_dir, EXTEND), root)
    check(resumed.rc == 2, f"{label}: expected exit code 2\n{resumed.describe()}")
    for pattern in expected_lines:
        check(re.search(pattern, resumed.stderr, re.MULTILINE),
              f"{label}: stderr lacks /{pattern}/\n{resumed.describe()}")
    check(snapshot(run_dir) == before, f"{label}: the refused resume changed the run directory")


def all_damaged(binary, root, base, tmp):
    run_dir = os.path.join(tmp, "all-damaged")
    shutil.copytree(base, run_dir)
    truncate_half(os.path.join(step_dir(run_dir, 2), "rank_0.bin"))
    truncate_half(os.path.join(step_dir(run_dir, 4), "manifest.json"))
    os.remove(os.path.join(step_dir(run_dir, 6), "manifest.json"))
    checkpoints = re.escape(os.path.join(run_dir, "checkpoints"))
    check_refused(binary, root, run_dir, "every checkpoint damaged", [
        rf"^trainctl resume: error: {checkpoints} holds no valid checkpoint to resume from:$",
        r"^  step_00000006: no manifest\.json",
        r"^  step_00000004: .*manifest\.json",
        r"^  step_00000002: .*rank_0\.bin",
    ])


def other_model(binary, root, base, tmp):
    run_dir = os.path.join(tmp, "other-model")
    cli_util.run_ok(binary, ru.run_args(run_dir, 2, [*EXTRA, "model.hidden=32"]), root)
    shutil.rmtree(os.path.join(run_dir, "checkpoints"))
    shutil.copytree(os.path.join(base, "checkpoints"), os.path.join(run_dir, "checkpoints"))
    check_refused(binary, root, run_dir, "checkpoint of another model", [
        r"^trainctl resume: error: .*step_00000006: saved for another model: model hidden is 64 "
        r"there but 32 in this recipe$",
    ])


def main(binary, root):
    with cli_util.temp_dir("resume-corrupt") as tmp:
        base = os.path.join(tmp, "base")
        cli_util.run_ok(binary, ru.run_args(base, STEPS, EXTRA), root)
        check(ru.checkpoint_names(base) == ["latest", "step_00000002", "step_00000004",
                                            "step_00000006"],
              f"unexpected checkpoints {ru.checkpoint_names(base)}")
        reference = os.path.join(tmp, "straight")
        cli_util.run_ok(binary, ru.run_args(reference, EXTENDED, EXTRA), root)

        newest_shard = lambda d: os.path.join(step_dir(d, 6), "rank_0.bin")
        newest_manifest = lambda d: os.path.join(step_dir(d, 6), "manifest.json")
        cases = [
            ("flipped byte in the newest shard", lambda: check_falls_back(
                binary, root, base, reference, tmp, "flipped-shard-byte",
                lambda d: flip_byte(newest_shard(d)), ["checksum", "crc32c"])),
            ("newest shard truncated", lambda: check_falls_back(
                binary, root, base, reference, tmp, "truncated-shard",
                lambda d: truncate_half(newest_shard(d)), ["rank_0.bin"])),
            ("newest manifest truncated", lambda: check_falls_back(
                binary, root, base, reference, tmp, "truncated-manifest",
                lambda d: truncate_half(newest_manifest(d)), ["manifest.json"])),
            ("every checkpoint damaged", lambda: all_damaged(binary, root, base, tmp)),
            ("checkpoint of another model", lambda: other_model(binary, root, base, tmp)),
        ]
        failures = []
        for label, case in cases:
            try:
                case()
                print(f"{label}: ok")
            except CheckFailed as failure:
                print(f"{label}: FAILED")
                failures.append(f"[{label}] {failure}")
        check(not failures, "\n\n".join(failures))


if __name__ == "__main__":
    cli_util.main_wrapper(main)
