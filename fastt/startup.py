"""The start-up hook: ``fastt.pth`` (installed into site-packages) calls ``arm()`` when
``FASTT`` is set to anything but an off value. Then, as soon as ``import tensorflow``
finishes, ``fastt.plugin.install()`` patches its sessions. Nothing else is imported at
start-up but this module and the small ``fastt`` package, so Python starts about as fast as
without fastt.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        import fastt.plugin
        fastt.plugin.install()  # a bad FASTT_* value raises here, naming the variable

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def arm() -> None:
    """Patch TensorFlow's sessions when it is imported (now, if it already is)."""
    if "tensorflow" in sys.modules:
        import fastt.plugin
        fastt.plugin.install()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
