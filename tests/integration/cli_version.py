#!/usr/bin/env python3
"""cli:version: `trainctl version` and `trainctl --version` exit 0, print the same facts, and list
the cpu backend. A run's first line names its device in one line: on a machine without a GPU (no
NVIDIA driver, as `version` shows) it is "device: cpu (no GPU found)", not a CUDA error."""
import re
import subprocess

import cli_util
from cli_util import check


def main(binary, root):
    outputs = []
    for args in (["version"], ["--version"]):
        result = cli_util.run_ok(binary, args, root)
        lines = result.stdout.splitlines()
        check(lines and re.fullmatch(r"trainctl \d+\.\d+\.\d+", lines[0]),
              f"first line is not 'trainctl X.Y.Z'\n{result.describe()}")
        backends = [l for l in lines if l.startswith("backends:")]
        check(len(backends) == 1, f"expected one 'backends:' line\n{result.describe()}")
        names = re.split(r"[\s;,]+", backends[0].split(":", 1)[1].strip())
        check(names[0] == "cpu", f"the cpu backend is not listed first: {backends[0]}")
        for key in ("source:", "build:", "libraries:", "devices:"):
            check(any(l.startswith(key) for l in lines), f"no '{key}' line\n{result.describe()}")
        outputs.append(result.stdout)
    check(outputs[0] == outputs[1],
          f"version and --version differ:\n{outputs[0]}---\n{outputs[1]}")
    # The commit the binary was built from (captured at build time, lib/run/build_info.cmake).
    source = next(l for l in outputs[0].splitlines() if l.startswith("source:"))
    head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        check(re.fullmatch(rf"source: +commit {head.stdout.strip()} \((clean|dirty) tree\)", source),
              f"'{source}' does not name HEAD {head.stdout.strip()}")

    devices = next(l for l in outputs[0].splitlines() if l.startswith("devices:"))
    with cli_util.temp_dir("version") as tmp:
        result = cli_util.run_ok(binary, cli_util.small_run_args(tmp + "/run", 2), root)
    first = result.stderr.splitlines()[0]
    check(first.startswith("device: "), f"the first line names no device\n{result.describe()}")
    if "driver none" in devices:  # no NVIDIA driver: a machine without a GPU
        check(first == "device: cpu (no GPU found)",
              f"expected 'device: cpu (no GPU found)', got '{first}' ({devices})")
    elif "CUDA not compiled in" in devices:
        check(first == "device: cpu (CUDA not compiled in)", f"got '{first}' ({devices})")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
