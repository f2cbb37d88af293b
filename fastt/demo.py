"""The demo: profile a small CNN's training over 2 logical CPU devices, print its cost models."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import tensorflow as tf

from fastt import zoo
from fastt.adapters.probe import probe_devices
from fastt.adapters.runner import cost_models_from, profile_steps
from fastt.adapters.tf_import import from_tf_graph
from fastt.costs import CostModels
from fastt.costs.summary import format_cost_models

log = logging.getLogger("fastt")
_tf1 = tf.compat.v1


@dataclass
class DemoResult:
    models: CostModels
    coverage: float
    ops: int
    out_path: str

    def summary(self) -> str:
        return (f"small_cnn training graph: {self.ops} ops over 2 logical CPU devices, "
                f"coverage {self.coverage:.1%} of measured compute time attributed to its ops\n"
                + format_cost_models(self.models) + f"\ncost models written to {self.out_path}")


def run(out_dir: str = "fastt-demo-out", steps: int = 5, devices: int = 2) -> DemoResult:
    """Build, place (layers round-robin), profile ``steps`` steps, probe links, save JSON."""
    _tf1.disable_eager_execution()
    names = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(devices)]
    model = zoo.build("small_cnn", devices=names)
    graph = from_tf_graph(model.graph, name="small_cnn")
    config = _tf1.ConfigProto(device_count={"CPU": devices})
    with _tf1.Session(graph=model.graph, config=config) as sess:
        sess.run(model.init)
        profiles = profile_steps(sess, graph, model.train_op, model.feed_dict(), steps=steps)
    models = cost_models_from(graph, profiles)
    probe_devices(models, names, config=config)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "cost_models.json")
    models.save(path)
    coverage = min(p.coverage for p in profiles)
    return DemoResult(models, coverage, len(graph), path)
