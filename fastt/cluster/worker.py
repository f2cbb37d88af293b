"""One TensorFlow gRPC server of a cluster: ``python -m fastt.cluster.worker``.

Prints ``ready <address>`` on stdout once the server listens, then serves until killed.
"""
from __future__ import annotations

import argparse
import os
import sys

from fastt.cluster.spec import check_job, parse_cluster_spec
from fastt.errors import ClusterError


def addresses(cluster: str, index: int, job: str, threads: int) -> list[str]:
    """The cluster's addresses in task order, once ``--cluster``, ``--index``, ``--job`` and
    ``--threads`` are checked; ``ClusterError`` naming the option that is wrong."""
    check_job("--job", job)
    found = [t.address for t in parse_cluster_spec(cluster, job, f"--cluster {cluster!r}").tasks]
    if not 0 <= index < len(found):
        raise ClusterError(f"--index {index} is outside the cluster's {len(found)} "
                           f"worker(s) (0 to {len(found) - 1})")
    if threads < 1:
        raise ClusterError(f"--threads {threads}: expected a whole number >= 1")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fastt worker", description=__doc__)
    parser.add_argument("--cluster", required=True,
                        help="comma-separated host:port list of all workers, in task order")
    parser.add_argument("--index", type=int, required=True, help="this worker's task index")
    parser.add_argument("--job", default="worker", help="job name (default: worker)")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads of this worker (default: 1)")
    args = parser.parse_args(argv)
    try:
        found = addresses(args.cluster, args.index, args.job, args.threads)
    except ClusterError as e:
        parser.error(str(e))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=args.threads,
                                      inter_op_parallelism_threads=2)
    server = tf.distribute.Server(tf.train.ClusterSpec({args.job: found}), job_name=args.job,
                                  task_index=args.index, config=config, start=True)
    print(f"ready {found[args.index]}", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
