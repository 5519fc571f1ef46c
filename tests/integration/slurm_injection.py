#!/usr/bin/env python3
"""slurm:injection: recipe values holding $(...), backticks, quotes and newlines never run a
command, end to end through the trainctl binary.

  (a) Without Slurm (`trainctl submit --dry-run`, `trainctl validate`): values Slurm reads itself
      (partition, account, extra, time, the run name) are refused with exit 2, the key named at
      the recipe's line:col or at the --set, by validate as by submit; environment values are
      accepted and appear single-quoted, byte for byte, in the script; a newline is refused
      everywhere. Nothing is written and no marker file appears.
  (b) With a real single-machine Slurm: a job whose slurm.env holds those values runs to the end;
      none of the commands in them ran (their marker files do not exist) and the rank saw the
      values literally (it prints them into its log through a shell-free path: the test reads
      /proc/<rank>/environ while the rank runs).
Skips (exit 77) for part (b) when Slurm cannot be started here (part (a) has run by then).
Run as: slurm_injection.py TRAINCTL REPO_ROOT.
"""
import os
import subprocess
import time

import cli_resume_util as ru
import cli_util
import slurm_util
from cli_util import check


def sets_of(pairs):
    return [a for s in pairs for a in ("--set", s)]


def run(binary, root, args, env=None):
    return subprocess.run([binary, *args], cwd=root, capture_output=True, text=True, timeout=60,
                          env=env)


def check_refused(done, where, key, label):
    check(done.returncode == 2, f"{label}: expected exit 2, got {done.returncode}\n"
          f"{done.stdout}{done.stderr}")
    check(any(line.startswith(where) and key in line for line in done.stderr.splitlines()),
          f"{label}: the error does not name {key} at {where}\n{done.stderr}")


def markers_absent(folder):
    left = [m for m in os.listdir(folder) if m.startswith("mark")]
    check(not left, f"a recipe value ran a command: {left} exist in {folder}")


def body(binary, root):
    with cli_util.temp_dir("slurm-injection") as tmp:
        mark = os.path.join(tmp, "mark")
        base = sets_of([*cli_util.SMALL_MODEL, "training.steps=2"])
        # (a) values that would reach Slurm's own parsing: refused, at the --set
        for key, value in (("slurm.partition", f"$(touch {mark}1)"),
                           ("slurm.account", f"`touch {mark}2`"),
                           ("slurm.extra", f"--comment=$(touch {mark}3)"),
                           ("slurm.extra", "--comment='x'"),
                           ("slurm.time", "1;touch x")):
            setting = f"{key}={value}"
            for command in (["submit", "--dry-run"], ["validate"]):
                done = run(binary, root, [*command, "recipes/tiny.yaml", *base,
                                          *sets_of([setting])])
                check_refused(done, f"error: --set {setting}", key, " ".join(command))
        # newlines and quotes from a recipe file, at line:col; validate reports the same
        recipe = os.path.join(tmp, "evil.yaml")
        with open(os.path.join(root, "recipes", "tiny.yaml")) as f:
            text = f.read()
        with open(recipe, "w") as f:
            f.write(text + 'slurm:\n  qos: "a\\nb"\n  env: "A=1\\nsrun rm -rf /"\n')
        lines = text.count("\n")
        for command in (["submit", "--dry-run"], ["validate"]):
            done = run(binary, root, [*command, recipe, *base])
            check_refused(done, f"{recipe}:{lines + 2}:8: ", "slurm.qos", " ".join(command))
            check_refused(done, f"{recipe}:{lines + 3}:8: ", "slurm.env", " ".join(command))
        with open(recipe, "w") as f:
            f.write(text.replace("name: tiny", f'name: "t$(touch {mark}4)"'))
        done = run(binary, root, ["submit", "--dry-run", recipe, *base])
        check_refused(done, f"{recipe}:4:", "name", "submit of an injected run name")

        # environment values are data: single-quoted in the script, byte for byte
        # (slurm.env splits at spaces: ${IFS} is the space-free way to write a command)
        values = {"INJ_A": f"$(touch${{IFS}}{mark}5)", "INJ_B": f"`touch${{IFS}}{mark}6`",
                  "INJ_C": "it's\"quoted\";", "INJ_D": f"'$(touch${{IFS}}{mark}7)'"}
        env_setting = "slurm.env=" + " ".join(f"{k}={v}" for k, v in values.items())
        done = run(binary, root, ["submit", "--dry-run", "recipes/tiny.yaml", *base,
                                  "--set", env_setting, "--run-dir", os.path.join(tmp, "dry")])
        check(done.returncode == 0, f"submit --dry-run refused slurm.env\n{done.stderr}")
        for name, value in values.items():
            quoted = "'" + value.replace("'", "'\\''") + "'"
            check(f"\nexport {name}={quoted}\n" in done.stdout,
                  f"{name} is not single-quoted literally in the script\n{done.stdout}")
        check(not os.path.exists(os.path.join(tmp, "dry")), "--dry-run wrote the run directory")
        markers_absent(tmp)

        # (b) the same values through a real job
        with slurm_util.local_slurm(root) as cluster:
            run_dir = os.path.join(tmp, "real")
            sets = [*cli_util.SMALL_MODEL, *ru.QUIET, "training.steps=40",
                    "checkpoint.every_steps=0", env_setting]
            job_id, log = slurm_util.submit(cluster, binary, root, sets, run_dir)
            seen = None
            deadline = time.monotonic() + 60
            while seen is None and time.monotonic() < deadline:
                for pid in slurm_util.task_pids(job_id, 0, binary):
                    try:
                        with open(f"/proc/{pid}/environ", "rb") as f:
                            pairs = [v.split(b"=", 1) for v in f.read().split(b"\0")]
                        seen = dict(p for p in pairs if len(p) == 2)
                    except OSError:
                        pass
                time.sleep(0.05)
            fields = cluster.wait_done(job_id, 60)
            text = slurm_util.read(log)
            check(fields["JobState"] == "COMPLETED", f"job {job_id} ended {fields['JobState']}"
                  f"\n{text}")
            check(seen is not None, f"never saw the rank of job {job_id} running\n{text}")
            for name, value in values.items():
                check(seen.get(name.encode()) == value.encode(),
                      f"the rank saw {name}={seen.get(name.encode())!r}, not {value!r}")
            markers_absent(tmp)
            markers_absent(root)


if __name__ == "__main__":
    cli_util.main_wrapper(body)
