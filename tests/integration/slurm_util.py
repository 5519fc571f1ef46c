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

    def release_requeued(self, job_id, restarts, timeout=30):
        """Waits until the job is pending again after its `restarts`-th requeue, then lifts
        Slurm's 120 s requeue hold so that it starts now."""
        self.wait_for(job_id, lambda f: f.get("JobState") == "PENDING" and
                      int(f.get("Restarts", "0")) >= restarts, f"requeue {restarts}", timeout)
        self.command(["scontrol", "update", f"jobid={job_id}", "StartTime=now"])

    def logs(self):
        """The tail of slurmctld's log, for failure messages."""
        path = os.path.join(self.folder, "log", "slurmctld.log")
        if not os.path.exists(path):
            return ""
        with open(path, encoding="utf-8", errors="replace") as f:
            return "--- slurmctld.log (tail) ---\n" + "".join(f.readlines()[-15:])


@contextlib.contextmanager
def local_slurm(root, nodes=1):
    """scripts/slurm-local up in a private folder; down (and the folder removed) afterwards.
    Exits 77 (skip) when it cannot start."""
    if shutil.which("dpkg-query") is None:
        skip("no dpkg-query: scripts/slurm-local needs Debian's Slurm packages")
    folder = tempfile.mkdtemp(prefix="trainctl-slurm-")
    env = dict(os.environ)
    env["TRAINCTL_SLURM_DIR"] = folder
    env["TRAINCTL_SLURM_PORT"] = str(free_port_base(nodes + 1))
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    script = os.path.join(root, "scripts", "slurm-local")
    try:
        up = subprocess.run([script, "up", "--nodes", str(nodes)], env=env, capture_output=True,
                            text=True, timeout=300)
        if up.returncode != 0:
            skip(f"scripts/slurm-local up failed: {(up.stderr or up.stdout).strip().splitlines()[-1:]}")
        env["SLURM_CONF"] = os.path.join(folder, "slurm.conf")
        yield Cluster(folder, env)
    finally:
        subprocess.run([script, "down"], env=env, capture_output=True, text=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
