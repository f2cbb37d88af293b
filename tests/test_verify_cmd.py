"""``fastt verify SCRIPT``: an unchanged corpus script passes every check; a rewrite broken on
purpose (the step loses its control dependency on a variable's update) is caught, the
strategy rolled back, and the command fails naming the variable. Runs TensorFlow in the
processes it starts."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BROKEN = textwrap.dedent('''
    """fastt's graphs lose the step's control dependency on w2's update."""
    import numpy as np
    import tensorflow.compat.v1 as tf

    from fastt.adapters import engine

    tf.disable_v2_behavior()
    rewrite = engine.Engine.rewrite


    def dropped(self, strategy, order="none"):
        gd, graph = rewrite(self, strategy, order)
        if strategy is not None:
            for node in gd.node:
                kept = [i for i in node.input if not (i.startswith("^") and "update_w2" in i)]
                del node.input[:]
                node.input.extend(kept)
        return gd, graph


    engine.Engine.rewrite = dropped
    rng = np.random.RandomState(0)
    x = tf.placeholder(tf.float32, [None, 8])
    y = tf.placeholder(tf.float32, [None, 1])
    w1 = tf.Variable(rng.randn(8, 8).astype(np.float32), name="w1")
    w2 = tf.Variable(rng.randn(8, 1).astype(np.float32), name="w2")
    loss = tf.reduce_mean(tf.square(tf.matmul(tf.tanh(tf.matmul(x, w1)), w2) - y))
    train = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for step in range(60):
            xb = rng.randn(32, 8).astype(np.float32)
            sess.run(train, {x: xb, y: xb.sum(1, keepdims=True)})
''')


def verify(*argv, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTT")}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1",
               FASTT_CACHE="0")
    return subprocess.run([sys.executable, "-m", "fastt.cli", "verify", *argv], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=600)


def test_a_corpus_script_passes_every_check(tmp_path):
    p = verify("--json", str(tmp_path / "checks.json"),
               os.path.join(ROOT, "tests", "scripts", "ref_linear_regression.py"),
               "--out", str(tmp_path / "ckpt"), cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "final loss:" in p.stdout  # the script's own output goes through
    import json
    checks = json.loads((tmp_path / "checks.json").read_text())["checks"]
    assert checks and all(not c["verdict"] and not c["skipped"] for c in checks), checks
    assert all(t["relative"] is not None and t["relative"] <= t["tolerance"]
               for c in checks for t in c["tensors"])
    assert {"weight", "bias"} <= {t["name"] for t in checks[0]["tensors"]}


def test_a_broken_rewrite_is_caught(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(BROKEN)
    p = verify(str(script), cwd=tmp_path)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-3000:]
    assert "DIFFER; largest" in p.stdout and "variable w2" in p.stdout, p.stdout
    assert "training continues on the original graph" in p.stderr
