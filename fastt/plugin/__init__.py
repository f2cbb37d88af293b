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
    from tf_patches import session_hook

    settings = settings or from_env()
    _log_to_stderr(settings.log_level)

    def plugin(sess: Any, target: str, config: Any) -> Any:
        # Imported at the first session, not here: this runs while ``import tensorflow``
        # finishes, possibly inside a fastt module that is still importing.
        from fastt.plugin.runtime import SessionPlugin
        return SessionPlugin(sess, target, config, settings)

    def retarget(target: str, config: Any) -> tuple[str, Any]:
        from fastt.plugin.remote import retarget  # imports TensorFlow: at the first session
        return retarget(settings.cluster, target, config)
    session_hook.install(plugin, retarget if settings.cluster is not None else None)
    log.debug("fastt: sessions patched (%s)", settings)


def uninstall() -> None:
    from tf_patches import session_hook
    session_hook.uninstall()


def _log_to_stderr(level: str) -> None:
    """The plugin talks to the person running the script: on stderr, unless the script
    configured the ``fastt`` logger itself."""
    if not any(not isinstance(h, logging.NullHandler) for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(h)
    log.setLevel(level)
