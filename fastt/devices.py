"""Device names: parsing, canonical form, device type. No TensorFlow import.

TensorFlow writes full names (``/job:worker/replica:0/task:1/device:CPU:0``) in RunMetadata and
short ones (``/cpu:0``, ``/device:GPU:1``) in user code; fastt keys its cost models by the full
form so that the two meet.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from fastt.errors import FasttError

_PART = re.compile(r"^(job|replica|task|device):(.+)$", re.IGNORECASE)
_SHORT = re.compile(r"^(cpu|gpu|tpu|xla_cpu|xla_gpu):(\d+)$", re.IGNORECASE)
_DEVICE = re.compile(r"^([A-Za-z_]+):(\d+)$")


@dataclass(frozen=True, slots=True)
class DeviceName:
    job: str = "localhost"
    replica: int = 0
    task: int = 0
    type: str = "CPU"
    index: int = 0

    def __str__(self) -> str:
        return (f"/job:{self.job}/replica:{self.replica}/task:{self.task}"
                f"/device:{self.type}:{self.index}")

    @property
    def host(self) -> tuple[str, int, int]:
        """(job, replica, task): devices that share it live in one process."""
        return (self.job, self.replica, self.task)


def parse(name: str, default_job: str = "localhost") -> DeviceName:
    """Parse a full or short TensorFlow device name; raises FasttError naming it if invalid."""
    fields: dict[str, object] = {"job": default_job}
    parts = [p for p in name.strip().split("/") if p]
    if not parts:
        raise FasttError(f"invalid device name {name!r}: empty")
    for part in parts:
        short = _SHORT.match(part)
        if short:
            fields["type"], fields["index"] = short.group(1).upper(), int(short.group(2))
            continue
        m = _PART.match(part)
        if not m:
            raise FasttError(f"invalid device name {name!r}: cannot read {part!r}")
        key, value = m.group(1).lower(), m.group(2)
        if key == "device":
            dm = _DEVICE.match(value)
            if not dm:
                raise FasttError(f"invalid device name {name!r}: cannot read {part!r}")
            fields["type"], fields["index"] = dm.group(1).upper(), int(dm.group(2))
        elif key == "job":
            fields["job"] = value
        else:
            try:
                fields[key] = int(value)
            except ValueError:
                raise FasttError(f"invalid device name {name!r}: {key} must be a number") from None
    return DeviceName(**fields)  # type: ignore[arg-type]


def canonical(name: str, default_job: str = "localhost") -> str:
    """``'/cpu:1'`` -> ``'/job:localhost/replica:0/task:0/device:CPU:1'``."""
    return str(parse(name, default_job))


def device_type(name: str) -> str:
    """``'CPU'``, ``'GPU'``... of a device name."""
    return parse(name).type


def same_process(a: str, b: str) -> bool:
    return parse(a).host == parse(b).host


def link_class(src: str, dst: str) -> tuple[str, str, bool] | None:
    """What a link between two devices of one process is like, whichever the devices: the
    two device types (in either order); None between processes, where each pair is its own
    (another task may be another machine)."""
    a, b = parse(src), parse(dst)
    if a.host != b.host:
        return None
    x, y = sorted((a.type, b.type))
    return (x, y, True)


def short(name: str) -> str:
    """A name for people: ``CPU:1`` in the local process, ``worker:1/GPU:0`` elsewhere
    (the name itself when it is not a device name)."""
    try:
        d = parse(name)
    except FasttError:
        return name
    if (d.job, d.replica, d.task) == ("localhost", 0, 0):
        return f"{d.type}:{d.index}"
    return f"{d.job}:{d.task}/{d.type}:{d.index}"
