"""Plain-text summary of cost models, for the terminal."""
from __future__ import annotations

from collections import defaultdict

from fastt.costs import CostModels


def _short(device: str) -> str:
    return device.replace("/job:localhost/replica:0/task:0", "").replace("/replica:0", "")


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def format_cost_models(models: CostModels, top: int = 5) -> str:
    """Per device: ops measured, busy time and the slowest ops; per pair: the link fit."""
    lines = []
    by_dev: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for (op, dev), t in models.compute.means().items():
        by_dev[dev].append((t, op))
    lines.append("compute model (mean seconds per step, by op and device):")
    for dev in sorted(by_dev):
        entries = sorted(by_dev[dev], reverse=True)
        busy = sum(t for t, _ in entries)
        lines.append(f"  {_short(dev)}: {len(entries)} ops, busy {busy * 1e3:.2f} ms")
        for t, op in entries[:top]:
            lines.append(f"    {t * 1e3:8.3f} ms  {op}")
    change = models.compute.relative_change()
    lines.append(f"  relative change over the last update: "
                 f"{'n/a' if change == float('inf') else f'{change:.1%}'}")
    lines.append("communication model (seconds = intercept + bytes / bandwidth; past a knee, "
                 "more per byte):")
    fits = models.comm.fits()
    if not fits:
        lines.append("  no device pair measured")
    for (src, dst), f in sorted(fits.items()):
        lines.append(f"  {_short(src)} -> {_short(dst)}: intercept {f.intercept * 1e6:.1f} us, "
                     f"bandwidth {f.bandwidth_bytes_per_s / 1e9:.2f} GB/s, R^2 {f.r2:.3f}, "
                     f"{f.samples} samples" + (
                         f", past {_mib(f.knee)} {f.extra * 1e9:.2f} ns more per byte"
                         if f.extra > 0 else ""))
    mem = models.memory
    lines.append(f"memory model: {len(mem.persistent)} variables, "
                 f"{_mib(mem.total_persistent())} persistent, "
                 f"{_mib(sum(mem.outputs.values()))} of op outputs")
    return "\n".join(lines)
