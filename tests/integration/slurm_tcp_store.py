#!/usr/bin/env python3
"""slurm:tcp_store: without a shared file system (cluster.shared_fs: false) the ranks of a Slurm
job rendezvous through the TCP store rank 0 serves on the first node, not through files.

A dp 2 job over two emulated nodes, one task each. The emulated node names (node1, node2) do not
resolve on this machine, so the ranks reach node1 through SLURM_LAUNCH_NODE_IPADDR (the batch
script runs srun on the first node): the fallback docs/slurm.md describes. Checks: the job ends
COMPLETED; each rank's log says where it is ("rank 1 of 2 (local rank 0 of 1) on node2, via
slurm") and that it met the others through "tcp store" on node1's address with the port derived
from the job id (20000 + id % 10000); no rendezvous folder and no checkpoint was written; the
losses equal those of the same recipe under trainctl's local launcher.
Skips (exit 77) when Slurm cannot be started here. Run as: slurm_tcp_store.py TRAINCTL REPO_ROOT.
"""
import os
import re

import cli_resume_util as ru
import cli_util
import slurm_util
from cli_util import check

STEPS = 6
EXTRA = ["parallel.dp=2", "cluster.nodes=2", "cluster.shared_fs=false", "checkpoint.every_steps=0"]
SETS = [*cli_util.SMALL_MODEL, *ru.QUIET, f"training.steps={STEPS}", *EXTRA]


def body(binary, root):
    with cli_util.temp_dir("slurm-tcp-store") as tmp, \
            slurm_util.local_slurm(root, nodes=2) as cluster:
        run_dir = os.path.join(tmp, "submitted")
        job_id, log = slurm_util.submit(cluster, binary, root, SETS, run_dir)
        fields = cluster.wait_done(job_id, 90)
        text = slurm_util.read(log)
        check(fields["JobState"] == "COMPLETED", f"job {job_id} ended {fields['JobState']} "
              f"({fields.get('ExitCode')})\n{text}")
        port = 20000 + int(job_id) % 10000
        for rank, node in ((0, "node1"), (1, "node2")):
            rank_log = slurm_util.read(os.path.join(run_dir, "logs", f"rank_{rank}.log"))
            check(f"rank {rank} of 2 (local rank 0 of 1) on {node}, via slurm\n" in rank_log,
                  f"rank {rank}'s log does not say where it ran\n{rank_log}\n{text}")
            store = re.search(r"rendezvous tcp store (\S+):(\d+) \(first node node1 of "
                              r"node\[1-2\]", rank_log)
            check(store and int(store.group(2)) == port,
                  f"rank {rank} did not meet the others through the TCP store on port {port}\n"
                  f"{rank_log}")
        check(not os.path.exists(os.path.join(run_dir, "rendezvous")),
              f"a rendezvous folder was written in {run_dir}: {cli_util.tree(run_dir)}")
        check(not os.path.exists(os.path.join(run_dir, "checkpoints")),
              "a checkpoint was written although cluster.shared_fs is false")

        local_dir = os.path.join(tmp, "local")
        cli_util.run_ok(binary, ru.run_args(local_dir, STEPS, EXTRA), root)
        ru.check_same_run(local_dir, run_dir, STEPS, "TCP rendezvous under Slurm vs local")


if __name__ == "__main__":
    cli_util.main_wrapper(body)
