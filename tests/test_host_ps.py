"""TF-slim's parameter server on the host CPU: the host device, its links and speed, and the
variables with their updates moved there from the data-parallel-ps layout."""
from dataclasses import replace

import pytest

from fastt.costs.source import StaticCosts
from fastt.sched.placers.host_ps import on_host
from fastt.sched.sim.device_spec import (
    GPU_MEMORY_BYTES_PER_S, HOST_MEMORY_BYTES_PER_S, LINKS, parse, with_host)
from fastt.sched.strategy import plan, replay
from tests.helpers import costs, momentum_graph


def test_the_host_is_reached_over_pcie_and_runs_memory_bound_ops_slower():
    ds = parse("4xV100:dgx1")
    hds, host, slowdown = with_host(ds)
    assert hds.devices[:4] == ds.devices and hds.devices[4] == host
    assert host.name.endswith("/device:CPU:0") and len(hds.devices) == 5
    for d in ds.devices:
        assert hds.links[(d.name, host.name)] == hds.links[(host.name, d.name)] == LINKS["pcie"]
    assert slowdown == pytest.approx(GPU_MEMORY_BYTES_PER_S["V100"] / HOST_MEMORY_BYTES_PER_S)
    assert slowdown > 1
    assert with_host(ds, 2 * HOST_MEMORY_BYTES_PER_S)[2] == pytest.approx(slowdown / 2)
    assert ds.links == parse("4xV100:dgx1").links  # the device set given is left alone


def test_static_costs_slow_down_only_the_devices_named():
    ds = parse("2xV100")
    c = StaticCosts({"a": 2.0}, ds, {ds.devices[1].name: 3.0})
    assert c.compute("a", ds.devices[0].name) == 2.0
    assert c.compute("a", ds.devices[1].name) == 6.0
    assert c.compute_row("a", [d.name for d in ds.devices]) == [2.0, 6.0]
    assert c.compute("missing", ds.devices[1].name) == 0.0


def _ps_plan():
    g = momentum_graph()
    ds = parse("4xV100:dgx1")
    return g, ds, plan(g, ds.devices, costs(ds, g), "data-parallel-ps", fetches=["train"])


def test_variables_their_reads_and_updates_move_to_the_host_the_rest_stays():
    g, ds, ps = _ps_plan()
    hds, host, _ = with_host(ds)
    moved = on_host(ps.graph, ps.placement, host.name)
    assert set(moved) == set(ps.placement)
    on = {n for n, d in moved.items() if d == host.name}
    for name in ("w", "accum", "step", "update", "inc"):
        assert name in on, name
    assert any(ps.graph[n].type == "ReadVariableOp" for n in on)
    gpus = {d.name for d in ds.devices}
    # nothing but variables' colocation groups moves: every replica's compute stays on its GPU
    for n, d in moved.items():
        op = ps.graph[n]
        if op.type in ("MatMul", "ReluGrad", "Relu", "AddN"):
            assert d in gpus and d == ps.placement[n], n
    assert {d for n, d in moved.items() if n not in on} <= gpus


def test_the_host_layout_replays_and_its_slower_updates_lengthen_the_step():
    g, ds, ps = _ps_plan()
    hds, host, slowdown = with_host(ds)
    s = replace(ps, placement=on_host(ps.graph, ps.placement, host.name),
                devices=[*ps.devices, host.name])
    seconds = {o.name: 1e-3 for o in g}

    def step(slow):
        c = StaticCosts(seconds, hds, {host.name: slow})
        return replay(s, hds.devices, c, g, ds.copy_bytes_per_s, link_concurrency=1)[1].makespan

    assert step(slowdown) > step(1.0) > 0
