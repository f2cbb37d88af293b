"""Whether the simulator ranks a model's plans as they measure on the real testbed: Kendall's
tau-b of predicted against measured step times (``ranking_section`` of the report), and how
far the measurement itself lets any prediction go: how the plans' repeats order them
(``repeat_taus``), and how far the host moved between a plan's profile and its timed blocks
(``drift_table``).

Kendall, "A new measure of rank correlation", Biometrika 1938 (tau-b: ties counted);
Efron & Tibshirani, "An Introduction to the Bootstrap", 1993 (resampling the repeats).
"""
from __future__ import annotations

import math
import random
import statistics

CEILING_DRAWS = 1000  # bootstrap draws per model
PASS_TAU = 0.8  # the per-model tau the fidelity target asks for


def plan_blocks(r: dict, variants: list[str]) -> list[tuple[str, list[list[float]]]]:
    """A row's distinct plans: (first variant, the block times of each of its variants, in
    repeat order). Variants with the same placement, splits and replicas (``plan`` in the
    row) are one plan, measured by all their blocks; rows without ``plan`` count every
    variant, rows without ``times_s`` one block per variant (its step time)."""
    shown = [v for v in variants if v in r.get("predicted_s", {})]
    keys = r.get("plan") or {v: v for v in shown}
    groups: dict[str, list[str]] = {}
    for v in shown:
        groups.setdefault(keys.get(v, v), []).append(v)
    return [(vs[0], [list(r["times_s"][v]) if "times_s" in r else [r["step_s"][v]]
                     for v in vs]) for vs in groups.values()]


def _tau_b(pred: list[float], order: list[list[int]], told_apart: bool = False) -> float:
    """Kendall's tau-b from pairwise signs: ``pred`` the predicted times, ``order[i][j]`` the
    measured sign of plan i against plan j (0: a tie); with ``told_apart``, over only the
    pairs the measurement orders. O(n^2) in the plans."""
    n = len(pred)
    concordant = discordant = tied_pred = tied_meas = pairs = 0
    for i in range(n):
        for j in range(i + 1, n):
            p = (pred[i] > pred[j]) - (pred[i] < pred[j])
            m = order[i][j]
            if told_apart and m == 0:
                continue
            pairs += 1
            tied_pred += p == 0
            tied_meas += m == 0
            concordant += p * m > 0
            discordant += p * m < 0
    denom = ((pairs - tied_pred) * (pairs - tied_meas)) ** 0.5
    return (concordant - discordant) / denom if denom else math.nan


def _measured_order(times: list[list[float]], noise_aware: bool) -> list[list[int]]:
    """Pairwise signs of the plans' median measured times; with ``noise_aware``, a pair the
    plugin's decision rule cannot tell apart (``fastt.plugin.measure.compare`` on the block
    times: the 95% interval of the ratio of medians holds 1) is a tie."""
    from fastt.plugin.measure import compare
    med = [statistics.median(t) for t in times]
    out = [[0] * len(times) for _ in times]
    for i, a in enumerate(times):
        for j, b in enumerate(times):
            if i == j:
                continue
            sign = (med[i] > med[j]) - (med[i] < med[j])
            if noise_aware and min(len(a), len(b)) >= 3 and \
                    compare(b, a).verdict == "undecided":
                sign = 0
            out[i][j] = sign
    return out


def repeat_taus(blocks: list[list[list[float]]], draws: int = CEILING_DRAWS,
                seed: int = 0) -> list[float]:
    """The tau a perfect prediction would score against repeats of this measurement: the
    plans' measured medians ranked against the medians of bootstrap redraws of the repeats.
    A redraw picks repeats with replacement, the same ones for every plan, since a repeat's
    blocks ran side by side (the host's drift is shared). ``blocks[plan][variant][repeat]``;
    O(draws * plans^2)."""
    truth = [statistics.median(t for v in plan for t in v) for plan in blocks]
    repeats = min(len(v) for plan in blocks for v in plan)
    if repeats < 2:
        return []
    rng = random.Random(seed)
    taus = []
    for _ in range(draws):
        picked = [rng.randrange(repeats) for _ in range(repeats)]
        redrawn = [[v[k] for v in plan for k in picked] for plan in blocks]
        tau = _tau_b(truth, _measured_order(redrawn, False))
        if not math.isnan(tau):
            taus.append(tau)
    return taus


def ranking_section(real: dict, variants: list[str]) -> list[str]:
    """Per model, whether the simulator ranks its plans as they measure: Kendall's tau-b
    (ties counted) between predicted and measured step times; 1 is the same order. Beside it,
    the tau a perfect prediction would reach against a repeat of the measurement."""
    lines = ["### Ranking", "",
             "Kendall's tau-b between the predicted (contention-free and contended) and the "
             "measured step times of each model's distinct plans (1: the same order, 0: none; "
             "undefined when every prediction is equal). Variants that place and split every "
             "op the same way are one plan, measured over all their blocks. `noise-aware`: "
             "two plans whose blocks the plugin's decision rule cannot tell apart (95% "
             "interval of the ratio of medians around 1) count as a measured tie, since "
             "ordering them would rank noise. `told apart`: tau over only the pairs of plans "
             "the measurement orders (the noise-aware ties left out rather than counted: a "
             "prediction, never tied, cannot match a tie), with their number.", "",
             f"`perfect prediction`: what the measurement itself allows. The plans' measured "
             f"medians, taken as the prediction, ranked against {CEILING_DRAWS} bootstrap "
             f"redraws of the repeats (the same repeats for every plan, since they ran side by "
             f"side): the median tau, and how often it reaches {PASS_TAU}. A model where a "
             f"perfect prediction often falls short has plans closer together than the "
             f"measurement can order.", "",
             "| model | plans | tau (predicted) | tau (contended) | tau (predicted, "
             "noise-aware) | tau (predicted, told apart) | pairs told apart | tau (perfect "
             f"prediction) | perfect prediction >= {PASS_TAU} |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    taus: dict[tuple[str, bool, bool], list[float]] = {
        ("predicted_s", False, False): [], ("predicted_contended_s", False, False): [],
        ("predicted_s", True, False): [], ("predicted_s", True, True): []}
    passes: list[float] = []
    for r in real["rows"]:
        cells = []
        plans = plan_blocks(r, variants)
        times = [[t for v in b for t in v] for _, b in plans]
        for (key, noise_aware, apart), found in taus.items():
            pred = [r.get(key, {}).get(v) for v, _ in plans]
            if len(plans) < 2 or None in pred or len(set(pred)) < 2:
                cells.append("n/a")
                continue
            tau = _tau_b(pred, _measured_order(times, noise_aware), apart)
            if math.isnan(tau):
                cells.append("n/a")
                continue
            found.append(tau)
            cells.append(f"{tau:+.2f}")
        order = _measured_order(times, True) if len(plans) >= 2 else []
        cells.append(str(sum(order[i][j] != 0 for i in range(len(plans))
                             for j in range(i + 1, len(plans)))))
        ceiling = repeat_taus([b for _, b in plans]) if len(plans) >= 2 else []
        if ceiling:
            passes.append(sum(t >= PASS_TAU for t in ceiling) / len(ceiling))
            cells += [f"{statistics.median(ceiling):+.2f}", f"{100 * passes[-1]:.0f}%"]
        else:
            cells += ["n/a", "n/a"]
        lines.append(f"| {r['model']} | {len(plans)} | " + " | ".join(cells) + " |")
    if taus[("predicted_s", False, False)]:
        lines += ["", "Median tau: " + ", ".join(
            f"{label} {statistics.median(t):+.2f}" for label, t in
            zip(("predicted", "contended", "predicted, noise-aware", "predicted, told apart"),
                taus.values()) if t) + "."]
    if passes:
        lines += ["", f"A perfect prediction reaches tau {PASS_TAU} on every model at once in "
                      f"{100 * math.prod(passes):.0f}% of repeats of this measurement (the "
                      f"models' chances multiplied: each model is measured apart)."]
    return lines + [""]


def drift_table(real: dict) -> list[str]:
    """Per model, each calibrated plan's untraced step when it was profiled or first
    measured (what calibrates the cost models) against its median in the timed blocks
    minutes later: how far the host moved in between, which no prediction from the earlier
    sample can know."""
    rows = [r for r in real["rows"] if r.get("profiled_step_s")]
    if not rows:
        return []
    plans = [*rows[0]["profiled_step_s"], *rows[0].get("calibrated_step_s", {})]
    lines = ["Drift: each calibrated plan's untraced step (ms) when it was profiled (or, for a "
             "plan measured but not profiled, first measured), then its median in the timed "
             "blocks and the change; the predictions are calibrated on the first.", "",
             "| model | " + " | ".join(plans) + " |", "|---|" + "---:|" * len(plans)]
    changes = []
    for r in rows:
        cells = []
        sampled = {**r["profiled_step_s"], **r.get("calibrated_step_s", {})}
        for v in plans:
            then, now = sampled.get(v), r["step_s"].get(v)
            if not then or not now:
                cells.append("n/a")
                continue
            changes.append(now / then - 1)
            cells.append(f"{1e3 * then:.1f} -> {1e3 * now:.1f} ({100 * changes[-1]:+.0f}%)")
        lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    return lines + ["", f"Median change {100 * statistics.median(changes):+.0f}%, "
                        f"from {100 * min(changes):+.0f}% to {100 * max(changes):+.0f}%.", ""]


SITTINGS = ("data-parallel", "fastt", "fastt, replanned")  # real.py's ROUNDS, in its order


def sitting_ratios(r: dict) -> dict[str, tuple[float, float, float]] | None:
    """Per plan over both workers of a row calibrated in two sittings: its step over the one
    worker's beside it in each sitting, and in the timed blocks. The reference's records run
    in real.py's order (its profile, the three first sittings, the three second ones), and a
    sitting's step was scaled to the reference's level then (the median of its records so far
    but the profile's); plans run as the one worker's are left out. None for an older row."""
    refs, again = r.get("reference_step_s", []), r.get("recalibrated_step_s")
    if not again or len(refs) != 1 + 2 * len(SITTINGS):
        return None
    first = {**r.get("profiled_step_s", {}), **r.get("calibrated_step_s", {})}
    out = {}
    for k, name in enumerate(SITTINGS):
        if r["plan"][name] == r["plan"]["one worker"]:
            continue
        ratios = [step / statistics.median(refs[1:at + 1])
                  for step, at in ((first[name], k + 1), (again[name], k + 1 + len(SITTINGS)))]
        out[name] = (*ratios, r["step_s"][name] / r["step_s"]["one worker"])
    return out


def sittings_table(real: dict) -> list[str]:
    """Per model, each plan over both workers against the one worker beside it in its two
    calibration sittings and in its timed blocks: how far a sitting, and the median of the two
    that calibrates the plan, land from the blocks."""
    found = {r["model"]: s for r in real["rows"] if (s := sitting_ratios(r))}
    if not found:
        return []
    lines = ["Sittings: each plan over both workers as a ratio to the one worker's step beside "
             "it, in its first calibration sitting (when profiled or first measured), in its "
             "second (once every graph was started), and in its timed blocks.", "",
             "| model | plan | first | second | timed |", "|---|---|---:|---:|---:|"]
    off: dict[str, list[float]] = {"first": [], "second": [], "both": []}
    for model, plans in found.items():
        for name, (a, b, t) in plans.items():
            lines.append(f"| {model} | {name} | {a:.2f} | {b:.2f} | {t:.2f} |")
            for key, x in (("first", a), ("second", b), ("both", (a + b) / 2)):
                off[key].append(abs(x / t - 1))
    n = len(off["first"])
    lines += ["", f"From the timed blocks' ratio, over {n} plan{'s' * (n != 1)}: " +
              "; ".join(f"{label} median {100 * statistics.median(v):.1f}%, worst "
                        f"{100 * max(v):.1f}%, beyond 12% in {sum(x > 0.12 for x in v)}"
                        for label, v in (("first sitting", off["first"]),
                                         ("second sitting", off["second"]),
                                         ("their mean (the calibration)", off["both"]))) +
              ".", ""]
    return lines
