"""``FASTT_VERIFY`` over the zoo: each model trained by the session plugin on 2 logical CPU
devices, every strategy's first step checked against the original graph's; the largest
relative difference per strategy, against the tolerance of ``fastt.plugin.verify``.

    python benchmarks/verify_zoo.py [--out results/verify_zoo.json] [MODEL ...]

Each model runs in a process of its own (``--one MODEL``), float32, at a small batch.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The paper's models as the zoo has them, small inputs (what the rewriter's tests train).
MODELS = {
    "mlp": ("sgd", {"batch_size": 8}),
    "small_cnn": ("momentum", {"batch_size": 8, "batch_norm": True}),
    "lenet": ("adam", {"batch_size": 8}),
    "alexnet_v2": ("sgd", {"batch_size": 4, "image_size": 96}),
    "vgg_16": ("momentum", {"batch_size": 4, "image_size": 32}),
    "inception_v3": ("adam", {"batch_size": 4, "image_size": 107}),
    "resnet_v2_50": ("momentum", {"batch_size": 4, "image_size": 64, "learning_rate": 1e-3}),
    "transformer": ("adam", {"layers": 1, "batch_size": 4}),
    "lstm_lm": ("sgd", {"batch_size": 8}),
}
STEPS = 30
_VERIFIED = re.compile(r"verified the first step of (\S+) against the original graph: (.*)")


def one(name: str) -> dict[str, object]:
    """Train ``name`` under the plugin with ``FASTT_VERIFY``; what each check said."""
    import tensorflow as tf

    import fastt.plugin
    from fastt import zoo
    from fastt.plugin.settings import Settings, parse_devices
    tf.compat.v1.disable_eager_execution()
    opt, kwargs = MODELS[name]
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())
    logging.getLogger("fastt").addHandler(Keep())
    devices, cpus = parse_devices("cpu:2")
    fastt.plugin.install(Settings(enabled=True, devices=devices, logical_cpus=cpus,
                                  warmup_steps=2, profile_steps=1, measure_steps=3,
                                  measure_seconds=0.0, max_rounds=2, verify=True))
    m = zoo.build(name, opt=opt, **kwargs)
    began = time.perf_counter()
    with tf.compat.v1.Session(graph=m.graph) as sess:
        sess.run(m.init)
        for _ in range(STEPS):
            sess.run(m.train_op, m.feed_dict())
    checks = [{"strategy": s, "said": said} for s, said in
              (mm.groups() for mm in map(_VERIFIED.search, records) if mm)]
    failed = [r for r in records if "beyond reassociation" in r]
    return {"model": name, "optimizer": opt, "checks": checks, "failed": failed,
            "seconds": round(time.perf_counter() - began, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one)))
        return 0
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    results = []
    for name in args.models:
        p = subprocess.run([sys.executable, __file__, "--one", name], env=env,
                           capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            results.append({"model": name, "error": p.stderr.strip().splitlines()[-1:]})
        else:
            results.append(json.loads(p.stdout.strip().splitlines()[-1]))
        r = results[-1]
        print(f"{name:14s} " + ("; ".join(f"{c['strategy']}: {c['said']}"
                                          for c in r.get("checks", [])) or
                                f"no check ({r.get('error') or 'no strategy activated'})"),
              flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"steps": STEPS, "results": results}, f, indent=1)
    return 0 if all(r.get("checks") and not r.get("failed") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
