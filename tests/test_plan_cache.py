"""The plan cache and the strategy documents it stores (no TensorFlow): a strategy survives
JSON whole; an entry is found by its parts, missed with the part that changed, never read
from a directory others can write to; ``fastt cache list|clear``."""
import json
import os

import pytest

from fastt.cli import main
from fastt.ir.ops import op_to_dict
from fastt.plugin.cache import PARTS, CacheError, PlanCache, key_of
from fastt.sched import serial
from fastt.sched.sim.device_spec import parse
from fastt.sched.registry import names
from fastt.passes.splitting import Split
from fastt.sched.strategy import plan
from tests.helpers import training_graph
from tests.helpers import costs


def planned():
    ds = parse("2xV100")
    g = training_graph(B=8)
    c = costs(ds, g)
    out = [plan(g, ds.devices, c, name) for name in names()]
    out.append(plan(g, ds.devices, c, "os-dpos", splits=[Split("h", "rows", 2)]))
    return out


@pytest.mark.parametrize("s", planned(), ids=lambda s: f"{s.name}-{len(s.splits)}")
def test_a_strategy_survives_its_json_document_whole(s):
    doc = json.loads(json.dumps(serial.to_document(s)))
    back = serial.from_document(doc)
    assert back.to_dict() == s.to_dict()
    assert [op_to_dict(o) for o in back.graph] == [op_to_dict(o) for o in s.graph]
    assert [o.node_def for o in back.graph] == [o.node_def for o in s.graph]
    assert back.graph.meta == s.graph.meta and back.splits == s.splits


PARTS_A = {p: f"{p}-a" for p in PARTS}


def test_an_entry_is_found_by_its_parts(tmp_path):
    c = PlanCache(str(tmp_path / "cache"))
    assert c.lookup(PARTS_A, "/x/train.py") == (None, "")  # nothing yet, nothing said
    path = c.store(PARTS_A, "/x/train.py", {"strategy": None, "speedup": None})
    assert os.path.basename(path) == key_of(PARTS_A) + ".json"
    hit, why = c.lookup(dict(PARTS_A), "/x/train.py")
    assert hit is not None and why == "" and hit.doc["script"] == "/x/train.py"
    assert oct(os.stat(tmp_path / "cache").st_mode & 0o777) == "0o700"
    assert not [f for f in os.listdir(tmp_path / "cache") if f.endswith(".tmp")]


@pytest.mark.parametrize("part, said", [("graph", "its training graph"),
                                        ("feeds", "the shapes it feeds"),
                                        ("devices", "its devices")])
def test_a_changed_part_misses_and_is_named(tmp_path, part, said):
    c = PlanCache(str(tmp_path))
    c.store(PARTS_A, "/x/train.py", {"strategy": None})
    changed = {**PARTS_A, part: "other"}
    hit, why = c.lookup(changed, "/x/train.py")
    assert hit is None and said in why
    assert [w for w in ("training graph", "feeds", "devices") if w in why] == \
        [said.split()[-1] if part != "graph" else "training graph"]
    assert c.lookup(changed, "/y/other.py") == (None, "")  # another script: nothing said


def test_a_directory_others_can_write_to_is_not_read(tmp_path):
    c = PlanCache(str(tmp_path))
    c.store(PARTS_A, "/x/train.py", {"strategy": None})
    os.chmod(tmp_path, 0o777)
    try:
        with pytest.raises(CacheError, match="writable by other users"):
            c.lookup(PARTS_A, "/x/train.py")
    finally:
        os.chmod(tmp_path, 0o700)


def test_a_corrupt_entry_is_a_miss_not_a_crash(tmp_path):
    c = PlanCache(str(tmp_path))
    c.store(PARTS_A, "/x/train.py", {"strategy": None})
    (tmp_path / (key_of(PARTS_A) + ".json")).write_text("{not json")
    hit, why = c.lookup(PARTS_A, "/x/train.py")
    assert hit is None and "plan cache entry" in why


def test_cache_list_and_clear(tmp_path, capsys):
    c = PlanCache(str(tmp_path))
    c.store(PARTS_A, "/x/train.py", {"strategy": {"x": 1}, "strategy_name": "os-dpos",
                                     "speedup": 1.25, "devices": ["a", "b"]})
    c.store({**PARTS_A, "graph": "g2"}, "/x/other.py", {"strategy": None,
                                                         "devices": ["a", "b"]})
    assert main(["cache", "list", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 plans" in out and "os-dpos  1.25x" in out and "the original graph" in out
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    assert "removed 2 plans" in capsys.readouterr().out
    assert list(c.entries()) == []
