"""The patch of TensorFlow's ``BaseSession``, and the session internals the plugin needs.

``install(factory)`` wraps ``__init__``, ``run``, ``make_callable``,
``_make_callable_from_options``, ``partial_run_setup``, ``partial_run`` and ``close``: a
session created while installed gets ``factory(session, target, config)`` as its plugin (or
``None``), and each call goes to the plugin when there is one, to TensorFlow's own method
otherwise. With ``retarget``, a session's target and config are first replaced by
``retarget(target, config)`` (a cluster). Sessions opened inside ``plain_sessions()`` (fastt's
inner sessions) get neither. ``uninstall()`` puts TensorFlow's methods back.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
from tensorflow.python.client import pywrap_tf_session as _pywrap
from tensorflow.python.client import session as _session
from tensorflow.python.util import nest

BaseSession = _session.BaseSession
_WRAPPED = ("__init__", "run", "make_callable", "_make_callable_from_options",
            "partial_run_setup", "partial_run", "close")
_original: dict[str, Callable[..., Any]] = {}
_factory: Callable[..., Any] | None = None
_retarget: Callable[[str, Any], tuple[str, Any]] | None = None
_local = threading.local()
# targets of clusters that lost a server, each with the count of sessions created before
_forsaken: dict[bytes, int] = {}
_created = itertools.count()  # sessions created so far, numbering each


def installed() -> bool:
    return bool(_original)


def original(name: str) -> Callable[..., Any]:
    """TensorFlow's own ``BaseSession`` method ``name`` (patched or not)."""
    return _original.get(name) or getattr(BaseSession, name)


def install(factory: Callable[[Any, str, Any], Any],
            retarget: Callable[[str, Any], tuple[str, Any]] | None = None) -> None:
    global _factory, _retarget
    _factory, _retarget = factory, retarget
    if _original:
        return
    for name in _WRAPPED:
        _original[name] = BaseSession.__dict__[name]
        setattr(BaseSession, name, globals()["_" + name.strip("_")])


def uninstall() -> None:
    global _factory, _retarget
    for name, fn in _original.items():
        setattr(BaseSession, name, fn)
    _original.clear()
    _factory = _retarget = None


@contextlib.contextmanager
def plain_sessions() -> Iterator[None]:
    """Sessions created in this block (on this thread) are TensorFlow's, with no plugin."""
    before = getattr(_local, "plain", False)
    _local.plain = True
    try:
        yield
    finally:
        _local.plain = before


def plugin_of(sess: Any) -> Any:
    return sess.__dict__.get("_fastt")


# -- the wrappers ----------------------------------------------------------------------------
def _init(self: Any, target: str = "", graph: Any = None, config: Any = None) -> None:
    plain = getattr(_local, "plain", False)
    if _retarget is not None and not plain:
        target, config = _retarget(target, config)
    _original["__init__"](self, target, graph, config)
    self._fastt_created = next(_created)
    if _factory is not None and not plain:
        self._fastt = _factory(self, target, config)


def _run(self: Any, fetches: Any, feed_dict: Any = None, options: Any = None,
         run_metadata: Any = None) -> Any:
    p = plugin_of(self)
    if p is None:
        return _original["run"](self, fetches, feed_dict, options, run_metadata)
    return p.run(fetches, feed_dict, options, run_metadata)


def _make_callable(self: Any, fetches: Any, feed_list: Any = None,
                   accept_options: bool = False) -> Any:
    if plugin_of(self) is None:
        return _original["make_callable"](self, fetches, feed_list, accept_options)
    feeds = list(feed_list or ())

    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) != len(feeds):
            raise TypeError(f"expected {len(feeds)} feed values, got {len(args)}")
        if kwargs and not accept_options:
            raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")
        return self.run(fetches, dict(zip(feeds, args)), kwargs.get("options"),
                        kwargs.get("run_metadata"))
    return call


def _make_callable_from_options(self: Any, callable_options: Any) -> Any:
    p = plugin_of(self)
    if p is None:
        return _original["_make_callable_from_options"](self, callable_options)
    return p.make_callable(callable_options)


def _partial_run_setup(self: Any, fetches: Any, feeds: Any = None) -> Any:
    p = plugin_of(self)
    if p is None:
        return _original["partial_run_setup"](self, fetches, feeds)
    return p.partial_run_setup(fetches, feeds)


def _partial_run(self: Any, handle: Any, fetches: Any, feed_dict: Any = None) -> Any:
    p = plugin_of(self)
    if p is None:
        return _original["partial_run"](self, handle, fetches, feed_dict)
    return p.partial_run(handle, fetches, feed_dict)


def _close(self: Any) -> None:
    p = plugin_of(self)
    if p is not None:
        p.close()
    if getattr(self, "_fastt_created", -1) < _forsaken.get(getattr(self, "_target", b""),
                                                          -1):
        self._closed = True  # deleted when collected, with no CloseSession call
        return
    _original["close"](self)


def forsake(target: str) -> None:
    """Sessions open now on ``target``, a cluster that lost a server, close without
    TensorFlow's ``CloseSession`` call, which retries a lost master for a minute (and a live
    master's cleanup on the lost worker as long): each is marked closed and its C++ session
    deleted when it is collected, which calls no server. Sessions opened later (on the
    servers left) close as usual."""
    _forsaken[target.encode() if isinstance(target, str) else target] = next(_created)


# -- what the plugin uses ----------------------------------------------------------------------
@dataclass
class Request:
    """One ``run``'s fetches and feeds, resolved in the user's graph and named."""
    handler: Any  # TensorFlow's fetch handler: rebuilds the user's structure from values
    fetch_names: list[str]
    target_names: list[str]
    feeds: dict[str, np.ndarray]

    @property
    def signature(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        return (tuple(sorted(self.fetch_names)), tuple(sorted(self.target_names)),
                tuple(sorted(self.feeds)))


def _expand(feed: Any, value: Any) -> list[tuple[Any, Any]]:
    for tensor_type, _, feed_fn, _ in _session._REGISTERED_EXPANSIONS:
        if isinstance(feed, tensor_type):
            return list(feed_fn(feed, value))
    raise TypeError(f"{feed} in argument `feed_dict` has invalid type {type(feed).__name__!r}")


def request(graph: Any, fetches: Any, feed_dict: Any = None) -> Request:
    """Resolve ``fetches`` and ``feed_dict`` (every form ``Session.run`` accepts) in
    ``graph`` into names."""
    by_ref: dict[Any, np.ndarray] = {}
    feeds: dict[str, np.ndarray] = {}
    for feed, value in (nest.flatten_dict_items(feed_dict) if feed_dict else {}).items():
        for sub, sub_value in _expand(feed, value):
            t = graph.as_graph_element(sub, allow_tensor=True, allow_operation=False)
            if hasattr(sub_value, "to_numpy_array"):  # a TensorHandle
                sub_value = sub_value.to_numpy_array()
            arr = np.asarray(sub_value, dtype=t.dtype.as_numpy_dtype)
            if not t.get_shape().is_compatible_with(arr.shape):
                raise ValueError(f"Cannot feed value of shape {arr.shape} for Tensor {t.name}, "
                                 f"which has shape {t.get_shape()}")
            if not graph.is_feedable(t):
                raise ValueError(f"Tensor {t.name} may not be fed.")
            by_ref[t.ref()] = arr
            feeds[t.name] = arr
    handler = _session._FetchHandler(graph, fetches, by_ref)
    return Request(handler, [t.name for t in handler.fetches()],
                   [op.name for op in handler.targets()], feeds)


def run_elements(sess: Any, fetches: list[Any], targets: list[Any],
                 feeds: dict[Any, np.ndarray], options: Any = None,
                 run_metadata: Any = None) -> list[Any]:
    """Run graph elements of ``sess.graph`` (tensors, ops, feed tensor -> value) directly:
    TensorFlow's run without re-resolving a fetch structure."""
    options_buf = (_pywrap.TF_NewBufferFromString(options.SerializeToString())
                   if options is not None else None)
    meta_buf = _pywrap.TF_NewBuffer() if run_metadata is not None else None
    try:
        out = sess._do_run(None, targets, fetches, {t.ref(): v for t, v in feeds.items()},
                           options_buf, meta_buf)
        if meta_buf is not None:
            run_metadata.ParseFromString(bytes(_pywrap.TF_GetBuffer(meta_buf)))
        return out
    finally:
        for buf in (options_buf, meta_buf):
            if buf is not None:
                _pywrap.TF_DeleteBuffer(buf)


def build_results(sess: Any, req: Request, values: list[Any]) -> Any:
    return req.handler.build_results(sess, values)


def plain_callable(sess: Any, callable_options: Any) -> Any:
    """TensorFlow's callable for ``callable_options`` on ``sess``."""
    return BaseSession._Callable(sess, callable_options)


@contextlib.contextmanager
def unfinalized(graph: Any) -> Iterator[Any]:
    """Add ops to ``graph`` even when it is finalized (as ``MonitoredTrainingSession``
    leaves it); finalized again afterwards."""
    was = graph.finalized
    if was:
        graph._unsafe_unfinalize()
    try:
        with graph.as_default():
            yield graph
    finally:
        if was:
            graph.finalize()
