"""The benchmark model zoo: which models, at which sizes, for the simulated and real testbeds."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Model:
    """A zoo model at benchmark size: ``zoo.build(zoo_name, batch_size=B, **kwargs)``."""
    name: str  # as reported
    zoo_name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    batch: int = 32  # simulated: the global batch (strong scaling); real: the batch
    per_device_batch: int = 16  # simulated weak scaling: the batch of each device

    def build(self, batch_size: int | None = None) -> Any:
        from fastt import zoo
        return zoo.build(self.zoo_name, batch_size=batch_size or self.batch, **self.kwargs)


TRANSFORMER_BASE = {"layers": 6, "d_model": 512, "heads": 8, "d_ff": 2048, "seq_len": 128,
                    "vocab": 32000}

# The paper's models on simulated V100s (global batches chosen to fill one 16 GB GPU).
SIMULATED = [
    Model("vgg_19", "vgg_19", {"image_size": 224}, 64, 32),
    Model("resnet_200", "resnet_v2_200", {"image_size": 224}, 32, 16),
    Model("alexnet", "alexnet_v2", {"image_size": 224}, 256, 128),
    Model("lenet", "lenet", {}, 256, 128),
    Model("inception_v3", "inception_v3", {"image_size": 299}, 64, 32),
    Model("transformer", "transformer", TRANSFORMER_BASE, 32, 16),
    Model("bert_large", "bert", {"layers": 24, "seq_len": 64}, 16, 8),
    Model("gnmt", "gnmt", {"layers": 4, "hidden": 1024, "src_len": 20, "tgt_len": 20,
                           "src_vocab": 32000, "tgt_vocab": 32000}, 64, 32),
    Model("rnnlm", "lstm_lm", {"layers": 2, "hidden": 1024, "seq_len": 20, "vocab": 10000},
          64, 32),
]
# Graphs of about 40k ops, larger than any of the paper's, timed by ``plan_time.py`` as a user's
# own graph is planned: saved as a MetaGraphDef, then ``fastt plan FILE`` (issue [search]).
HELD_OUT = [
    Model("bert_50", "bert", {"layers": 50, "seq_len": 64}, 16, 8),
]
HELD_OUT_DEVICES = ("2x8xV100", "16xV100")
SIMULATED_QUICK = [
    Model("lenet", "lenet", {}, 256, 128),
    Model("alexnet", "alexnet_v2", {"image_size": 224}, 128, 64),
    Model("resnet_50", "resnet_v2_50", {"image_size": 224}, 32, 16),
]

# Small enough for one CPU core per worker: a step takes tens to hundreds of milliseconds.
REAL = [
    Model("lenet", "lenet", {}, 64),
    Model("alexnet", "alexnet_v2", {"image_size": 96}, 16),
    Model("vgg_like", "vgg_like", {}, 32),
    Model("vgg_mixed", "vgg_mixed", {}, 32),
    Model("inception_like", "inception_like", {}, 16),
    Model("transformer_layer", "transformer", {"layers": 1, "d_model": 256, "heads": 4,
                                               "d_ff": 1024, "seq_len": 32, "vocab": 1000}, 16),
    Model("lstm_lm", "lstm_lm", {"layers": 2, "hidden": 256, "seq_len": 10, "vocab": 1000},
          32),
]
REAL_QUICK = [REAL[0], REAL[3]]


def pick(models: list[Model], names: list[str] | None) -> list[Model]:
    """``models`` restricted to ``names`` (all when None); an unknown name is an error."""
    if not names:
        return models
    known = {m.name: m for m in models}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown models {unknown}; choose from {sorted(known)}")
    return [known[n] for n in names]
