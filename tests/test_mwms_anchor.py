"""The MultiWorkerMirroredStrategy anchor of the real testbed trains the same networks as
fastt does: its tf-keras model of every real-testbed model has the zoo graph's weights, to
the last parameter (a smaller anchor would make fastt look slow, a larger one fast)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = """
import numpy as np
import tensorflow as tf
from benchmarks import models as zoo_models
from benchmarks.mwms import SKIPPED, keras_model
assert not SKIPPED, SKIPPED
for m in zoo_models.REAL:
    net = keras_model(m)
    built = m.build()
    with built.graph.as_default():
        zoo = sum(int(np.prod(v.shape)) for v in tf.compat.v1.trainable_variables())
    print(m.name, net.count_params(), zoo)
"""


def test_every_real_model_has_an_anchor_with_the_zoo_graphs_parameters():
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [line.split() for line in p.stdout.splitlines()]
    assert len(rows) == 7
    for name, keras_params, zoo_params in rows:
        assert keras_params == zoo_params, name
