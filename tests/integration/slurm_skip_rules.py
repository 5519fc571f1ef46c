#!/usr/bin/env python3
"""cli:slurm_skip_rules: the Slurm tests skip only when Slurm cannot run on this machine, and
never in CI.

slurm_util.local_slurm runs `scripts/slurm-local up` under a repository root; here the root is a
temporary folder whose scripts/slurm-local is a stand-in that exits with a chosen code. A test
process that enters local_slurm must then exit:
  - 77 (skipped) for slurm-local's 77 ("cannot run here": packages missing, not root), without CI;
  - 1 (failed), naming CI, for that same 77 with CI=true;
  - 1 (failed), with slurm-local's message, for any other failure, with or without CI.
Run as: slurm_skip_rules.py TRAINCTL REPO_ROOT.
"""
import os
import subprocess
import sys

import cli_util
from cli_util import check

ENTER = """
import sys
import cli_util
import slurm_util
def body(binary, root):
    with slurm_util.local_slurm(sys.argv[2]):
        print("entered a Slurm that did not start")
cli_util.main_wrapper(body)
"""


def body(binary, root):
    here = os.path.dirname(os.path.abspath(__file__))
    with cli_util.temp_dir("slurm-skip-rules") as fake_root:
        os.makedirs(os.path.join(fake_root, "scripts"))
        script = os.path.join(fake_root, "scripts", "slurm-local")
        for ci, up_code, want, said in (("", 77, 77, "SKIPPED: scripts/slurm-local up"),
                                        ("true", 77, 1, "CI=true: the Slurm tests must run"),
                                        ("", 1, 1, "scripts/slurm-local up failed (1)"),
                                        ("true", 1, 1, "scripts/slurm-local up failed (1)")):
            with open(script, "w") as f:
                f.write("#!/bin/sh\n[ \"$1\" = up ] || exit 0\n"
                        f"echo 'slurm-local: stand-in exits {up_code}' >&2\nexit {up_code}\n")
            os.chmod(script, 0o755)
            env = dict(os.environ, CI=ci, PYTHONPATH=here)
            done = subprocess.run([sys.executable, "-c", ENTER, binary, fake_root], env=env,
                                  capture_output=True, text=True, timeout=60)
            out = done.stdout + done.stderr
            case = f"CI={ci!r}, slurm-local up exits {up_code}"
            check(done.returncode == want, f"{case}: the test exited {done.returncode}, not "
                  f"{want}\n{out}")
            check(said in out and f"stand-in exits {up_code}" in out,
                  f"{case}: the output does not say why ('{said}')\n{out}")


if __name__ == "__main__":
    cli_util.main_wrapper(body)
