"""Shared helpers for the end-to-end CLI tests of trainctl (tests/integration/cli_*.py).

Every test script is run by CTest as

    python3 SCRIPT.py TRAINCTL_BINARY REPO_ROOT

with the repository root as working directory (recipes name data/kjv.txt relative to it). A script
exits 0 when every check passed and 1 with a message naming the failed check otherwise; it never
leaves files behind (each run goes to its own temporary directory, removed at the end).
"""
import contextlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib


class CheckFailed(Exception):
    """One failed expectation; the message says what was expected and what was seen."""


def check(condition, message):
    if not condition:
        raise CheckFailed(message)


def parse_args():
    """(binary, repo_root) from the command line; exits 2 with usage on bad arguments."""
    if len(sys.argv) != 3:
        print(f"usage: {os.path.basename(sys.argv[0])} TRAINCTL_BINARY REPO_ROOT", file=sys.stderr)
        sys.exit(2)
    binary, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if not os.access(binary, os.X_OK):
        print(f"{binary}: not an executable; build the trainctl target first", file=sys.stderr)
        sys.exit(2)
    return binary, root


def main_wrapper(body):
    """Runs body(binary, root); prints the failure and exits 1 on CheckFailed."""
    binary, root = parse_args()
    start = time.monotonic()
    try:
        body(binary, root)
    except CheckFailed as failure:
        print(f"FAILED: {failure}", file=sys.stderr)
        sys.exit(1)
    print(f"ok ({time.monotonic() - start:.1f} s)")
    sys.exit(0)


def cases_main(cases, prefix):
    """The main of a script of named cases: `SCRIPT BINARY ROOT [CASE...]` runs the cases named
    (all by default), each in its own temporary directory `<prefix>-<case>`, as case(binary, root,
    tmp). An unknown case name fails before any case runs."""
    wanted = sys.argv[3:] or list(cases)
    del sys.argv[3:]  # parse_args takes exactly the binary and the root

    def body(binary, root):
        unknown = [name for name in wanted if name not in cases]
        check(not unknown, f"unknown case {unknown}; the cases are {', '.join(cases)}")
        for name in wanted:
            start = time.monotonic()
            with temp_dir(f"{prefix}-{name}") as tmp:
                cases[name](binary, root, tmp)
            print(f"{name}: ok ({time.monotonic() - start:.1f} s)")

    main_wrapper(body)


class Result:
    def __init__(self, args, completed):
        self.args = args
        self.rc = completed.returncode
        self.stdout = completed.stdout
        self.stderr = completed.stderr

    def describe(self):
        return (f"command: {' '.join(self.args)}\nexit code: {self.rc}\n"
                f"--- stdout ---\n{self.stdout}--- stderr ---\n{self.stderr}")


def run(binary, args, cwd, timeout=600):
    """Runs trainctl with `args` in `cwd`; progress goes to stderr as plain lines (not a tty)."""
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    completed = subprocess.run([binary, *args], cwd=cwd, env=env, capture_output=True,
                               text=True, timeout=timeout)
    return Result([binary, *args], completed)


def run_ok(binary, args, cwd, timeout=600):
    """Runs trainctl and fails the test unless it exits 0."""
    result = run(binary, args, cwd, timeout)
    check(result.rc == 0, f"expected exit code 0\n{result.describe()}")
    return result


def check_refused(binary, args, root, words, run_dir):
    """Runs trainctl with `args` (bad input): exit 2, `words` on stderr, nothing created at
    `run_dir`."""
    result = run(binary, args, root)
    check(result.rc == 2 and words in result.stderr,
          f"expected exit 2 and {words!r}\n{result.describe()}")
    check(not os.path.exists(run_dir), f"bad input created {tree(run_dir)}")


@contextlib.contextmanager
def temp_dir(prefix):
    """A fresh temporary directory, removed afterwards (also when a check fails)."""
    path = tempfile.mkdtemp(prefix=f"trainctl-{prefix}-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def read_metrics(run_dir):
    """The records of <run_dir>/metrics.jsonl, one dict per line, each line valid JSON."""
    path = os.path.join(run_dir, "metrics.jsonl")
    check(os.path.isfile(path), f"{path} is missing")
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise CheckFailed(f"{path}:{number}: not JSON ({error}): {line!r}")
    return records


def read_summary(run_dir):
    path = os.path.join(run_dir, "summary.json")
    check(os.path.isfile(path), f"{path} is missing")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def tree(path):
    """Every file and folder under `path` (relative names), to prove nothing was created."""
    entries = set()
    for parent, folders, files in os.walk(path):
        for name in folders + files:
            entries.add(os.path.relpath(os.path.join(parent, name), path))
    return entries


# A small model on recipes/tiny.yaml's data for the short runs (seconds on one core): 2 layers,
# width 64, 64-token sequences, 8 sequences a step.
SMALL_MODEL = ["model.layers=2", "model.hidden=64", "model.heads=4", "model.kv_heads=4",
               "model.ffn_hidden=256", "model.seq_len=64", "training.global_batch=8",
               "training.micro_batch=4", "schedule.warmup_steps=2", "logging.eval_batches=2"]


def small_run_args(run_dir, steps, extra=()):
    """`run recipes/tiny.yaml` with SMALL_MODEL, `steps` steps and `extra` KEY=VALUE settings."""
    sets = SMALL_MODEL + [f"training.steps={steps}", *extra]
    return ["run", "recipes/tiny.yaml", *[a for s in sets for a in ("--set", s)],
            "--run-dir", run_dir]


def png_pixels(path):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB or RGBA, non-interlaced PNG."""
    with open(path, "rb") as f:
        data = f.read()
    check(data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    check(depth == 8 and color in (2, 6) and interlace == 0, f"{path}: unexpected PNG {header}")
    channels = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc
                                      else corner)) & 0xFF
        rows.append([tuple(line[x * channels:x * channels + 3]) for x in range(width)])
        previous = line
    return width, height, rows


def screenshot(page, png, window):
    """Renders the file `page` in headless Chromium into `png` at `window` (width, height).
    Without chromium (no `scripts/setup --tests`) the test is skipped (exit 77), except in CI
    (CI=true, as .ci/run sets), where it fails."""
    chromium = shutil.which("chromium")
    if not chromium:
        check(os.environ.get("CI", "").lower() not in ("1", "true", "yes"),
              "CI=true: no chromium to render the page; scripts/setup --tests installs it")
        print("skipped: no chromium to render the page (scripts/setup --tests installs it)")
        sys.exit(77)
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={window[0]},{window[1]}", f"--screenshot={png}",
                    "file://" + os.path.abspath(page)], cwd=os.path.dirname(png),
                   capture_output=True, timeout=120, check=False)
    check(os.path.isfile(png), f"chromium wrote no screenshot of {page}")
