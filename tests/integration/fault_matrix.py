#!/usr/bin/env python3
"""The fault matrix: what a hostile user or a failing file system does to trainctl, and what it
must do in return (issue 15, docs/reliability.md).

Every row injects one fault into a real `trainctl` run and checks the contract for its class:
  - bad input gets exit 2, a message naming the file, the value and the fix, and nothing created;
  - a failure gets exit 1 and a message naming the file; every file trainctl had written is
    intact (old recipe.yaml, checkpoints that verify, metrics.jsonl that parses), and the run
    resumes once the fault is gone;
  - nothing hangs (a watchdog kills a command after WATCHDOG_S and fails the row), and no refusal
    costs more than 1 GiB of memory or 10 s.
Each row prints: fault | exit code | first line of the message | files intact | seconds | peak MiB.

    fault_matrix.py TRAINCTL_BINARY REPO_ROOT [GROUP ...]

Groups (one CTest test each, cli:faults_<group>): lost_files, disk_full, lock, unbounded,
not_regular, late, changing_data, yaml, signals. Without a group, all of them (scripts/fault-matrix
prints the whole table). disk_full mounts small tmpfs file systems and exits 77 (skipped) where
this process may not mount.
"""
import os
import random
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

import cli_resume_util as ru
import cli_util
from cli_util import check

WATCHDOG_S = 60       # a command still running after this is a hang: killed, the row fails
REFUSE_S = 10.0       # a refusal must come within this
REFUSE_MIB = 1024     # ... and cost at most this much memory
ROWS = []             # every row run, for the table
SKIP = 77


class Outcome:
    """A finished command: exit code, output (stdout and stderr together), seconds, peak MiB."""

    def __init__(self, args, rc, output, seconds, peak_mib, hung):
        self.args, self.rc, self.output = args, rc, output
        self.seconds, self.peak_mib, self.hung = seconds, peak_mib, hung

    def message(self):
        """The first error line, else the last line."""
        lines = [l for l in self.output.splitlines() if l.strip()]
        for pattern in (r"(^|: )error: ", r"^(skipped|took over|stopped by) ", r"^done: "):
            for line in lines:
                if re.search(pattern, line):
                    return line.strip()
        return lines[-1].strip() if lines else ""

    def describe(self):
        return (f"command: {' '.join(self.args)}\nexit code: {self.rc}"
                f"{' (killed by the watchdog: it hung)' if self.hung else ''}\n"
                f"--- output ---\n{self.output}")


def invoke(binary, args, cwd, on_line=None, preexec_fn=None, timeout=WATCHDOG_S):
    """Runs trainctl; `on_line(line, process)` sees each output line as it comes. Peak memory is
    the child's own (wait4's rusage), not the test's."""
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    start = time.monotonic()
    process = subprocess.Popen([binary, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                               preexec_fn=preexec_fn)
    hung = threading.Event()

    def kill():
        hung.set()
        process.kill()

    watchdog = threading.Timer(timeout, kill)
    watchdog.start()
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if on_line:
                on_line(line, process)
        try:
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            peak_mib = usage.ru_maxrss / 1024.0
        except ChildProcessError:  # already reaped by subprocess: no rusage, say so
            process.wait()
            peak_mib = float("nan")
    finally:
        watchdog.cancel()
    return Outcome([binary, *args], process.returncode, "".join(lines),
                   time.monotonic() - start, peak_mib, hung.is_set())


def row(fault, outcome, intact, expect_rc, pattern=None):
    """Records a row and checks its contract: the exit code, the message, no hang, intact files;
    a refusal (exit 2) within REFUSE_S and REFUSE_MIB."""
    ROWS.append((fault, outcome.rc, outcome.message(), intact, outcome.seconds, outcome.peak_mib))
    print(f"  {fault}: exit {outcome.rc}, {outcome.seconds:.2f} s, {outcome.peak_mib:.0f} MiB, "
          f"intact {'yes' if intact else 'NO'}", flush=True)
    check(not outcome.hung, f"{fault}: trainctl hung\n{outcome.describe()}")
    expected = expect_rc if isinstance(expect_rc, tuple) else (expect_rc,)
    check(outcome.rc in expected, f"{fault}: expected exit code {' or '.join(map(str, expected))}"
          f"\n{outcome.describe()}")
    if pattern:
        check(re.search(pattern, outcome.output, re.S),
              f"{fault}: the output does not match {pattern!r}\n{outcome.describe()}")
    check(intact, f"{fault}: files were harmed\n{outcome.describe()}")
    if outcome.rc == 2:
        check(outcome.seconds < REFUSE_S,
              f"{fault}: refused after {outcome.seconds:.1f} s (at most {REFUSE_S} s)")
        check(outcome.peak_mib < REFUSE_MIB,  # NaN (not measured) fails too
              f"{fault}: refusing cost {outcome.peak_mib:.0f} MiB (at most {REFUSE_MIB} MiB)")


# ---- run directories and their state ---------------------------------------------------------

EXTRA = ["checkpoint.every_steps=2", "checkpoint.keep_last=100"]


def make_run(binary, root, run_dir, steps, extra=()):
    cli_util.run_ok(binary, ru.run_args(run_dir, steps, [*EXTRA, *extra]), root)


def snapshot(run_dir):
    """The bytes of every file under run_dir that a failed command must leave as they were (logs
    are appended to, the lock is rewritten: both left out)."""
    files = {}
    for name in sorted(cli_util.tree(run_dir)):
        path = os.path.join(run_dir, name)
        if name.startswith("logs") or name == "trainctl.lock" or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            files[name] = f.read()
    return files


# A file's temporary twin (.NAME.tmp-PID) or a checkpoint's temporary folder (.tmp-step_N).
TEMPORARY = re.compile(r"(^|/)\.[^/]*\.tmp-\d+$|(^|/)\.tmp-step_")


def leftovers(run_dir):
    """Temporary files or folders a command left behind."""
    return [n for n in cli_util.tree(run_dir) if TEMPORARY.search(n)]


def run_intact(binary, root, run_dir, killed=False):
    """recipe.yaml whole, metrics.jsonl every line JSON, every step_ checkpoint verifies, `latest`
    names one, no temporary leftovers (`killed`: a killed save's temporary folder may stay; no
    reader ever looks at it)."""
    recipe = open(os.path.join(run_dir, "recipe.yaml"), encoding="utf-8").read()
    if not recipe.startswith("# resolved recipe (hash ") or "training:" not in recipe:
        return False
    try:
        cli_util.read_metrics(run_dir)
    except cli_util.CheckFailed:
        return False
    checkpoints = os.path.join(run_dir, "checkpoints")
    steps = [n for n in os.listdir(checkpoints) if n.startswith("step_")]
    for name in steps:
        if cli_util.run(binary, ["ckpt", "verify", os.path.join(checkpoints, name)], root).rc:
            return False
    latest = open(os.path.join(checkpoints, "latest"), encoding="utf-8").read().strip()
    return latest in steps and (killed or not leftovers(run_dir))


# ---- groups ----------------------------------------------------------------------------------

def group_lost_files(binary, root, tmp):
    """A rejected checkpoint never replaces an earlier rejected one of the same name."""
    run_dir = os.path.join(tmp, "quarantine")
    make_run(binary, root, run_dir, 4)
    rejected = os.path.join(run_dir, "checkpoints", "rejected")
    for attempt in (1, 2):
        manifest = os.path.join(run_dir, "checkpoints", "step_00000004", "manifest.json")
        with open(manifest, "r+b") as f:
            f.seek(10)
            f.write(b"#")
        out = invoke(binary, ru.resume_args(run_dir, ["training.steps=4"]), root)
        names = sorted(os.listdir(rejected))
        expected = ["step_00000004"] if attempt == 1 else ["step_00000004", "step_00000004.1"]
        moved_to = os.path.join(rejected, expected[-1])
        row(f"damaged step_00000004, resume (quarantine #{attempt})", out,
            names == expected and run_intact(binary, root, run_dir), 0,
            rf"skipped step_00000004 \(.*\): moved to {re.escape(moved_to)}, never read")


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def group_disk_full(binary, root, tmp):
    """The disk fills up at each write of a resume: every outcome is exit 0, or exit 1 naming
    ENOSPC with every earlier file intact; freeing the space, resume then completes."""
    mnt = os.path.join(tmp, "mnt")
    os.makedirs(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mnt],
                      capture_output=True).returncode != 0:
        print("  skipped: cannot mount a tmpfs here (needs root)")
        sys.exit(SKIP)
    try:
        base = os.path.join(tmp, "base")
        make_run(binary, root, base, 2)
        shard = os.path.getsize(os.path.join(base, "checkpoints", "step_00000002", "rank_0.bin"))
        # Free space left for the resume: none, a page or a few (the recipe, the metrics, the log
        # lines), and around one checkpoint (its shard, then its manifest and `latest`).
        for free in (0, 4096, 2 * 4096, 3 * 4096, 8 * 4096, shard // 2, shard + 8192, shard + 64 * 1024):
            run_dir = os.path.join(mnt, "run")
            shutil.copytree(base, run_dir)
            filler = os.path.join(mnt, "filler")
            with open(filler, "wb") as f:
                size = max(0, free_bytes(mnt) - free)
                if size:
                    os.posix_fallocate(f.fileno(), 0, size)
            before = snapshot(run_dir)
            out = invoke(binary, ru.resume_args(run_dir, ["training.steps=4"]), root)
            intact = run_intact(binary, root, run_dir)
            if out.rc == 1:  # no checkpoint it had written before may have changed
                after = snapshot(run_dir)
                intact = intact and all(after.get(k) == v for k, v in before.items()
                                        if k.startswith("checkpoints/"))
            row(f"disk full, {free} bytes free, resume", out, intact, (0, 1),
                None if out.rc == 0 else r"No space left on device")
            os.remove(filler)
            cli_util.run_ok(binary, ru.resume_args(run_dir, ["training.steps=4"]), root)
            ru.step_records(run_dir, 4)
            shutil.rmtree(run_dir)
    finally:
        subprocess.run(["umount", "-l", mnt], capture_output=True)


def group_lock(binary, root, tmp):
    """A second run or resume on a live run directory is refused with the holder; the lock of a
    killed run is taken over with a note."""
    run_dir = os.path.join(tmp, "locked")
    results = {}

    def at_step(line, process):
        if line.startswith("step 2/") and not results:
            before = snapshot(run_dir)
            results["resume"] = invoke(binary, ru.resume_args(run_dir), root)
            results["overwrite"] = invoke(binary, ru.run_args(run_dir, 400, EXTRA) +
                                          ["--overwrite"], root)
            # The holder goes on saving meanwhile: its own temporary files are renamed away.
            results["intact"] = all(os.path.exists(os.path.join(run_dir, k)) for k in before
                                    if not TEMPORARY.search(k))
            results["pid"] = process.pid
            process.kill()

    first = invoke(binary, ru.run_args(run_dir, 400, EXTRA), root, on_line=at_step)
    check(results, f"the first run never reached step 2\n{first.describe()}")
    holder = rf"in use by another trainctl \(pid {results['pid']} on .*, started .* UTC"
    row("resume of a live run directory", results["resume"], results["intact"], 2, holder)
    row("run --overwrite of a live run directory", results["overwrite"], results["intact"], 2,
        holder)
    newest = max(int(n[5:]) for n in os.listdir(os.path.join(run_dir, "checkpoints"))
                 if n.startswith("step_"))
    out = invoke(binary, ru.resume_args(run_dir, [f"training.steps={newest + 2}"]), root)
    row("resume after the holder was killed (SIGKILL)", out,
        run_intact(binary, root, run_dir, killed=True), 0,
        rf"took over the run directory's lock from pid {results['pid']} on ")


def group_unbounded(binary, root, tmp):
    """Inputs far over their limits are refused before they are parsed."""
    tiny = open(os.path.join(root, "recipes", "tiny.yaml"), encoding="utf-8").read()
    big = os.path.join(tmp, "big.yaml")
    with open(big, "w", encoding="utf-8") as f:
        f.write(tiny + "# " + "x" * (50 << 20) + "\n")
    run_dir = os.path.join(tmp, "never")
    out = invoke(binary, ["run", big, "--run-dir", run_dir], root)
    row("50 MiB recipe, run", out, not os.path.exists(run_dir), 2,
        r"the recipe has \d+ bytes, more than the 1048576")
    deep = os.path.join(tmp, "deep.yaml")
    with open(deep, "w", encoding="utf-8") as f:
        f.write("name: deep\nmodel: " + "[" * 200000 + "]" * 200000 + "\n")
    out = invoke(binary, ["validate", deep], root)
    row("recipe nested 200000 deep, validate", out, True, 2,
        r"deep\.yaml:2:\d+: error: YAML nested \d+ levels deep")
    cluster = os.path.join(tmp, "big-cluster.yaml")
    with open(cluster, "w", encoding="utf-8") as f:
        f.write("# " + "x" * (50 << 20) + "\n")
    out = invoke(binary, ["plan", "recipes/tiny.yaml", "--cluster", cluster], root)
    row("50 MiB cluster file, plan", out, True, 2, r"more than the 1048576")
    # Thousands of shards: one descriptor each stays open, past a soft limit of 1024 (trainctl
    # raises it to the hard limit, as Go's runtime does).
    shards = os.path.join(tmp, "shards")
    os.makedirs(shards)
    for i in range(3000):
        write_llmc_shard(os.path.join(shards, f"train_{i:05d}.bin"),
                         [(i * 131 + t * 7) % 250 for t in range(200)])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard > 4000:
        run_dir = os.path.join(tmp, "many-shards")
        out = invoke(binary, ru.run_args(run_dir, 2, ["data.source=llmc",
                                                      f"data.path={shards}/train_*.bin"]),
                     root, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                                 (1024, hard)))
        row("3000 data shards under a soft limit of 1024 open files", out,
            os.path.isfile(os.path.join(run_dir, "summary.json")), 0, r"llm\.c shards .*3000 files")
    run = os.path.join(tmp, "manifest")
    make_run(binary, root, run, 2)
    manifest = os.path.join(run, "checkpoints", "step_00000002", "manifest.json")
    with open(manifest, "r+b") as f:  # a valid prefix, then 100 MiB of padding
        f.seek(0, os.SEEK_END)
        f.write(b" " * (100 << 20))
    for command in (["ckpt", "verify"], ["ckpt", "inspect"]):
        out = invoke(binary, [*command, os.path.dirname(manifest)], root)
        row(f"100 MiB manifest, {' '.join(command)}", out, True, (1, 2),
            r"manifest\.json: the checkpoint manifest has \d+ bytes, more than the 16777216")
        check(out.seconds < REFUSE_S and out.peak_mib < REFUSE_MIB,
              f"100 MiB manifest: {out.seconds:.1f} s, {out.peak_mib:.0f} MiB")


def fifo(path):
    if os.path.exists(path):
        os.remove(path)
    os.mkfifo(path)


def group_not_regular(binary, root, tmp):
    """A FIFO in the place of any file trainctl reads is refused, never waited on."""
    recipe = os.path.join(tmp, "fifo.yaml")
    fifo(recipe)
    for command in ("run", "validate", "plan"):
        out = invoke(binary, [command, recipe], root)
        row(f"FIFO recipe, {command}", out, True, 2, r"FIFO \(named pipe\), not a regular file")
    out = invoke(binary, ["plan", "recipes/tiny.yaml", "--cluster", recipe], root)
    row("FIFO cluster file, plan", out, True, 2, r"FIFO")
    data = os.path.join(tmp, "fifo.txt")
    fifo(data)
    run_dir = os.path.join(tmp, "never")
    out = invoke(binary, ru.run_args(run_dir, 2, [f"data.path={data}"]), root)
    row("FIFO data file, run", out, not os.path.exists(run_dir), 2, r"fifo\.txt.*not a regular")
    base = os.path.join(tmp, "base")
    make_run(binary, root, base, 4)
    cases = [("metrics.jsonl", ["resume"], 2), ("recipe.yaml", ["resume"], 2),
             ("logs/rank_0.log", ["resume"], 2),
             ("checkpoints/latest", ["resume"], 0),
             ("checkpoints/latest", ["ckpt", "inspect"], 0),
             ("checkpoints/step_00000004/manifest.json", ["resume"], 0),
             ("checkpoints/step_00000004/manifest.json", ["ckpt", "verify"], 1),
             ("checkpoints/step_00000004/rank_0.bin", ["resume"], 0),
             ("checkpoints/step_00000004/rank_0.bin", ["ckpt", "verify"], 1)]
    for name, command, rc in cases:
        run_dir = os.path.join(tmp, "fifo-run")
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.copytree(base, run_dir)
        fifo(os.path.join(run_dir, name))
        before = snapshot(run_dir)
        resume = command == ["resume"]
        args = (ru.resume_args(run_dir, ["training.steps=6"]) if resume
                else [*command, os.path.join(run_dir, "checkpoints")])
        out = invoke(binary, args, root)
        if resume and rc == 0:  # trained past it: the damaged step set aside, the rest verifies
            intact = run_intact(binary, root, run_dir)
        else:  # refused or only read: nothing changed, the FIFO still there
            intact = (snapshot(run_dir) == before and
                      stat.S_ISFIFO(os.lstat(os.path.join(run_dir, name)).st_mode))
        pattern = {2: r"FIFO \(named pipe\)", 1: r"corrupt"}.get(rc)
        if resume and "step_00000004" in name:  # set aside, never read, then trained past
            pattern = r"skipped step_00000004 \(.*FIFO.*\): moved to .*rejected/step_00000004"
        row(f"FIFO {name}, {' '.join(command)}", out, intact, rc, pattern)


def write_llmc_shard(path, tokens):
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(b"".join(v.to_bytes(4, "little", signed=True) for v in header))
        f.write(b"".join(t.to_bytes(2, "little") for t in tokens))


def group_late(binary, root, tmp):
    """Input errors that used to surface mid-run or as exit 1 are bad input before anything is
    created."""
    shard = os.path.join(tmp, "train_000.bin")
    tokens = [(i * 7) % 200 for i in range(200000)]
    tokens[199990] = 300
    write_llmc_shard(shard, tokens)
    run_dir = os.path.join(tmp, "never")
    out = invoke(binary, ru.run_args(run_dir, 2, ["data.source=llmc", f"data.path={shard}"]), root)
    row("llm.c shard with a token id above model.vocab at its end", out,
        not os.path.exists(run_dir), 2,
        rf"{re.escape(shard)}, token 199990: token id 300 is outside model.vocab 256.*at least 301")
    # Under torchrun or srun each rank reads its part: rank 1 of 2 holds the end of the shard.
    os.environ.update(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1")
    try:
        out = invoke(binary, ru.run_args(run_dir, 2, ["data.source=llmc", f"data.path={shard}",
                                                      "parallel.dp=2"]), root)
    finally:
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            del os.environ[name]
    row("the same, rank 1 of 2 under torchrun (each rank reads its half)", out,
        not os.path.exists(run_dir), 2,
        r"token 199990: token id 300 .*in part 2 of 2 of data\.path \(the part this rank checks\)")
    out = invoke(binary, ru.run_args(run_dir, 2, ["model.vocab=100"]), root)
    row("model.vocab 100 below the text's bytes", out, not os.path.exists(run_dir), 2,
        r"data/kjv\.txt, byte \d+: token id \d+ is outside model\.vocab 100")
    a_file = os.path.join(tmp, "a-file")
    open(a_file, "w").close()
    for label, where in (("a regular file", a_file), ("under a regular file", a_file + "/run"),
                         ("in /proc", "/proc/trainctl-run")):
        out = invoke(binary, ru.run_args(where, 2), root)
        row(f"run directory {label}", out, os.path.isfile(a_file), 2,
            r"cannot hold the run's files")
    read_only = os.path.join(tmp, "read-only")
    os.makedirs(read_only)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", read_only],
                      capture_output=True).returncode == 0:
        try:
            out = invoke(binary, ru.run_args(os.path.join(read_only, "run"), 2), root)
            row("run directory on a read-only file system", out, not os.listdir(read_only), 2,
                r"cannot hold the run's files: .*Read-only file system")
        finally:
            subprocess.run(["umount", "-l", read_only], capture_output=True)
    else:
        print("  (no read-only row: cannot mount a tmpfs here; root bypasses permission bits)")
    run_dir = os.path.join(tmp, "finished")
    make_run(binary, root, run_dir, 4)
    before = snapshot(run_dir)
    out = invoke(binary, ru.resume_args(run_dir, ["training.steps=2"]), root)
    row("resume --set training.steps below the checkpoint's step", out,
        snapshot(run_dir) == before, 2, r"training\.steps 2 is below step 4 .*training\.steps=4")


def group_changing_data(binary, root, tmp):
    """Data truncated or rewritten under a running job: exit 1 naming the file, the last finished
    step saved; with the data restored, resume continues to the same result as a straight run."""
    steps = 40
    reference = os.path.join(tmp, "straight")
    data = os.path.join(tmp, "kjv.txt")
    shutil.copy(os.path.join(root, "data", "kjv.txt"), data)
    make_run(binary, root, reference, steps, [f"data.path={data}"])
    for label, harm in (("truncated", lambda f: os.truncate(f, 100000)),
                        ("rewritten in place", lambda f: open(f, "r+b").write(b"X" * 4096))):
        run_dir = os.path.join(tmp, label.replace(" ", "-"))
        done = []

        def at_step(line, process):
            if line.startswith("step 3/") and not done:
                harm(data)
                done.append(True)

        out = invoke(binary, ru.run_args(run_dir, steps, [*EXTRA, f"data.path={data}"]), root,
                     on_line=at_step)
        # The last finished step is in a checkpoint (saved now, or by the cadence just before).
        match = re.search(r"continue from step_(\d+) with: trainctl resume", out.output)
        finished = len(cli_util.read_metrics(run_dir))
        intact = (bool(match) and int(match.group(1)) == finished and
                  run_intact(binary, root, run_dir))
        row(f"data file {label} during training", out, intact, 1,
            rf"{re.escape(data)}: the data file changed while the run was reading it")
        shutil.copy(os.path.join(root, "data", "kjv.txt"), data)
        cli_util.run_ok(binary, ru.resume_args(run_dir), root)
        ru.check_same_run(reference, run_dir, steps, f"resumed after the data was {label}")


def group_yaml(binary, root, tmp):
    """A recipe of several YAML documents is refused at the second one."""
    tiny = open(os.path.join(root, "recipes", "tiny.yaml"), encoding="utf-8").read()
    separator = tiny.count("\n") + 1  # the line of the ---
    for label, tail in (("two documents", "---\nname: second\n"), ("an empty second", "---\n")):
        path = os.path.join(tmp, "two.yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(tiny + tail)
        run_dir = os.path.join(tmp, "never")
        out = invoke(binary, ["run", path, "--run-dir", run_dir], root)
        row(f"recipe with {label} (---)", out, not os.path.exists(run_dir), 2,
            rf"two\.yaml:{separator}:1: error: a recipe is one YAML document")


def group_signals(binary, root, tmp):
    """SIGKILL or SIGTERM at random moments of saves (every step saves): every committed
    checkpoint verifies, and resume completes the run."""
    rng = random.Random(int(os.environ.get("FAULT_SEED", "15")))
    steps = 30
    for trial in range(4):
        signum = signal.SIGKILL if trial % 2 == 0 else signal.SIGTERM
        at = rng.randint(2, 20)
        run_dir = os.path.join(tmp, f"signal-{trial}")
        delay = rng.uniform(0.0, 0.03)  # within the step that saves, at a random moment

        def at_step(line, process, at=at, signum=signum, delay=delay):
            if line.startswith(f"step {at}/"):
                threading.Timer(delay, lambda: process.send_signal(signum)).start()

        out = invoke(binary, ru.run_args(run_dir, steps, ["checkpoint.every_steps=1",
                                                          "checkpoint.keep_last=100"]),
                     root, on_line=at_step)
        intact = run_intact(binary, root, run_dir, killed=signum == signal.SIGKILL)
        name = signal.Signals(signum).name
        row(f"{name} {delay * 1000:.0f} ms after step {at}, saving every step", out, intact,
            (-9, 75) if signum == signal.SIGKILL else 75)
        cli_util.run_ok(binary, ru.resume_args(run_dir), root)
        ru.step_records(run_dir, steps)


GROUPS = {"lost_files": group_lost_files, "disk_full": group_disk_full, "lock": group_lock,
          "unbounded": group_unbounded, "not_regular": group_not_regular, "late": group_late,
          "changing_data": group_changing_data, "yaml": group_yaml, "signals": group_signals}


def print_table():
    print("\n| fault | exit | message | files intact | s | peak MiB |\n|---|---|---|---|---|---|")
    for fault, rc, message, intact, seconds, peak in ROWS:
        # The test's own temporary folders say nothing: "<tmp>" instead.
        message = re.sub(r"/tmp/trainctl-faults-[^/\s]+", "<tmp>", message).replace("|", "\\|")
        if len(message) > 150:
            message = message[:147] + "..."
        print(f"| {fault} | {rc} | {message} | {'yes' if intact else 'no'} | {seconds:.2f} | "
              f"{peak:.0f} |")


def main():
    if len(sys.argv) < 3:
        print(f"usage: {sys.argv[0]} TRAINCTL_BINARY REPO_ROOT [GROUP ...]", file=sys.stderr)
        sys.exit(2)
    binary, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    groups = sys.argv[3:] or list(GROUPS)
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        print(f"unknown group {unknown[0]}; the groups are {', '.join(GROUPS)}", file=sys.stderr)
        sys.exit(2)
    start = time.monotonic()
    code = 0
    for name in groups:
        print(f"{name}:", flush=True)
        with cli_util.temp_dir(f"faults-{name}") as tmp:
            try:
                GROUPS[name](binary, root, tmp)
            except cli_util.CheckFailed as failure:
                print(f"FAILED: {failure}", file=sys.stderr)
                code = 1
            except SystemExit as e:
                if e.code != SKIP or len(groups) == 1:
                    raise
    print_table()
    print(f"\n{len(ROWS)} rows in {time.monotonic() - start:.1f} s")
    sys.exit(code)


if __name__ == "__main__":
    main()
