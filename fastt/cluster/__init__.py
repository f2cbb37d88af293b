"""TensorFlow gRPC clusters: local worker processes pinned to cores, and remote workers."""
from fastt.cluster.local import LocalCluster, parse_cluster_spec

__all__ = ["LocalCluster", "parse_cluster_spec"]
