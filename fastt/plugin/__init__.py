"""The session plugin: ``FASTT=1`` and an unchanged training script run fastt's strategies.

``install()`` (called by the start-up hook when TensorFlow is imported with ``FASTT=1``, or
directly) patches ``BaseSession`` so that every session gets a ``SessionPlugin``;
``uninstall()`` restores TensorFlow's methods.
"""
from __future__ import annotations

import logging
import sys
from typing import Any

from fastt.plugin.settings import Settings, SettingsError, from_env

__all__ = ["install", "uninstall", "Settings", "SettingsError", "from_env"]
log = logging.getLogger("fastt")


def install(settings: Settings | None = None) -> None:
    """Patch TensorFlow's sessions with ``settings`` (default: from the environment)."""
    from tf_patches import error_messages, session_hook

    settings = settings or from_env()
    _log_to_stderr(settings.log_level)

    def plugin(sess: Any, target: str, config: Any) -> Any:
        # Imported at the first session, not here: this runs while ``import tensorflow``
        # finishes, possibly inside a fastt module that is still importing.
        from fastt.plugin.runtime import SessionPlugin
        return SessionPlugin(sess, target, config, settings)

    def retarget(target: str, config: Any) -> tuple[str, Any]:
        from fastt.plugin.remote import retarget  # imports TensorFlow: at the first session
        assert settings.cluster is not None  # installed only with a cluster
        return retarget(settings.cluster, target, config, settings.elastic != "off")
    session_hook.install(plugin, retarget if settings.cluster is not None else None)
    error_messages.install()  # a gRPC worker's abort quotes its fed tensors
    log.debug("fastt: sessions patched (%s)", settings)


def uninstall() -> None:
    from tf_patches import error_messages, session_hook
    session_hook.uninstall()
    error_messages.uninstall()


def _log_to_stderr(level: str) -> None:
    """The plugin talks to the person running the script: on stderr, unless the script
    configured the ``fastt`` logger itself; when its lines also reach a handler the script
    configured (the root logger's, absl's), only that one prints them, so each line is
    printed once."""
    if not any(not isinstance(h, logging.NullHandler) for h in log.handlers):
        h = _Fallback()
        h.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(h)
    log.setLevel(level)


class _Fallback(logging.StreamHandler):  # type: ignore[type-arg]
    """stderr (as it is at each line), when no handler above the ``fastt`` logger takes the
    line; decided per line, since scripts configure logging after importing TensorFlow."""

    def emit(self, record: logging.LogRecord) -> None:
        logger: logging.Logger | None = log.parent if log.propagate else None
        while logger is not None:
            if any(not isinstance(h, logging.NullHandler) and record.levelno >= h.level
                   for h in logger.handlers):
                return
            logger = logger.parent if logger.propagate else None
        self.stream = sys.stderr
        super().emit(record)
