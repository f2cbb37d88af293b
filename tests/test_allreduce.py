"""Mirrored variables and the ring all-reduce on the IR (no TensorFlow): what is mirrored,
what stays single, the ring's ops and the bytes each link carries."""
from collections import defaultdict

import pytest

from fastt.costs.source import StaticCosts
from fastt.ir import Graph
from fastt.sched.search import memory_fit
from fastt.passes.allreduce import all_reduce, followers, mirrors, sync_writes
from fastt.sched.placers.baselines import data_parallel as dp_placer
from fastt.passes.data_parallel import data_parallel
from fastt.passes.replicas import replica_of
from fastt.sched.sim.device_spec import parse
from fastt.sched.sim.problem import Problem
from fastt.sched.sim.simulate import simulate
from tests.helpers import momentum_graph, op

B, F = 8, 64


def test_variables_their_slots_and_updates_are_mirrored_on_every_replica():
    g = all_reduce(data_parallel(momentum_graph(), 3), 3)
    assert mirrors(g) == {"w": ["w/mirror1", "w/mirror2"],
                          "accum": ["accum/mirror1", "accum/mirror2"]}
    for k in (1, 2):
        copy = g[f"update/mirror{k}"]
        assert [r.op for r in copy.inputs] == [f"w/mirror{k}", f"accum/mirror{k}", "lr",
                                               f"dw/mirror{k}", "mom"]
        assert replica_of(copy) == replica_of(g[f"w/mirror{k}"]) == k
        # the replica's forward pass reads its own copy of the weights
        assert g[f"h/part{k}"].inputs[1].op == f"w/read/mirror{k}"
        assert g[f"w/read/mirror{k}"].inputs[0].op == f"w/mirror{k}"
    assert g["h/part0"].inputs[1].op == "w/read" and replica_of(g["update"]) == 0
    # what waits for the update waits for every copy; the step counter stays single
    # (through one NoOp per replica: one control edge across devices, not one per update)
    assert set(g["train"].control_inputs) >= {"update", "train/fastt_updates/mirror1",
                                              "train/fastt_updates/mirror2"}
    for k in (1, 2):
        wait = g[f"train/fastt_updates/mirror{k}"]
        assert replica_of(wait) == k and f"update/mirror{k}" in wait.control_inputs
    assert "step/mirror1" not in g and "inc/mirror1" not in g


def test_the_summed_gradient_comes_from_a_ring():
    n = 4
    g = all_reduce(data_parallel(momentum_graph(), n), n)
    reduce_ops = [o for o in g if "/reduce" in o.name]
    gather_ops = [o for o in g if "/gather" in o.name]
    assert len(reduce_ops) == len(gather_ops) == n * (n - 1)
    # chunk c is summed from replica c+1 around the ring and ends on replica c
    for c in range(n):
        last = g[f"fastt_allreduce/bucket0/reduce{c}/part{c}"]
        assert last.type == "AddN" and replica_of(last) == c
    assert g["dw"].type == "Reshape" and replica_of(g["dw"]) == 0
    assert g["dw/mirror3"].type == "Reshape" and replica_of(g["dw/mirror3"]) == 3


def test_each_ring_link_carries_two_n_minus_1_over_n_of_the_gradient():
    n = 4
    ds = parse(f"{n}xV100")
    g = all_reduce(data_parallel(momentum_graph(), n), n)
    p = Problem.from_graph(g, ds.devices, StaticCosts({}, ds))
    s = dp_placer(p, g)
    orders = s.device_orders(n)
    r = simulate(p, s.device, orders)
    moved, others = defaultdict(float), set()
    for t in r.transfers:
        if str(t.tensor).startswith("fastt_allreduce/"):
            moved[(t.src, t.dst)] += t.nbytes
        else:
            others.add(str(t.tensor).split(":")[0])
    ring = {(k, (k + 1) % n) for k in range(n)}
    assert set(moved) == ring  # only neighbours exchange gradients
    gradient = F * F * 4
    for link in ring:
        assert moved[link] == 2 * (n - 1) * gradient / n
    # besides: the batch's cut, the two scalars, and the train op's control edges; no weight
    assert {o for o in others if not o.startswith("('control'")} == {"h/split_in0", "lr",
                                                                     "mom"}


def test_a_gradient_from_whole_batch_statistics_is_read_by_every_copy():
    g = all_reduce(data_parallel(momentum_graph(bn_scale=True), 2), 2)
    assert "g/mirror1" in g and g["update_g/mirror1"].inputs[2].op == "dg"
    assert replica_of(g["dg"]) is None and "dg/mirror1" not in g  # computed once, on 0


def test_writes_outside_the_step_are_copied_into_the_copies():
    step = all_reduce(data_parallel(momentum_graph(), 2), 2)
    merged = Graph(list(step) + [
        op("w/init_value", "Const", out=((F, F),)),
        op("w/Assign", "AssignVariableOp", ["w", "w/init_value"], out=(), stateful=True),
        op("init", "NoOp", out=(), control=["w/Assign"])])
    synced = sync_writes(merged)
    copies = followers(synced.names)["w/Assign"]
    assert copies == ["w/Assign/fastt_sync/w/mirror1"]
    assign = synced[copies[0]]
    assert assign.type == "AssignVariableOp" and assign.inputs[0].op == "w/mirror1"
    assert synced[assign.inputs[1].op].control_inputs == ("w/Assign",)  # after the write
    assert set(synced["init"].control_inputs) == {"w/Assign", copies[0]}
    # the optimizer's own update is mirrored, not followed by copies
    assert "update" not in followers(synced.names)


def test_gpus_of_one_process_sum_each_bucket_with_nccl_on_a_stream_of_its_own():
    """On GPUs the buckets go to NCCL (one NcclAllReduce a replica, each waiting for every
    replica's bucket) and run beside the compute stream: the summed gradient is ready a ring's
    time after the last replica's bucket, whatever the compute stream is running."""
    n = 4
    g = all_reduce(data_parallel(momentum_graph(), n), n, collective=True)
    nccl = [o for o in g if o.type == "NcclAllReduce"]
    assert len(nccl) == n and not [o for o in g if "/reduce" in o.name or "/gather" in o.name]
    for k, o in enumerate(sorted(nccl, key=lambda o: o.name)):
        assert replica_of(o) == k and o.attrs["num_devices"] == n
        assert len(o.control_inputs) == n - 1  # every other replica's bucket
    ds = parse(f"{n}xV100")
    p = Problem.from_graph(g, ds.devices, StaticCosts({}, ds))
    i = p.names.index(nccl[0].name)
    assert p.stream[i] == 1 and p.stream.count(1) == n
    latency, per_byte = ds.link(ds.devices[0].name, ds.devices[1].name)
    assert p.w[i][0] == pytest.approx(2 * (n - 1) * (latency + per_byte * F * F * 4 / n))

    class Bent(StaticCosts):  # links 1e-9 s dearer per byte past 16 bytes
        def link_knee(self, src, dst):
            return (16.0, 1e-9)
    bent = Problem.from_graph(g, ds.devices, Bent({}, ds))
    chunk = F * F * 4 / n
    assert bent.w[i][0] == pytest.approx(2 * (n - 1) * (latency + per_byte * chunk
                                                         + 1e-9 * (chunk - 16)))
    assert memory_fit.nccl(ds.devices) and not memory_fit.nccl(parse("2xCPU").devices)
    assert not memory_fit.nccl(parse("2x2xV100").devices)  # two servers: the graph's ring
