"""The rewriter's equivalence check for one zoo model: each strategy's rewritten graph, under
each order mechanism, trains like the original. ``python -m tests.equivalence NAME D`` runs
one case in a process of its own (each builds and drops dozens of graphs: in one long-lived
process their memory is never returned) and exits non-zero with the mismatch;
``python -m tests.equivalence --cluster [NAME...]`` checks both data-parallel layouts over a
local 2-worker gRPC cluster; ``--priorities [NAME...]`` the parameter-server layout with its
weight transfers ordered, in-process and on the cluster; ``--pipeline [NAME...]`` two-stage
pipelines over micro-batches, in-process and on the cluster; ``--hybrid [NAME...]``
data-parallel plans with weights kept whole, in-process and on the cluster."""
import sys

import numpy as np
import tensorflow as tf

from fastt import zoo
from fastt.adapters.rewrite import rewrite
from fastt.adapters.tf_import import from_tf_graph
from fastt.cluster import LocalCluster
from fastt.costs.source import StaticCosts
from fastt.passes.allreduce import mirrors
from fastt.sched.sim.device_spec import DeviceSet, parse
from fastt.sched.sim.problem import Device
from fastt.passes.split_rules import rules
from fastt.passes.splitting import Split
from fastt.sched.placers import transfer_order
from fastt.sched.placers import baselines
from fastt.passes.data_parallel import data_parallel
from fastt.passes.replicas import replica_of
from fastt.passes.hybrid import kept_whole, weights
from fastt.sched.placers.dpos import rank_u
from fastt.sched.placers.pipedream import layers, place_stages
from fastt.sched.placers.stages import Stage
from fastt.sched.sim.simulate import simulate_fifo
from fastt.sched.search.osdpos import clock
from fastt.sched.search.memory_fit import data_parallel_fitting
from fastt.sched.search.planning import Planning
from fastt.sched.strategy import Strategy, plan
from tf_patches import priority_executor

tf1 = tf.compat.v1

STEPS = 3
# OS-DPOS's searches end by then (its splits and hybrid plans, without a deadline up to 30 s
# and 20 s: 69 s of ResNet-v2-50's case on 2 devices); forced splits are checked apart
SEARCH_S = 10.0
# The eight models (and a small CNN), optimizers spread across them; small inputs.
MODELS = {
    "mlp": ("sgd", {"batch_size": 8}),
    "small_cnn": ("momentum", {"batch_size": 8, "batch_norm": True}),
    "lenet": ("adam", {"batch_size": 8}),
    "alexnet_v2": ("sgd", {"batch_size": 4, "image_size": 96}),
    # float64: one conv5 bias gradient element nearly cancels; the reduction order of 4
    # devices sharing one thread pool moved its float32 momentum by 6% (7.6e-5 absolute).
    "vgg_16": ("momentum", {"batch_size": 4, "image_size": 32, "dtype": tf.float64}),
    # float64: Adam turns float32 rounding on near-zero gradients into visible updates.
    "inception_v3": ("adam", {"batch_size": 4, "image_size": 107, "dtype": tf.float64}),
    # At 32x32, block 4 sees 1x1 maps and its BatchNorm normalises 4 numbers per channel: a
    # 6e-17 difference became 1e-4 in 5 steps (the same split at 64x64: 2.3e-11). At lr 0.01
    # it memorises the batch (loss 3.2 -> 0.3) so fast that even float64 rounding grows to 10%.
    "resnet_v2_50": ("momentum", {"batch_size": 4, "image_size": 64, "dtype": tf.float64,
                                  "learning_rate": 1e-3}),
    # float64: its attention key biases have an exactly-zero gradient; Adam would normalise
    # float32 rounding noise into full-size updates.
    "transformer": ("adam", {"layers": 1, "batch_size": 4, "dtype": tf.float64}),
    "lstm_lm": ("sgd", {"batch_size": 8}),
    # Reference variables, as disable_v2_behavior() scripts build them (Apply*, Assign).
    "small_cnn_ref": ("momentum", {"batch_size": 8, "batch_norm": True}),
    "lenet_ref": ("adam", {"batch_size": 8}),
}
REF = "_ref"
# Large real nets: on 2 devices, each strategy under one order mechanism (every mechanism
# still runs on each of them); the small models cover every combination on 2 and 4 devices.
HEAVY = {"vgg_16", "inception_v3", "resnet_v2_50"}
HEAVY_ORDER = {"placement": "control", "splits": "priority", "data-parallel": "none",
               "data-parallel-ps": "control", "os-dpos": "control"}
TOL = {"sgd": (1e-4, 1e-5), "momentum": (1e-4, 1e-5), "adam": (1e-3, 1e-4)}


def assert_close(got, want, rtol, atol, err_msg=""):
    """``np.testing.assert_allclose``'s test, its report only on failure: its masks of
    NaNs and infinities took 14 of AlexNet's 75 s (every variable, every run)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape == want.shape and bool(np.all(np.abs(got - want) <= atol + rtol * np.abs(want))):
        return
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=err_msg)


def build(name, opt=None):
    default_opt, kwargs = MODELS[name]
    if name.endswith(REF):
        tf1.disable_resource_variables()
    try:
        m = zoo.build(name.removesuffix(REF), opt=opt or default_opt, **kwargs)
    finally:
        tf1.enable_resource_variables()
    ir = from_tf_graph(m.graph)
    if name.endswith(REF):
        assert _variables(ir) and all(ir[v].type == "VariableV2" for v in _variables(ir))
    return m, ir


def forced_splits(ir, m, D):
    """One split per (op type, dimension) the model allows, into D parts."""
    step = ir.fan_in([m.train_op.name])
    seen, splits = set(), []
    for op in step:
        for r in rules(op, step):
            if (op.type, r.dim) not in seen and (r.base(op, step) or 0) >= D:
                seen.add((op.type, r.dim))
                splits.append(Split(op.name, r.dim, D))
                break
    return splits


def strategy(ir, m, D, mode):
    ds = parse(f"{D}xCPU")
    costs = StaticCosts({o.name: 1e-4 for o in ir}, ds)
    fetches = [m.train_op.name, m.loss.name]
    if mode == "placement":
        return plan(ir, ds.devices, costs, "m-topo", fetches=fetches)
    if mode == "splits":
        return plan(ir, ds.devices, costs, "dpos", fetches=fetches,
                    splits=forced_splits(ir, m, D))
    if mode == "os-dpos":  # what it plans is checked here, not how long it searched
        return plan(ir, ds.devices, costs, mode, shared=Planning(
            ir, ds.devices, costs, fetches=fetches, deadline=clock() + SEARCH_S))
    return plan(ir, ds.devices, costs, mode, fetches=fetches)


def check(name, D):
    """Every strategy of ``name`` on ``D`` devices, every order mechanism: the losses and
    variables of the original graph."""
    opt = MODELS[name][0]
    m, ir = build(name)
    ref_losses, ref_values = _reference(m, ir, D)
    rtol, atol = TOL[opt]
    for mode in ("placement", "splits", "data-parallel", "data-parallel-ps", "os-dpos"):
        if mode == "data-parallel-ps" and name in HEAVY:
            continue  # TF-slim's layout: covered by the small models, in-process and on a cluster
        s = strategy(ir, m, D, mode)
        if mode == "placement":
            assert len(set(s.placement.values())) > 1  # really spread over devices
        if mode == "splits":
            assert len(s.splits) >= 2
        copies = mirrors(s.graph)
        # every trained variable a replica reads is mirrored on every replica (one that
        # only ops run once on the whole batch read stays where they run), and only in the
        # all-reduce layout
        assert (mode == "data-parallel") == bool(copies)
        if mode == "data-parallel":
            trained = {ir[u].inputs[0].op for u in ir.fan_in([m.train_op.name]).names
                       if "Apply" in ir[u].type}
            read = {v for v in trained if _read_by_replicas(s.graph, v)}
            assert read and read <= set(copies) and all(len(c) == D - 1
                                                         for c in copies.values())
        for order in [HEAVY_ORDER[mode]] if name in HEAVY else ["none", "control", "priority"]:
            gd = rewrite(ir, s, enforce_order=order == "control", priority=order == "priority")
            assert set(ir.names) <= {n.name for n in gd.node}  # every op keeps its name
            losses, values = _run_with_values(gd, m, ir, D, priority=order == "priority",
                                              copies=copies)
            assert_close(losses, ref_losses, rtol=rtol, atol=atol,
                                       err_msg=f"{mode} order={order}")
            for v, got, want in zip(_variables(ir), values, ref_values):
                assert_close(got, want, rtol=rtol, atol=atol,
                                           err_msg=f"{mode} order={order} variable {v}")


def _read_by_replicas(g, var):
    """Whether an op of a data-parallel replica reads ``var`` (directly or through reads)."""
    stack = [var]
    while stack:
        for e in g.consumers(stack.pop()):
            if replica_of(g[e.dst]) is not None:
                return True
            if g[e.dst].type in ("Identity", "ReadVariableOp"):
                stack.append(e.dst)
    return False


def _variables(ir):
    return sorted(op.name for op in ir if op.type in ("VarHandleOp", "VariableV2"))


def _value_fetches(g, ir, names=None):
    """A read of every variable (or of ``names``: variable -> the op to read), built in ``g``
    (resource handles are not values; a reference variable's output is its value)."""
    names = names or {v: v for v in _variables(ir)}
    with g.as_default():
        return [tf1.raw_ops.ReadVariableOp(resource=g.get_tensor_by_name(op + ":0"),
                                           dtype=tf.as_dtype(ir[v].attrs["dtype"]))
                if ir[v].type == "VarHandleOp" else g.get_tensor_by_name(op + ":0")
                for v, op in names.items()]


def _run_with_values(graph_or_def, m, ir, D, priority=False, copies=None, target=""):
    """Losses of STEPS training steps and the variables after them; ``priority``: under
    fastt's priority executor; ``copies`` (variable -> its mirrored copies): each copy must
    hold exactly its variable's value; ``target``: a cluster's master."""
    g = graph_or_def
    if not isinstance(g, tf.Graph):
        g = tf.Graph()
        with g.as_default():
            tf1.import_graph_def(graph_or_def, name="")
    reads = _value_fetches(g, ir)
    cfg = tf1.ConfigProto(device_count={"CPU": D}, allow_soft_placement=False)
    if priority:
        assert priority_executor.load(), "the priority executor is not built"
        cfg.experimental.executor_type = priority_executor.EXECUTOR_TYPE
    with tf1.Session(target, graph=g, config=cfg) as sess:
        sess.run(g.get_operation_by_name(m.init.name))
        feed = {g.get_tensor_by_name(k + ":0"): v for k, v in m.feeds.items()}
        losses = [sess.run([g.get_tensor_by_name(m.loss.name),
                            g.get_operation_by_name(m.train_op.name)], feed)[0]
                  for _ in range(STEPS)]
        values = sess.run(reads)
        pairs = [(v, name) for v, names in (copies or {}).items() for name in names]
        # one run for every copy: each op added to a running graph extends the session
        got = sess.run([_value_fetches(g, ir, {v: name})[0] for v, name in pairs])
        for (v, name), value in zip(pairs, got):
            assert_close(value, values[_variables(ir).index(v)], rtol=0, atol=0,
                                          err_msg=f"copy {name} of {v}")
        return losses, values


def _reference(m, ir, D):
    g = tf.Graph()
    with g.as_default():
        tf1.import_graph_def(m.graph.as_graph_def(), name="")
    return _run_with_values(g, m, ir, D)



# The in-process models that are not HEAVY: each trains in seconds on two one-core workers.
CLUSTER_MODELS = [n for n in MODELS if n not in HEAVY]


def _workers(cluster):
    """The cluster's two workers and a device set over them."""
    devices = [Device(cluster.device(i)) for i in range(2)]
    return devices, DeviceSet("CPU", devices, {(a.name, b.name): (1e-4, 1e9)
                                               for a in devices for b in devices if a != b})


def _case(name):
    """Model ``name``, its IR, its (losses, variables) on 2 devices, its tolerances."""
    m, ir = build(name)
    return m, ir, _reference(m, ir, 2), TOL[MODELS[name][0]]


def _assert_trains_like(got, want, ir, tol, where):
    """(losses, variables) ``got`` as ``want`` within ``tol`` (rtol, atol)."""
    assert_close(got[0], want[0], rtol=tol[0], atol=tol[1], err_msg=where)
    for v, a, b in zip(_variables(ir), got[1], want[1]):
        assert_close(a, b, rtol=tol[0], atol=tol[1],
                                   err_msg=f"{where} variable {v}")


def _check_run(m, ir, s, order, target, ref, tol, what):
    """Strategy ``s`` rewritten with its ``order`` mechanism and run on 2 devices (of the
    cluster at ``target``, reset first; "": in-process) trains as ``ref``."""
    if target:
        tf1.Session.reset(target)
    gd = rewrite(ir, s, enforce_order=order == "control", priority=order == "priority")
    got = _run_with_values(gd, m, ir, 2, priority=order == "priority", target=target)
    _assert_trains_like(got, ref, ir, tol, f"{what}, order={order}, {target or 'in-process'}")


def check_cluster(names):
    """Both data-parallel layouts of each model over a local cluster of 2 gRPC workers (one
    core each): the losses and variables of the original graph run in-process. Workers keep
    variables across sessions, so their containers are reset before each run."""
    with LocalCluster(workers=2) as cluster:
        devices, ds = _workers(cluster)
        for name in names:
            m, ir, ref, tol = _case(name)
            costs = StaticCosts({o.name: 1e-4 for o in ir}, ds)
            for mode in ("data-parallel", "data-parallel-ps"):
                s = plan(ir, devices, costs, mode, fetches=[m.train_op.name, m.loss.name])
                assert set(s.placement.values()) == {d.name for d in devices}
                tf1.Session.reset(cluster.target)
                got = _run_with_values(rewrite(ir, s, enforce_order=True), m, ir, 2,
                                       copies=mirrors(s.graph), target=cluster.target)
                _assert_trains_like(got, ref, ir, tol, f"{name} {mode} on the cluster")
            print(f"{name}: both layouts as the original on the cluster", flush=True)


# Reference and resource variables, BatchNorm, an LSTM's loop: the weight transfers ordered.
PRIORITY_MODELS = ["lenet_ref", "small_cnn", "lstm_lm"]


def check_priorities(names):
    """The parameter-server layout with its weight transfers ordered by need
    (``fastt.sched.placers.transfer_order``, every weight a group of its own so that every link
    is chained), in-process under each order mechanism and over a local 2-worker cluster:
    the losses and variables of the original graph."""
    transfer_order.GROUP_BYTES = 0
    with LocalCluster(workers=2) as cluster:
        devices, ds = _workers(cluster)
        for name in names:
            m, ir, ref, tol = _case(name)
            fetches = [m.train_op.name, m.loss.name]
            local = plan(ir, parse("2xCPU").devices, StaticCosts({o.name: 1e-4 for o in ir},
                                                                 parse("2xCPU")),
                         "data-parallel-ps", fetches=fetches, transfer_priorities="on")
            remote = plan(ir, devices, StaticCosts({o.name: 1e-4 for o in ir}, ds),
                          "data-parallel-ps", fetches=fetches, transfer_priorities="on")
            for s, order, target in ((local, "none", ""), (local, "priority", ""),
                                     (remote, "control", cluster.target)):
                ordered = s.transfer_priorities
                assert ordered and ordered["kept"] and ordered["transfers"] >= 4, ordered
                _check_run(m, ir, s, order, target, ref, tol, f"{name} ordered transfers")
            print(f"{name}: ordered weight transfers train as the original", flush=True)


# The pipeline issue's four: an MLP, a CNN without BatchNorm, an LSTM language model, a
# Transformer block.
PIPELINE_MODELS = ["mlp", "lenet", "lstm_lm", "transformer"]


def two_stages(ir, m, devices, costs, micro):
    """A pipeline of ``ir`` cut into two stages of its layers (``fastt.sched.placers.stages``), one
    per device, over ``micro`` micro-batches, its order GPipe's (ranks, first come)."""
    fetches = [m.train_op.name, m.loss.name]
    shared = Planning(ir, devices, costs, fetches=fetches)
    g = data_parallel(shared.graph, micro)
    p = shared.compile(g)
    layer = layers(p, g)
    half = (max(layer) + 1) // 2
    device = place_stages(p, g, layer, [Stage(0, half - 1, 1), Stage(half, max(layer), 1)])
    assert 0 < device.count(0) < p.n, "both stages hold ops"
    r = simulate_fifo(p, device, priority=rank_u(p))
    return _strategy("pipedream", p, g, devices, device,
                     sorted(range(p.n), key=lambda i: (r.start[i], i)), r.makespan, micro,
                     fetches)


def _strategy(name, p, g, devices, device, order, makespan, replicas, fetches):
    """A ``Strategy`` of ``g`` (compiled ``p``): op i on ``devices[device[i]]``, in ``order``
    (op indices)."""
    names = [d.name for d in devices]
    return Strategy(name, names, g, {p.names[i]: names[device[i]] for i in range(p.n)},
                    [p.names[i] for i in order], makespan, makespan, 0.0, replicas=replicas,
                    fetches=fetches)


def check_pipeline(names):
    """Two-stage pipelines over 2 and 4 micro-batches, in-process (the priority executor for
    2, TensorFlow's order for 4) and over a local 2-worker cluster (control dependencies):
    the losses and variables of the original graph."""
    with LocalCluster(workers=2) as cluster:
        devices, ds = _workers(cluster)
        for name in names:
            m, ir, ref, tol = _case(name)
            seconds = {o.name: 1e-4 for o in ir}
            for micro in (2, 4):
                local = two_stages(ir, m, parse("2xCPU").devices,
                                   StaticCosts(seconds, parse("2xCPU")), micro)
                remote = two_stages(ir, m, devices, StaticCosts(seconds, ds), micro)
                for s, order, target in ((local, "priority" if micro == 2 else "none", ""),
                                         (remote, "control", cluster.target)):
                    _check_run(m, ir, s, order, target, ref, tol,
                               f"{name} pipeline of {micro} micro-batches")
            print(f"{name}: pipelines train as the original", flush=True)


# Momentum and Adam, reference variables, BatchNorm, weights shared over an LSTM's time steps.
HYBRID_MODELS = ["mlp", "lenet_ref", "small_cnn", "lstm_lm"]


def hybrid(ir, m, devices, costs, layout):
    """``layout``'s data-parallel plan of ``ir`` on ``devices`` with every other weight kept
    whole (``fastt.passes.hybrid``), its ops and updates on device 0; and those weights."""
    fetches = [m.train_op.name, m.loss.name]
    shared = Planning(ir, devices, costs, fetches=fetches)
    kept = weights(shared.graph)[::2]
    whole = frozenset().union(*(w.ops for w in kept))
    g = data_parallel_fitting(shared.graph, devices, layout == "data-parallel",
                              replicas=data_parallel(shared.graph, len(devices), whole))
    p = shared.compile(g)
    sch = baselines.data_parallel(p, g)
    return (_strategy(layout, p, g, devices, sch.device, sch.order(), sch.makespan,
                      len(devices), fetches), [w.variable for w in kept])


def check_hybrid(names):
    """Both data-parallel layouts with every other weight kept whole, in-process (TensorFlow's
    order and the priority executor) and over a local 2-worker cluster (control
    dependencies): the losses and variables of the original graph; the weights kept whole
    are not mirrored, the others are."""
    with LocalCluster(workers=2) as cluster:
        devices, ds = _workers(cluster)
        for name in names:
            m, ir, ref, tol = _case(name)
            seconds = {o.name: 1e-4 for o in ir}
            for layout in ("data-parallel", "data-parallel-ps"):
                local, kept = hybrid(ir, m, parse("2xCPU").devices,
                                     StaticCosts(seconds, parse("2xCPU")), layout)
                assert kept and kept_whole(ir, local.graph) == kept, kept
                copies = mirrors(local.graph)
                assert not set(kept) & set(copies), "a weight kept whole was mirrored"
                assert bool(copies) == (layout == "data-parallel")
                remote, _ = hybrid(ir, m, devices, StaticCosts(seconds, ds), layout)
                for s, order, target in ((local, "none", ""), (local, "priority", ""),
                                         (remote, "control", cluster.target)):
                    _check_run(m, ir, s, order, target, ref, tol, f"{name} hybrid {layout}")
            print(f"{name}: hybrid plans train as the original", flush=True)


if __name__ == "__main__":
    tf1.disable_eager_execution()
    if sys.argv[1] == "--cluster":
        check_cluster(sys.argv[2:] or CLUSTER_MODELS)
    elif sys.argv[1] == "--priorities":
        check_priorities(sys.argv[2:] or PRIORITY_MODELS)
    elif sys.argv[1] == "--hybrid":
        check_hybrid(sys.argv[2:] or HYBRID_MODELS)
    elif sys.argv[1] == "--pipeline":
        check_pipeline(sys.argv[2:] or PIPELINE_MODELS)
    else:
        check(sys.argv[1], int(sys.argv[2]))
