"""Shared by the multi-rank CLI tests (cli_multirank_faults.py, cli_promises.py): the tiny fp32
GPT they train, its command line, an environment without any rank's variables, and the live
processes of a run."""
import os

# A tiny fp32 GPT, every step logged: about 10 ms a step on one core.
TINY = ["model.arch=gpt", "model.layers=2", "model.hidden=32", "model.heads=4",
        "model.kv_heads=4", "model.ffn_hidden=128", "model.vocab=256", "model.seq_len=32",
        "precision.compute=fp32", "training.global_batch=8", "training.micro_batch=2",
        "schedule.warmup_steps=2", "logging.eval_batches=1", "logging.eval_every_steps=0",
        "logging.every_steps=1", "logging.tensorboard=false", "checkpoint.keep_last=100"]


def tiny_run_args(run_dir, steps, extra=(), layout=("parallel.dp=2",)):
    """`trainctl run` arguments for TINY over `steps` steps in `layout`, then `extra` --sets."""
    sets = TINY + [f"training.steps={steps}", f"schedule.decay_steps={steps}", *layout, *extra]
    return ["run", "recipes/tiny.yaml", *[a for s in sets for a in ("--set", s)],
            "--run-dir", run_dir]


def rank_free_env():
    """This environment without the variables that would make trainctl act as one rank of a job
    (a test may itself run under a launcher or Slurm)."""
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    for name in ("TRAINCTL_RANK", "TRAINCTL_WORLD_SIZE", "TRAINCTL_LAUNCHER_PID", "RANK",
                 "WORLD_SIZE", "SLURM_PROCID"):
        env.pop(name, None)
    return env


def process_identity(pid):
    """(start time, state, ppid) of a process from /proc/<pid>/stat, or None when there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[19]), fields[0], int(fields[1])


def processes_of_run(run_dir):
    """Pids of live (not zombie) processes whose command line names run_dir: ranks and launcher."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except OSError:
            continue
        identity = process_identity(pid)
        if run_dir in cmdline and identity and identity[1] != "Z":
            found.append(int(pid))
    return found
