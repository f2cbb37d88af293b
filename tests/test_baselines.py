import random

import pytest

from fastt.sched import Device, Problem, dpos
from fastt.sched.placers.baselines import heft, m_etf, m_sct, m_topo, single
from fastt.sched.placers.msct import favourite_children
from fastt.sched.sim.simulate import simulate
from tests.exact import check_schedule
from tests.helpers import random_problem

PLACERS = {"single": single, "heft": heft, "m_topo": m_topo, "m_etf": m_etf, "m_sct": m_sct}


@pytest.mark.parametrize("name", sorted(PLACERS))
def test_baselines_give_valid_schedules(name):
    rnd = random.Random(5)
    for _ in range(150):
        p = random_problem(rnd, homogeneous=False, memory=rnd.random() < 0.5)
        try:
            s = PLACERS[name](p)
        except Exception as e:  # only single may fail: the graph may not fit one device
            assert name == "single" and "single device" in str(e)
            continue
        check_schedule(p, s)
        r = simulate(p, s.device, s.device_orders(p.num_devices), link_concurrency=None)
        assert r.makespan <= s.makespan + 1e-9  # replay never later than the placer's timing


def test_m_topo_fills_devices_in_topological_order_up_to_baechis_limit():
    p = Problem.build(6, [(i, i + 1, 0) for i in range(5)], [[1, 1, 1]] * 6,
                      [Device(f"/gpu:{d}") for d in range(3)], mem=[1] * 6)
    s = m_topo(p)
    # limit = 6/3 + 1 = 3 ops per device
    assert s.device == [0, 0, 0, 1, 1, 1]


def test_m_etf_picks_the_earliest_start():
    # Two independent ops and two devices: each gets its own device, both start at 0.
    p = Problem.build(2, [], [[3, 3], [2, 2]], [Device("/gpu:0"), Device("/gpu:1")])
    s = m_etf(p)
    assert sorted(s.device) == [0, 1] and s.start == [0, 0]


def test_heft_uses_mean_costs_and_dpos_the_max():
    # An op that is slow on one device: DPOS's max-rank and HEFT's mean-rank differ but both
    # place it on its fast device.
    p = Problem.build(2, [(0, 1, 0)], [[1, 9], [1, 1]], [Device("/gpu:0"), Device("/gpu:1")])
    assert heft(p).device[0] == 0 and dpos(p).device[0] == 0


def test_sct_gives_each_op_at_most_one_favourite_child_and_parent():
    rnd = random.Random(7)
    for _ in range(40):
        p = random_problem(rnd, homogeneous=False, memory=False)
        fav = favourite_children(p)
        assert len(set(fav.values())) == len(fav)  # no child with two favourite parents
        for i, j in fav.items():
            assert j in {k for k, _ in p.succs[i]}


def test_m_sct_keeps_a_chain_with_dear_transfers_on_one_device_where_m_etf_spreads_it():
    # A fork: op 0 feeds a long chain (1..4) and a short op 5; transfers cost as much as the
    # ops. ETF starts the chain's next op on whichever device frees first; SCT's favourite
    # children keep the chain together.
    edges = [(0, 1, 0), (1, 2, 0), (2, 3, 0), (3, 4, 0), (0, 5, 0)]
    p = Problem.build(6, edges, [[1, 1]] * 6, [Device("/gpu:0"), Device("/gpu:1")],
                      intercept=[[0, 1.0], [1.0, 0]], slope=[[0, 0], [0, 0]])
    fav = favourite_children(p)
    assert [fav.get(i) for i in range(4)] == [1, 2, 3, 4]  # the chain's edges cost nothing
    s = m_sct(p)
    assert len({s.device[i] for i in range(5)}) == 1
    assert s.makespan <= m_etf(p).makespan
    check_schedule(p, s)


def test_sct_never_favours_a_control_edge_and_prices_control_blocks_once():
    # Ops 3-5 are waited for by 6-8 through control edges only (the moving-average updates
    # every gradient op waits for under tf.control_dependencies): one block, 6 rows, not 9.
    from fastt.sched.placers.msct import _bicliques
    data = [(0, 1, 8.0), (1, 2, 8.0), (0, 3, 8.0), (0, 4, 8.0), (0, 5, 8.0)]
    control = [(i, j, 0.0, None) for i in (3, 4, 5) for j in (6, 7, 8)]
    p = Problem.build(9, data + control, [[1, 1]] * 9, [Device("/gpu:0"), Device("/gpu:1")],
                      intercept=[[0, 1.0], [1.0, 0]], slope=[[0, 0.1], [0.1, 0]])
    fav = favourite_children(p)
    assert fav and all(p.edge_tensors[e] for i, j in fav.items()
                       for k, e in p.succs[i] if k == j)
    assert not {6, 7, 8} & set(fav.values())
    assert _bicliques([(i, j) for i, j, *_ in control]) == [([3, 4, 5], [6, 7, 8])]
    blocks = _bicliques([(0, 1), (0, 2), (3, 2)])  # each edge in exactly one complete block
    assert sorted((i, j) for s, t in blocks for i in s for j in t) == [(0, 1), (0, 2), (3, 2)]
    check_schedule(p, m_sct(p))


def _slopes(spec):
    from fastt.sched.sim.device_spec import parse
    ds = parse(spec)
    names = [d.name for d in ds.devices]
    return [[0.0 if a == b else 1 / ds.links[(a, b)][1] for b in names] for a in names]


def test_the_ring_on_a_dgx1_runs_over_its_double_nvlink_pairs():
    from fastt.sched.sim.rings import ring_order
    from fastt.sched.sim.device_spec import DGX1_NVLINKS
    ring = ring_order(_slopes("8xV100:dgx1"))
    assert ring[0] == 0 and sorted(ring) == list(range(8))
    # Replica k next to k + 1 in device order would cross PCIe (GPUs 3 and 4 share no NVLink).
    assert DGX1_NVLINKS[3][4] == 0
    assert [DGX1_NVLINKS[a][b] for a, b in zip(ring, ring[1:] + ring[:1])] == [2] * 8


@pytest.mark.parametrize("spec", ["8xV100", "8xV100:pcie", "2x4xV100", "16xV100", "3xV100"])
def test_uniform_links_keep_replica_k_on_device_k(spec):
    from fastt.sched.sim.rings import ring_order
    n = len(_slopes(spec))
    assert ring_order(_slopes(spec)) == list(range(n))


def test_past_the_exhaustive_search_the_ring_takes_the_nearest_next_device():
    from fastt.sched.sim.rings import RING_EXHAUSTIVE, ring_order
    n = RING_EXHAUSTIVE + 3
    hidden = [0] + random.Random(3).sample(range(1, n), n - 1)  # fast links along a cycle
    fast = {frozenset(e) for e in zip(hidden, hidden[1:] + hidden[:1])}
    slope = [[0.0 if a == b else 1.0 if frozenset((a, b)) in fast else 5.0 for b in range(n)]
             for a in range(n)]
    ring = ring_order(slope)
    assert ring[0] == 0 and sorted(ring) == list(range(n))
    assert max(slope[a][b] for a, b in zip(ring, ring[1:] + ring[:1])) == 1.0
