"""tf-slim's reference nets as training graphs (needs the ``tf-slim`` and ``tf-keras`` packages)."""
from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable

import tensorflow as tf

from fastt.errors import FasttError
from fastt.zoo import TrainingGraph, classifier, register


def _slim() -> Any:
    from tf_patches import slim_compat
    slim_compat.install()
    try:
        import tf_slim
    except ImportError as e:
        raise FasttError("this model needs tf-slim and tf-keras: "
                         "pip install tf-slim && pip install --no-deps tf-keras") from e
    return tf_slim


def _net(name: str, module: str, fn: str, default_size: int,
         scope: Callable[[Any], Any] | None = None, min_size: int = 0,
         small: bool = False) -> None:
    """Register tf_slim.nets.<module>.<fn>; inputs smaller than ``min_size`` are refused.
    With ``small``, images under the default size build through ``slim_compat.small_inputs``
    (VGG's and AlexNet's classifiers are VALID convolutions sized for 224x224)."""
    @register(name)
    def build(batch_size: int = 4, image_size: int = default_size, classes: int = 10,
              opt: str = "momentum", seed: int = 0, dtype: Any = tf.float32,
              learning_rate: float = 0.01) -> TrainingGraph:
        slim = _slim()
        mod = importlib.import_module(f"tf_slim.nets.{module}")

        if image_size < min_size:
            raise FasttError(f"{name} needs images of at least {min_size}x{min_size}, "
                             f"got {image_size}")

        def body(x: Any) -> Any:
            from tf_patches import slim_compat
            net = getattr(mod, fn)
            shrink = slim_compat.small_inputs() if small and image_size < default_size \
                else contextlib.nullcontext()
            with shrink:
                if scope is None:
                    logits = net(x, num_classes=classes)[0]
                else:
                    with slim.arg_scope(scope(mod)):
                        logits = net(x, num_classes=classes)[0]
            # Some nets keep 1x1 spatial dims on their logits.
            return logits if logits.shape.rank == 2 else tf.reshape(logits, [batch_size, classes])
        return classifier(name, body, (image_size, image_size, 3), classes, batch_size, opt, seed,
                          dtype, learning_rate)


_net("vgg_16", "vgg", "vgg_16", 224, min_size=32, small=True)
_net("vgg_19", "vgg", "vgg_19", 224, min_size=32, small=True)
_net("alexnet_v2", "alexnet", "alexnet_v2", 224, min_size=96, small=True)
_net("inception_v3", "inception_v3", "inception_v3", 299, min_size=107)
_net("resnet_v1_50", "resnet_v1", "resnet_v1_50", 224, lambda m: m.resnet_arg_scope())
_net("resnet_v1_152", "resnet_v1", "resnet_v1_152", 224, lambda m: m.resnet_arg_scope())
_net("resnet_v2_50", "resnet_v2", "resnet_v2_50", 224, lambda m: m.resnet_arg_scope())
_net("resnet_v2_152", "resnet_v2", "resnet_v2_152", 224, lambda m: m.resnet_arg_scope())
_net("resnet_v2_200", "resnet_v2", "resnet_v2_200", 224, lambda m: m.resnet_arg_scope())
