"""Published, measured V100 training throughputs and interconnect facts, with their sources:
what the simulated GPU testbed is held against. The figures live in ``published_v100.json``
(each with the table row or sentence it was read from); this prints them as the report's
section.

    python benchmarks/published.py [--out benchmarks/results]

Writes published_v100.md.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "published_v100.json")


def load(path: str = DATA) -> dict[str, Any]:
    """The published figures, as stored."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The throughput entries by model, source, precision and GPU count."""
    return sorted(doc["throughput"], key=lambda e: (e["model"], e["source"], e["precision"],
                                                    e["gpus"], e.get("batch_per_gpu") or 0))


def _cell(v: Any) -> str:
    return "?" if v is None else str(v).replace("|", "\\|")


def markdown(doc: dict[str, Any], heading: str = "#") -> str:
    """The section: throughputs by model, the interconnect facts, the sources."""
    lines = [f"{heading} Published V100 measurements", "",
             "Training throughputs measured on V100 GPUs, as their sources published them; the "
             "simulated GPU testbed is held against these. " + doc["quote_convention"], "",
             "| model | GPUs | precision | batch per GPU | throughput | machine | source |",
             "| --- | ---: | --- | ---: | ---: | --- | --- |"]
    for e in rows(doc):
        lines.append(f"| {e['model']} | {e['gpus']} | {e['precision']} | "
                     f"{_cell(e.get('batch_per_gpu'))} | {e['value']:g} {e['unit']} | "
                     f"{_cell(e.get('machine'))} | {e['source']} |")
    lines += ["", f"{heading}# Interconnects", "", "| fact | value | source | quote |",
              "| --- | --- | --- | --- |"]
    for t in doc["topology"]:
        lines.append(f"| {_cell(t['fact'])} | {_cell(t['value'])} {_cell(t.get('unit', ''))} | "
                     f"{t['source']} | {_cell(t['quote'])} |")
    lines += ["", f"{heading}# Sources", "", "| id | what | where |", "| --- | --- | --- |"]
    for k, s in doc["sources"].items():
        lines.append(f"| {k} | {_cell(s['title'])}: {_cell(s['what'])} | "
                     f"{_cell(s['url_or_repo_path'])} |")
    lines += ["", f"{heading}# Not found", ""] + [f"- {n}" for n in doc["not_found"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    with open(os.path.join(args.out, "published_v100.md"), "w", encoding="utf-8") as f:
        f.write(markdown(load()))


if __name__ == "__main__":
    main()
