import random

import pytest

from fastt.errors import FasttError
from fastt.ir import Graph, Op, TensorRef, TensorSpec
from fastt.sched import Device, Problem, dpos
from fastt.sched.sim.problem import TRANSFER_STREAM, shared_cores
from fastt.sched.sim.simulate import serve_from, simulate, simulate_fifo
from tests.helpers import random_problem


def devs(k):
    return [Device(f"/gpu:{d}") for d in range(k)]


def test_replaying_dpos_reproduces_its_finish_time():
    rnd = random.Random(11)
    for _ in range(200):
        p = random_problem(rnd, homogeneous=rnd.random() < 0.5)
        s = dpos(p)
        r = simulate(p, s.device, s.device_orders(p.num_devices), link_concurrency=None)
        assert r.makespan == pytest.approx(s.makespan)
        assert r.start == pytest.approx(s.start)


def test_links_that_bend_past_a_knee_price_every_transfer_alike():
    # 3 bytes over a link of 0.5 s + 1 s/byte, 4 s more per byte past 2 bytes: 7.5 s
    p = Problem.build(2, [(0, 1, 3.0)], [[1, 1], [1, 1]], devs(2), intercept=0.5, slope=1.0,
                      knee=2.0, extra=4.0)
    assert p.comm(0, 0, 1) == 7.5 and p.transfer(0, 1, 1.0) == 1.5 and p.max_comm() == [7.5]
    assert simulate(p, [0, 1], [[0], [1]]).makespan == 1 + 7.5 + 1
    # the dearest of two kinds of links, edge by edge: a steeper line below the knee, the
    # bent one past it
    steep = [[0, 2.0], [0.5, 0]]
    both = Problem.build(3, [(0, 1, 1.0), (0, 2, 4.0)], [[1, 1]] * 3, devs(2),
                         intercept=0.5, slope=steep, knee=2.0, extra=[[0, 0], [4.0, 0]])
    assert both.max_comm() == [2.5, 10.5]
    # DPOS prices them as the simulator does: replaying its schedule reproduces it
    rnd = random.Random(5)
    for _ in range(200):
        q = random_problem(rnd, homogeneous=rnd.random() < 0.5, hinged=True)
        s = dpos(q)
        r = simulate(q, s.device, s.device_orders(q.num_devices), link_concurrency=None)
        assert r.makespan == pytest.approx(s.makespan)


def test_link_contention_serialises_transfers_per_direction():
    # a (0..1 on dev0) feeds b and c on dev1 with 2 distinct tensors of 2 s each.
    p = Problem.build(3, [(0, 1, 2.0), (0, 2, 2.0)], [[1, 1], [1, 1], [1, 1]], devs(2),
                      intercept=0.0, slope=1.0)
    free = simulate(p, [0, 1, 1], [[0], [1, 2]], link_concurrency=None)
    one = simulate(p, [0, 1, 1], [[0], [1, 2]], link_concurrency=1)
    assert free.makespan == 5  # both arrive at 3: b 3..4, c 4..5
    assert one.makespan == 6  # sent 1..3 and 3..5: b 3..4, c 5..6
    assert [(t.start, t.end) for t in one.transfers] == [(1, 3), (3, 5)]


def test_a_small_message_does_not_wait_for_a_bulk_transfer_on_its_link():
    """Op 0's 2 MB tensor (2 s, from t=1) and op 1's 1 KB statistics (from t=2) go from dev0
    to dev1: the statistics interleave with the bulk transfer (as packets do); op 1's 1 MB
    tensor still queues behind the first."""
    mb = 1e6
    p = Problem.build(4, [(0, 2, 2 * mb), (1, 3, 1e3), (1, 2, mb)], [[1, 1]] * 4, devs(2),
                      intercept=0.0, slope=1 / mb)
    r = simulate(p, [0, 0, 1, 1], [[0, 1], [3, 2]], link_concurrency=1)
    spans = {(t.start, round(t.end, 3)) for t in r.transfers}
    assert spans == {(1, 3), (2, 2.001), (3, 4)}
    assert r.start[3] == 2.001


def test_a_tensor_is_sent_once_per_device():
    p = Problem.build(3, [(0, 1, 5.0, "a:0"), (0, 2, 5.0, "a:0")], [[1, 1]] * 3, devs(2),
                      slope=1.0)
    r = simulate(p, [0, 1, 1], [[0], [1, 2]])
    assert len(r.transfers) == 1 and r.makespan == 1 + 5 + 1 + 1


def test_peak_memory_follows_liveness():
    # x (4 bytes) -> y -> z on one device: x is freed when y ends, y when z ends.
    p = Problem.build(3, [(0, 1, 4.0, "x"), (1, 2, 8.0, "y")], [[1], [1], [1]], devs(1),
                      persistent=[0, 0, 100])
    r = simulate(p, [0, 0, 0], [[0, 1, 2]])
    assert r.peak_memory == [100 + 12]  # x and y both live while y runs
    assert r.busy == [3]


def test_bad_orders_are_refused():
    p = Problem.build(2, [(0, 1, 0)], [[1], [1]], devs(1))
    with pytest.raises(FasttError, match="deadlock"):
        simulate(p, [0, 0], [[1, 0]])
    with pytest.raises(FasttError, match="every op exactly once"):
        simulate(p, [0, 0], [[0]])


def test_fifo_runs_ready_ops_first_come_first_served():
    # a and b are ready at once on device 0; c (device 1) needs b. FIFO takes a first (it comes
    # first in the graph) and c waits for it; ordering b first saves a's second.
    p = Problem.build(3, [(1, 2, 0.0)], [[1, 1], [1, 1], [5, 5]], devs(2),
                      intercept=0.0, slope=0.0)
    fifo = simulate_fifo(p, [0, 0, 1])
    assert fifo.start == [0.0, 1.0, 2.0] and fifo.makespan == 7.0
    assert simulate(p, [0, 0, 1], [[1, 0], [2]]).makespan == 6.0


def test_fifo_agrees_with_replaying_its_own_order():
    rnd = random.Random(5)
    for _ in range(200):
        p = random_problem(rnd, homogeneous=rnd.random() < 0.5)
        device = [rnd.randrange(p.num_devices) for _ in range(p.n)]
        fifo = simulate_fifo(p, device)
        orders = [sorted((i for i in range(p.n) if device[i] == d),
                         key=lambda i: (fifo.start[i], fifo.finish[i]))
                  for d in range(p.num_devices)]
        replay = simulate(p, device, orders)
        assert replay.start == pytest.approx(fifo.start)
        assert fifo.busy == pytest.approx(replay.busy)
        for d in range(p.num_devices):  # one op at a time per device
            spans = sorted((fifo.start[i], fifo.finish[i]) for i in range(p.n) if device[i] == d)
            assert all(b[0] >= a[1] - 1e-12 for a, b in zip(spans, spans[1:]))


def test_a_transfer_takes_its_share_of_both_ends_compute():
    # a (dev0, 0..1) sends 2 s of tensor to b (dev1); c (dev0) and d (dev1) are independent
    # 1 s ops, c ordered after a, d before b. Cores that copy the bytes (shares 1) lose the
    # transfer's 2 s: c runs after it (3..4) and d, idle at 0, runs first then gives up 2 s
    # from the transfer's start, so b waits for both the tensor (3) and the copy.
    edges = [(0, 1, 2.0)]
    w = [[1, 1]] * 4
    for sim in (lambda p: simulate(p, [0, 1, 0, 1], [[0, 2], [3, 1]]),
                lambda p: simulate_fifo(p, [0, 1, 0, 1])):
        free = sim(Problem.build(4, edges, w, devs(2), slope=1.0))
        assert free.start[2] == 1 and free.makespan == 4
        shared = sim(Problem.build(4, edges, w, devs(2), slope=1.0, send_cpu=1.0,
                                   recv_cpu=0.5))
        assert shared.start[2] == 3  # dev0 copies 1..3
        assert shared.start[1] == 3 and shared.finish[1] == 4  # dev1: d 0..1, copy 1..2
        half = sim(Problem.build(4, edges, w, devs(2), slope=1.0, send_cpu=0.5))
        assert half.start[2] == 2
        # the latency (1 s) takes the cores only as the call's seconds say: alone, 0.25 s of
        # the sender's
        called = sim(Problem.build(4, edges, w, devs(2), intercept=1.0, slope=1.0,
                                   send_cpu=0.5, call_cpu=(0.1, 0.0, 0.25, 0.0)))
        assert called.start[2] == 2.25 and called.finish[1] == 5  # b: tensor at 1 + 3


def test_a_call_in_a_burst_costs_its_ends_less_than_one_alone():
    # a (dev0) sends one tensor to each of b and c (dev1): the first call finds both ends
    # idle of transfers (1 s of each core), the second, ready while the first moves (on a
    # free link or queued behind it), is in its burst (0.25 s); d (dev0) waits for what its
    # core owes the calls, and so do b and c on dev1
    p = Problem.build(4, [(0, 1, 0.0), (0, 2, 0.0)], [[1, 1]] * 4, devs(2), intercept=0.5,
                      call_cpu=(0.25, 0.25, 1.0, 1.0))
    for links in (None, 1):
        r = simulate(p, [0, 1, 1, 0], [[0, 3], [1, 2]], link_concurrency=links)
        assert r.start[3] == 1 + 1.0 + 0.25
        assert r.start[1] == 1 + 1.0 + 0.25 and r.start[2] == r.start[1] + 1
    # the same two calls a second apart (c's tensor from e, after a on dev0): each alone;
    # c, its tensor there at 3.5, waits for dev1's second whole call
    p = Problem.build(4, [(0, 1, 0.0), (3, 2, 0.0), (0, 3, 0.0)], [[1, 1]] * 4, devs(2),
                      intercept=0.5, call_cpu=(0.25, 0.25, 1.0, 1.0))
    r = simulate(p, [0, 1, 1, 0], [[0, 3], [1, 2]], link_concurrency=None)
    assert r.start[3] == 2 and r.start[1] == 2 and r.start[2] == 3 + 1.0


def test_a_step_pays_once_to_reach_the_devices_it_uses():
    # three independent 1 s ops; devices 1 and 2 cost 0.5 s and 0.25 s a step to reach (the
    # master's calls to remote workers go out together: the dearest one counts, not the sum)
    p = Problem.build(3, [], [[1, 1, 1]] * 3, devs(3), reach=[0.0, 0.5, 0.25])
    assert simulate(p, [0, 0, 0], [[0, 1, 2], [], []]).makespan == 3
    assert simulate(p, [0, 2, 0], [[0, 2], [], [1]]).makespan == 2.25
    assert simulate(p, [0, 1, 2], [[0], [1], [2]]).makespan == 1.5
    assert simulate_fifo(p, [1, 1, 2]).makespan == 2.5


def test_devices_on_the_same_cores_cannot_finish_before_the_cores_did_all_their_work():
    # two independent 1 s ops on two devices: 1 s apart, 2 s when the devices share cores
    w = [[1, 1]] * 2
    assert simulate_fifo(Problem.build(2, [], w, devs(2)), [0, 1]).makespan == 1
    shared = Problem.build(2, [], w, devs(2), cores=[0, 0])
    assert simulate_fifo(shared, [0, 1]).makespan == 2
    assert simulate(shared, [0, 1], [[0], [1]]).makespan == 2
    assert simulate_fifo(shared, [0, 0]).makespan == 2  # one device: its own order already


def test_the_cpu_devices_of_one_process_share_its_cores():
    names = ["/cpu:0", "/job:localhost/replica:0/task:0/device:CPU:1", "/gpu:0",
             "/job:worker/task:1/cpu:0", "/job:worker/task:1/cpu:1", "/job:worker/task:2/cpu:0",
             "not a device"]
    assert shared_cores(names) == [0, 0, 2, 3, 3, 5, 6]


def test_a_collective_runs_beside_the_compute_stream_of_its_device():
    """A 10 s kernel and a 1 s collective on one device: on their own streams both start at
    0 (in order or first come, first served); on one stream the second waits."""
    p = Problem.build(3, [(1, 2, 0.0)], [[10], [1], [1]], devs(1), stream=[0, 1, 1])
    for r in (simulate(p, [0, 0, 0], [[0, 1, 2]]), simulate_fifo(p, [0, 0, 0])):
        assert r.start == [0, 0, 1] and r.makespan == 10
    one = Problem.build(3, [(1, 2, 0.0)], [[10], [1], [1]], devs(1))
    assert simulate(one, [0, 0, 0], [[0, 1, 2]]).start == [0, 10, 11]


def test_measured_calls_cost_the_share_of_the_latency_alone_and_the_probed_seconds_in_a_burst():
    from fastt.sched.sim.problem import _calls
    # shares 0.5 and 1 of a 0.1 ms latency alone; 0.02 and 0.03 ms probed in a burst
    assert _calls((0.5, 1.0, 2e-5, 3e-5), 1e-4) == pytest.approx((2e-5, 3e-5, 5e-5, 1e-4))
    # no burst probed (an older cost file): a call costs the same in a burst
    assert _calls((0.5, 1.0, 0.0, 0.0), 1e-4) == pytest.approx((5e-5, 1e-4, 5e-5, 1e-4))
    assert _calls((0.0, 0.0, 0.0, 0.0), 1e-4) == (0.0, 0.0, 0.0, 0.0)


def test_a_busy_sender_takes_a_request_at_its_first_pause_or_after_its_time_slice():
    # device 0 produces x (op 0, 1 s) then runs a 10 s op; device 1 needs x at once
    edges = [(0, 2, 0.0), (0, 1, 0.0, None)]
    w = [[1, 1], [10, 10], [1, 1]]
    served = Problem.build(3, edges, w, devs(2), intercept=0.5, serve_delay=[3.0, 3.0])
    plain = Problem.build(3, edges, w, devs(2), intercept=0.5)
    orders = [[0, 1], [2]]
    assert simulate(plain, [0, 0, 1], orders).start[2] == 1.5  # sent when produced
    late = simulate(served, [0, 0, 1], orders)
    assert late.transfers[0].start == 3.0 and late.start[2] == 3.5  # after the time slice
    assert simulate_fifo(served, [0, 0, 1]).start[2] == 3.5
    assert simulate(served, [0, 0, 1], orders, compiled=False).start[2] == 3.5
    # a sender that pauses first takes it then: op 1 waits for an input from device 1 (whose
    # cores serve at once) until 2.5 s
    pause = Problem.build(4, edges + [(3, 1, 0.0)], w + [[2, 2]], devs(2), intercept=0.5,
                          serve_delay=[3.0, 0.0])
    r = simulate(pause, [0, 0, 1, 1], [[0, 1], [3, 2]])
    assert r.transfers[0].start == 1.0 and r.start[1] == 2.5
    # a device busy from the step's start to its end and never paused: its last finish
    assert serve_from(served, [0, 0, 1], [0, 1, 3.5], [1, 11, 4.5]) == [3.0, 0.0]


def _tangled_problem(rnd):
    """A random problem with what the simulator handles: tensors shared by consumers on
    several devices, control edges, free ops, collective and gate streams, cores that move
    the bytes, links that bend, small messages; whole-number costs, so that times tie."""
    n, D = rnd.randint(2, 40), rnd.randint(1, 4)
    edges = []
    for j in range(1, n):
        for m in rnd.sample(range(j), min(j, rnd.randint(0, 3))):
            size = rnd.choice([0.0, 1e3, 3e4, 2e5, 1e6])
            key = rnd.choice([None, (m, 0), (m, 1), (m, rnd.randint(0, 5))])
            edges.append((m, j, size, key))
    w = [[float(rnd.choice([0, 0, 1, 2, 3]))] * D for _ in range(n)]
    pick = lambda *xs: [[rnd.choice(xs) for _ in range(D)] for _ in range(D)]  # noqa: E731
    links = dict(intercept=pick(0.0, 1.0, 2.0), slope=pick(0.0, 1e-6, 2e-6))
    if rnd.random() < 0.5:
        links.update(knee=pick(5e4, 5e5, float("inf")), extra=pick(0.0, 3e-6))
    if rnd.random() < 0.5:
        links.update(send_cpu=pick(0.0, 0.5, 1.0), recv_cpu=pick(0.0, 0.25),
                     call_cpu=[[tuple(rnd.choice([0.0, 0.5, 1.0]) for _ in range(4))
                                for _ in range(D)] for _ in range(D)])
    stream = [rnd.choice([0, 0, 0, 1, TRANSFER_STREAM]) for _ in range(n)]
    if rnd.random() < 0.5:  # busy senders take requests late
        links.update(serve_delay=[float(rnd.choice([0, 2, 5])) for _ in range(D)])
    return Problem.build(n, edges, w, devs(D), stream=stream, **links)


def test_the_compiled_loops_replay_as_the_python_ones():
    """``_simcore`` (built by ``pip install``) gives the Python loops' times exactly, in the
    planned order and first come, first served (by priority too): every op's start and
    finish, every transfer, the peaks of memory; and the same needs flattened."""
    from fastt.sched.sim import simulate as sim
    if sim._simcore is None:
        pytest.fail("the compiled simulation loop was not built (fastt/sched/sim/_simcore.c)")
    rnd = random.Random(3)
    for case in range(600):
        p = _tangled_problem(rnd)
        assert sim._flat_needs(p) == sim._flat_needs(p, compiled=False), case
        device = [rnd.randrange(p.num_devices) for _ in range(p.n)]
        orders = [[i for i in p.topo if device[i] == d] for d in range(p.num_devices)]
        concurrency = rnd.choice([None, 1, 1, 2])
        c = simulate(p, device, orders, link_concurrency=concurrency)
        py = simulate(p, device, orders, link_concurrency=concurrency, compiled=False)
        assert (c.start, c.finish) == (py.start, py.finish), case
        assert c.transfers == py.transfers and c.makespan == py.makespan, case
        assert c.peak_memory == py.peak_memory, case
        priority = rnd.choice([None, [float(rnd.randint(0, 3)) for _ in range(p.n)]])
        c = simulate_fifo(p, device, concurrency, priority)
        py = simulate_fifo(p, device, concurrency, priority, compiled=False)
        assert (c.start, c.finish, c.transfers) == (py.start, py.finish, py.transfers), case


def _random_graph(rnd: random.Random) -> Graph:
    """Ops reading earlier ops' outputs, some twice, some both as data and as control
    inputs, some tensors of unknown size, and a while loop's back edge."""
    ops = [Op("x", "Placeholder", outputs=(TensorSpec("float32", (4,)),))]
    for k in range(1, rnd.randint(2, 60)):
        earlier = [o.name for o in ops]
        inputs = tuple(TensorRef(rnd.choice(earlier), 0) for _ in range(rnd.randint(0, 4)))
        control = tuple(rnd.sample(earlier, rnd.randint(0, min(3, len(earlier)))))
        shape = rnd.choice([(rnd.randint(1, 9),), (None,)])
        ops.append(Op(f"op{k}", rnd.choice(["Add", "Mul", "NoOp"]), inputs=inputs,
                      control_inputs=control, outputs=(TensorSpec("float32", shape),)))
    ops.append(Op("loop/next", "NextIteration", inputs=(TensorRef(ops[-1].name, 0),),
                  outputs=(TensorSpec("float32", (4,)),)))
    ops.append(Op("after", "Identity", inputs=(TensorRef("loop/next", 0),),
                  control_inputs=("loop/next", ops[1].name),
                  outputs=(TensorSpec("float32", (4,)),)))
    return Graph(ops)


def test_the_compiled_edges_merge_as_the_python_ones():
    """``_simcore.graph_edges`` (``Problem.from_graph``'s edges) gives the Python
    reference's preds, succs, edge bytes and tensors exactly, edge numbers included."""
    from fastt.sched.sim.edges import graph_edges
    from fastt.sched.sim._native import simcore
    if simcore is None:
        pytest.fail("the compiled simulation loop was not built (fastt/sched/sim/_simcore.c)")
    rnd = random.Random(5)
    for case in range(300):
        g = _random_graph(rnd)
        names = g.topological_order()
        index = {n: i for i, n in enumerate(names)}
        back = {op.name for op in g if g.is_back_edge_source(op.name)}
        ops = [g[n] for n in names]
        c, py = graph_edges(ops, index, back), graph_edges(ops, index, back, compiled=False)
        assert (c.preds, c.succs, c.bytes, c.tensors) == \
            (py.preds, py.succs, py.bytes, py.tensors), case
        assert all(type(b) is float for b in c.bytes), case
    with pytest.raises(KeyError):
        simcore.graph_edges([Op("y", "Identity", inputs=(TensorRef("z", 0),))], {"y": 0},
                            set())


def test_each_edge_is_priced_at_its_dearest_pair_of_devices():
    rnd = random.Random(11)
    for _ in range(100):
        q = random_problem(rnd, homogeneous=False, hinged=rnd.random() < 0.7)
        D = q.num_devices
        assert q.max_comm() == [max(q.transfer(a, b, nb) for a in range(D) for b in range(D)
                                    if a != b) for nb in q.edge_bytes]
