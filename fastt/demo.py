"""The demo: profile a small CNN's training over 2 logical CPU devices, print its cost models."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import tensorflow as tf

from fastt import zoo
from fastt.adapters.engine import Engine
from fastt.costs import CostModels
from fastt.costs.summary import format_cost_models
from fastt.sched.sim.problem import Device

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
    config = _tf1.ConfigProto(device_count={"CPU": devices})
    engine = Engine(model.graph, [Device(n) for n in names], [model.train_op.name],
                    config=config, name="small_cnn")
    with _tf1.Session(graph=model.graph, config=config) as sess:
        sess.run(model.init)
        profiles = engine.trace(sess, model.feed_dict(), steps=steps, warmup=1)
    engine.probe()
    models = engine.models
    assert models is not None
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "cost_models.json")
    models.save(path)
    coverage = min(p.coverage for p in profiles)
    return DemoResult(models, coverage, len(engine.ir), path)
