#!/usr/bin/env python3
"""cli:version: `trainctl version` and `trainctl --version` exit 0, print the same facts, and list
the cpu backend."""
import re

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
        for key in ("build:", "libraries:", "devices:"):
            check(any(l.startswith(key) for l in lines), f"no '{key}' line\n{result.describe()}")
        outputs.append(result.stdout)
    check(outputs[0] == outputs[1],
          f"version and --version differ:\n{outputs[0]}---\n{outputs[1]}")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
