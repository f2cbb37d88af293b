"""TensorFlow gRPC clusters: local worker processes pinned to cores, and remote workers."""
from fastt.cluster.local import LocalCluster
from fastt.cluster.spec import ClusterSpec, Task, from_tf_config, parse_cluster_spec

__all__ = ["LocalCluster", "ClusterSpec", "Task", "from_tf_config", "parse_cluster_spec"]
