"""What the ``Controller`` asks of its TensorFlow side (``Backend``) and of the thread that
computes its plans (``Pending``) (no TensorFlow here)."""
from __future__ import annotations

from typing import Any, Callable, Protocol

from fastt.plugin.entry import Entry


class Backend(Protocol):
    def starting_strategy(self) -> str: ...
    def original_misfit(self) -> str: ...
    def profile(self, run_metadata: Any, untraced_s: float | None = None) -> None: ...
    def calibrate(self, strategy: Any | None, ordered: bool, untraced_s: float) -> None: ...
    def cost_change(self) -> float: ...
    def prepare_plan(self) -> None: ...
    def plan(self, name: str) -> Any: ...
    def predict(self, strategy: Any, fifo: bool = False) -> float: ...
    def activate(self, strategy: Any | None, ordered: bool = True) -> None: ...
    def record(self, entry: "Entry", history: list["Entry"]) -> str: ...
    def cached(self) -> tuple[Any | None, dict[str, float]] | None: ...
    def store(self, entry: "Entry | None", costs: dict[str, float]) -> None: ...


class Pending(Protocol):
    """A plan being computed (``Controller``'s ``run_plan`` returns one)."""
    def done(self) -> bool: ...
    def wait(self, timeout: float) -> bool: ...
    def result(self) -> Any: ...


class Done:
    """A plan computed on the calling thread (the default ``run_plan``)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        try:
            self._value, self._error = fn(), None
        except Exception as e:  # noqa: BLE001 - raised where the result is read
            self._value, self._error = None, e

    def done(self) -> bool:
        return True

    def wait(self, timeout: float) -> bool:
        return True

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value
