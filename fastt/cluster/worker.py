"""One TensorFlow gRPC server of a cluster: ``python -m fastt.cluster.worker``.

Prints ``ready <address>`` on stdout once the server listens, then serves until killed.
"""
from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fastt worker", description=__doc__)
    parser.add_argument("--cluster", required=True,
                        help="comma-separated host:port list of all workers, in task order")
    parser.add_argument("--index", type=int, required=True, help="this worker's task index")
    parser.add_argument("--job", default="worker", help="job name (default: worker)")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads of this worker (default: 1)")
    args = parser.parse_args(argv)
    addresses = [a.strip() for a in args.cluster.split(",") if a.strip()]
    if not 0 <= args.index < len(addresses):
        parser.error(f"--index {args.index} is outside the cluster's {len(addresses)} workers")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=args.threads,
                                      inter_op_parallelism_threads=2)
    server = tf.distribute.Server(tf.train.ClusterSpec({args.job: addresses}), job_name=args.job,
                                  task_index=args.index, config=config, start=True)
    print(f"ready {addresses[args.index]}", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
