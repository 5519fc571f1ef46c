"""Shared helpers for the Slurm integration tests (tests/integration/slurm_*.py).

Each test brings up its own single-machine Slurm with scripts/slurm-local in a private folder and
on free ports, and always takes it down again. When Slurm cannot be started here (no packages and
not root, no munge, ...) the test prints one line saying why and exits 77, which CTest reports as
skipped (SKIP_RETURN_CODE 77).

Requeued jobs: `scontrol requeue` (what the batch script runs after a save on a signal) makes
Slurm hold the job about 120 s before it may start again, and the job itself cannot shorten that
(an `scontrol update StartTime=now` from inside the job runs before the requeue sets the begin
time). The tests release it from outside with release_requeued(), as an impatient user would.
"""
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from cli_util import CheckFailed, check

SKIP = 77


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)


def in_ci():
    """Whether this runs in CI (CI=true, which .ci/run sets): there the Slurm tests must run."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def cannot_run(reason):
    """Slurm cannot run on this machine: a skip, except in CI, where it is a failure."""
    if in_ci():
        raise CheckFailed(f"CI=true: the Slurm tests must run, but {reason}")
    skip(reason)


def free_port_base(count):
    """A port p with p .. p+count-1 free on 127.0.0.1 (slurmctld on p, slurmd N on p+N)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                sockets.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise CheckFailed("found no free range of ports for slurmctld and slurmd")


class Cluster:
    """A running slurm-local; run Slurm clients through .env."""

    def __init__(self, folder, env):
        self.folder, self.env = folder, env

    def command(self, args, timeout=30):
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout)
        check(done.returncode == 0, f"{' '.join(args)} failed ({done.returncode}): "
              f"{done.stdout}{done.stderr}")
        return done.stdout

    def job(self, job_id):
        """The fields of `scontrol show job -o` as a dict (JobState, Restarts, ExitCode, ...)."""
        out = self.command(["scontrol", "show", "job", "-o", str(job_id)])
        fields = {}
        for word in out.split():
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
        return fields

    def wait_for(self, job_id, predicate, what, timeout):
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if predicate(fields):
                return fields
            check(time.monotonic() < deadline,
                  f"job {job_id}: waited {timeout} s for {what}; it is {fields.get('JobState')} "
                  f"(reason {fields.get('Reason')}, restarts {fields.get('Restarts')})\n"
                  f"{self.logs()}")
            time.sleep(0.2)

    def wait_done(self, job_id, timeout):
        finished = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
        return self.wait_for(job_id, lambda f: f.get("JobState") in finished, "its end", timeout)

    def release_requeued(self, job_id, restarts, timeout=30, updates=()):
        """Waits until the job is pending again after its `restarts`-th requeue, then lifts
        Slurm's 120 s requeue hold so that it starts now (with `updates`, e.g. "TimeLimit=5").

        slurmd revokes the credential of the ended attempt with a time in whole seconds and
        refuses a credential created in the same second ("Job credential revoked": the job then
        ends FAILED without running), so the release waits 2 s after the requeue."""
        self.wait_for(job_id, lambda f: f.get("JobState") == "PENDING" and
                      int(f.get("Restarts", "0")) >= restarts, f"requeue {restarts}", timeout)
        time.sleep(2)
        self.command(["scontrol", "update", f"jobid={job_id}", *updates, "StartTime=now"])

    def logs(self):
        """The tails of the daemons' logs, for failure messages."""
        text = ""
        folder = os.path.join(self.folder, "log")
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if name.endswith(".log"):
                with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                    text += f"--- {name} (tail) ---\n" + "".join(f.readlines()[-15:])
        return text


@contextlib.contextmanager
def local_slurm(root, nodes=1):
    """scripts/slurm-local up in a private folder; down (and the folder removed) afterwards.
    Exits 77 (skip) only when Slurm cannot run on this machine (no Debian packages and no way to
    install them: slurm-local's exit 77), and not even then in CI; any other failure to start is
    a test failure."""
    if shutil.which("dpkg-query") is None:
        cannot_run("no dpkg-query: scripts/slurm-local needs Debian's Slurm packages")
    folder = tempfile.mkdtemp(prefix="trainctl-slurm-")
    env = dict(os.environ)
    env["TRAINCTL_SLURM_DIR"] = folder
    env["TRAINCTL_SLURM_PORT"] = str(free_port_base(nodes + 1))
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    script = os.path.join(root, "scripts", "slurm-local")
    try:
        up = subprocess.run([script, "up", "--nodes", str(nodes)], env=env, capture_output=True,
                            text=True, timeout=300)
        said = (up.stderr or up.stdout).strip().splitlines()[-1:]
        if up.returncode == SKIP:
            cannot_run(f"scripts/slurm-local up: {said}")
        check(up.returncode == 0, f"scripts/slurm-local up failed ({up.returncode}): "
              f"{up.stdout}{up.stderr}")
        env["SLURM_CONF"] = os.path.join(folder, "slurm.conf")
        yield Cluster(folder, env)
    finally:
        subprocess.run([script, "down"], env=env, capture_output=True, text=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def task_pids(job_id, procid=None, binary=None):
    """Pids of live (not zombie) processes of Slurm job `job_id` (SLURM_JOB_ID in their
    environment), only those that are task `procid` (SLURM_PROCID) and run `binary` when given.
    Under srun there is no launcher of ours to ask: the environment Slurm gave each task is the
    way to tell the ranks apart (readable here because the tests run as root, like slurmd)."""
    want = {b"SLURM_JOB_ID=" + str(job_id).encode()}
    if procid is not None:
        want.add(b"SLURM_PROCID=" + str(procid).encode())
    exe = os.path.realpath(binary) if binary else None
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = set(f.read().split(b"\0"))
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if exe and os.path.realpath(f"/proc/{pid}/exe") != exe:
                continue
        except OSError:
            continue
        if want <= environ and state != "Z":
            found.append(int(pid))
    return found


def submit(cluster, binary, root, sets, run_dir, timeout=60):
    """`trainctl submit recipes/tiny.yaml --set ... --run-dir RUN_DIR`; returns (job id, log)."""
    args = [binary, "submit", "recipes/tiny.yaml", *[a for s in sets for a in ("--set", s)],
            "--run-dir", run_dir]
    done = subprocess.run(args, cwd=root, env=cluster.env, capture_output=True, text=True,
                          timeout=timeout)
    check(done.returncode == 0, f"trainctl submit failed ({done.returncode})\n{done.stdout}"
          f"{done.stderr}")
    match = re.fullmatch(r"submitted job (\d+), run directory (\S+), log (\S+)\n", done.stdout)
    check(match, f"unexpected submit output: {done.stdout!r}")
    check(match.group(2) == run_dir, f"submit used run directory {match.group(2)}, not {run_dir}")
    return match.group(1), match.group(3)


def read(path):
    """A file's text, or "(no PATH)" when it does not exist (yet)."""
    if not os.path.exists(path):
        return f"(no {path})"
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def without_steps(text, keep=5):
    """`text` without its progress lines ("step N/M | ..."), but for the last `keep` of them: what a
    failure message shows of a job log, so that the lines that matter are not cut from CI's view."""
    lines = text.splitlines()
    steps = [i for i, line in enumerate(lines) if line.startswith("step ")]
    dropped = set(steps[:-keep] if keep else steps)
    kept = [line for i, line in enumerate(lines) if i not in dropped]
    if dropped:
        kept.insert(min(dropped), f"({len(dropped)} progress lines left out)")
    return "\n".join(kept)


def wait_for_text(path, pattern, what, timeout, cluster=None):
    """Waits until the file at `path` matches the regular expression `pattern` (multiline)."""
    deadline = time.monotonic() + timeout
    while not (os.path.exists(path) and re.search(pattern, read(path), re.M)):
        check(time.monotonic() < deadline, f"waited {timeout} s for {what}\n--- {path} ---\n"
              f"{read(path)}\n{cluster.logs() if cluster else ''}")
        time.sleep(0.1)
    return read(path)
