"""Profiler name mapping and attribution, on hand-made RunMetadata (no TensorFlow)."""
import pytest

from fastt.errors import ProfileError
from fastt.ir import Graph, OpMeta
from fastt.profiler import profile
from tests.helpers import node_stats as ns, op, run_metadata

D0 = "/job:localhost/replica:0/task:0/device:CPU:0"
D1 = "/job:localhost/replica:0/task:0/device:CPU:1"


def graph():
    return Graph([
        op("x", "Placeholder", out=((8, 16, 16, 3),)),
        op("w", "Const", out=((3, 3, 3, 8),)),
        op("conv", "Conv2D", ["x", "w"], out=((8, 16, 16, 8),)),
        op("b", "Const", out=((8,),)),
        op("bias", "BiasAdd", ["conv", "b"], out=((8, 16, 16, 8),)),
        op("relu", "Relu", ["bias"], out=((8, 16, 16, 8),)),
        op("grad/shape", "ShapeN", ["relu"], out=((4,), (4,)), dtype="int32"),
        op("loss", "Sum", ["relu"], out=((),)),
    ])


def test_fused_kernel_time_is_shared_by_work_and_names_mapped():
    rm = run_metadata({D0: [
        ns("_SOURCE", "NoOp"),
        ns("_arg_x_0_0", "_Arg", dur_ns=1000),
        ns("w", "Const", dur_ns=1000),
        ns("b", "Const", dur_ns=1000),
        ns("relu", "_MklNativeFusedConv2D", dur_ns=90_000, inputs=["x", "w", "b"],
           outputs=[((8, 16, 16, 8), 8192)]),
        ns("ConstantFolding/grad/shape-matshapes-0", "Const", dur_ns=500),
        ns("GroupCrossDeviceControlEdges_0/loss/ctrl/_3", "NoOp", dur_ns=500),
    ], D1: [
        ns("relu/_4", "Identity", dur_ns=2000, inputs=["relu/_3"],
           outputs=[((8, 16, 16, 8), 8192)]),
        ns("loss", "Sum", dur_ns=5000, inputs=["relu/_4"]),
        ns("_retval_loss_0_0", "_Retval", dur_ns=100),
        ns("mystery", "Foo", dur_ns=100),
    ]})
    p = profile(rm, graph())
    got = {(s.op, s.device): s.seconds for s in p.compute}
    fused = got[("conv", D0)] + got[("bias", D0)] + got[("relu", D0)]
    assert fused == pytest.approx(90e-6)
    assert got[("conv", D0)] > 10 * got[("relu", D0)]  # conv does far more work
    assert p.fused["relu"] == ["bias", "conv"] or set(p.fused["relu"]) == {"bias", "conv"}
    assert got[("x", D0)] == pytest.approx(1e-6)  # _arg_x_0_0
    assert got[("grad/shape", D0)] == pytest.approx(0.5e-6)  # ConstantFolding/...-matshapes-0
    assert got[("loss", D0)] == pytest.approx(0.5e-6)  # GroupCrossDeviceControlEdges_0/...
    assert got[("loss", D1)] == pytest.approx(5.1e-6)  # Sum + _retval_loss_0_0
    assert p.placement["relu"] == D0 and p.placement["loss"] == D1
    assert p.unmapped == {"mystery": pytest.approx(1e-7)}
    assert p.coverage == pytest.approx(1 - 1e-7 / p.total_compute_s)
    [t] = p.transfers
    assert (t.src, t.dst, t.nbytes, t.tensor) == (D0, D1, 8192, "relu")


def test_fused_replica_absorbs_its_producers_beside_a_join_that_did_not_run():
    # A data-parallel step keeps each replica's join under the original name ("conv" joins
    # "conv/part0" and "conv/part1"); nothing reads it, so TensorFlow pruned it, and the
    # fused kernel "relu/part0" holds conv/part0's and bias/part0's work. "x/part1" feeds an
    # op that ran on its own ("peek"): it ran too, however the trace names it.
    shape = (4, 16, 16, 8)
    ops = [op("x", "Placeholder", out=((8, 16, 16, 3),)), op("w", "Const", out=((3, 3, 3, 8),)),
           op("b", "Const", out=((8,),))]
    for k in (0, 1):
        part = OpMeta(origin="conv", fraction=0.5, replica=k)
        ops += [op(f"x/part{k}", "Slice", ["x"], out=((4, 16, 16, 3),)),
                op(f"conv/part{k}", "Conv2D", [f"x/part{k}", "w"], out=(shape,), meta=part),
                op(f"bias/part{k}", "BiasAdd", [f"conv/part{k}", "b"], out=(shape,)),
                op(f"relu/part{k}", "Relu", [f"bias/part{k}"], out=(shape,))]
    ops += [op("conv", "ConcatV2", ["conv/part0", "conv/part1"], out=((8, 16, 16, 8),),
               meta=OpMeta(join={"kind": "concat", "axis": 0, "sizes": [4, 4], "total": 8})),
            op("peek", "Sum", ["x/part1"], out=((),))]
    rm = run_metadata({D0: [
        ns("x/part0", "Slice", dur_ns=1000),
        ns("relu/part0", "_MklNativeFusedConv2D", dur_ns=90_000, inputs=["x/part0", "w", "b"]),
        ns("relu/part1", "_MklNativeFusedConv2D", dur_ns=80_000, inputs=["x/part1", "w", "b"]),
        ns("peek", "Sum", dur_ns=1000),
    ]})
    p = profile(rm, Graph(ops))
    got = {s.op: s.seconds for s in p.compute}
    assert set(p.fused["relu/part0"]) == {"conv/part0", "bias/part0"}
    assert got["conv/part0"] + got["bias/part0"] + got["relu/part0"] == pytest.approx(90e-6)
    assert got["conv/part0"] > 10 * got["relu/part0"]
    assert "conv" not in got  # the join did not run
    # x/part1 also feeds "peek", which ran: it is not part of the kernel
    assert set(p.fused["relu/part1"]) == {"conv/part1", "bias/part1"}


def test_recv_tensor_entries_become_transfer_samples():
    w0 = "/job:worker/replica:0/task:0/device:CPU:0"
    w1 = "/job:worker/replica:0/task:1/device:CPU:0"
    rm = run_metadata({w0: [ns("RecvTensor", "", dur_ns=13_276_000, outputs=[((), 4_000_000)],
                               label=f"[3.8MB] [2.4Gb/s] edge_10_src/RandomUniform from {w1} "
                                     f"to {w0}")]})
    p = profile(rm, graph())
    [t] = p.transfers
    assert (t.src, t.dst, t.nbytes, t.tensor) == (w1, w0, 4_000_000, "src/RandomUniform")
    assert t.seconds == pytest.approx(0.013276)
    assert p.compute == [] and p.coverage == 1.0


def test_recv_tensor_time_starts_when_the_sender_produced_the_tensor():
    # The receiver asked at t=1.000 s; the producer on worker 1 finished at 1.010 s; the
    # tensor arrived at 1.013 s: 3 ms of transfer, not 13 ms.
    w0 = "/job:worker/replica:0/task:0/device:CPU:0"
    w1 = "/job:worker/replica:0/task:1/device:CPU:0"
    recv = ns("RecvTensor", "", dur_ns=13_000_000, outputs=[((), 4_000_000)],
              label=f"edge_10_src/RandomUniform from {w1} to {w0}")
    src = ns("src/RandomUniform", "RandomUniform", dur_ns=2_000_000)
    recv.all_start_micros, src.all_start_micros = 1_000_000, 1_008_000
    p = profile(run_metadata({w0: [recv], w1: [src]}), graph())
    [t] = p.transfers
    assert t.seconds == pytest.approx(0.003)
    src.all_start_micros = 990_000  # produced before the request: the wall time stands
    [t] = profile(run_metadata({w0: [recv], w1: [src]}), graph()).transfers
    assert t.seconds == pytest.approx(0.013)


def test_a_join_fastt_added_is_not_timed_as_the_op_it_joins():
    # In a split graph the concat joining relu's parts is named "relu" itself.
    g = Graph([op("relu/part0", "Relu"), op("relu/part1", "Relu"),
               op("relu", "ConcatV2", ["relu/part0", "relu/part1"],
                  meta=OpMeta(join={"kind": "concat", "axis": 0, "sizes": [1, 1]}))])
    rm = run_metadata({D0: [ns("relu/part0", "Relu", dur_ns=3000),
                            ns("relu/part1", "Relu", dur_ns=4000),
                            ns("relu", "ConcatV2", dur_ns=9000)]})
    got = {s.op: s.seconds for s in profile(rm, g).compute}
    assert got == {"relu/part0": pytest.approx(3e-6), "relu/part1": pytest.approx(4e-6)}


def test_not_a_run_metadata():
    with pytest.raises(ProfileError, match="FULL_TRACE"):
        profile(object(), graph())


def test_processor_sharing_charges_overlapping_kernels_their_share():
    from fastt.sharing import processor_sharing
    # [0, 10) and [5, 15) ns: alone 5 ns each, together 5 ns shared; a gap; [20, 24) alone
    shares, busy = processor_sharing([(0, 10), (5, 15), (20, 24), (3, 3)])
    assert [round(s * 1e9, 6) for s in shares] == [7.5, 7.5, 4.0, 0.0]
    assert busy * 1e9 == pytest.approx(19.0) and sum(shares) == pytest.approx(busy)


def test_background_work_takes_its_weight_of_the_server():
    from fastt.sharing import processor_sharing
    # [0, 20) beside background [10, 20) of weight 1: 10 ns alone, then half of 10 ns
    shares, busy = processor_sharing([(0, 20)], [(10, 20, 1.0)])
    assert shares[0] * 1e9 == pytest.approx(15.0) and busy * 1e9 == pytest.approx(20.0)
    # two kernels and a background of weight 0.5 over [0, 10): each gets 10 / 2.5
    shares, _ = processor_sharing([(0, 10), (0, 10)], [(0, 10, 0.5), (30, 40, 1.0)])
    assert [s * 1e9 for s in shares] == pytest.approx([4.0, 4.0])
    assert processor_sharing([(0, 10)], [(0, 10, 0.0)])[0][0] * 1e9 == pytest.approx(10.0)


def test_a_kernel_beside_a_grpc_transfer_is_charged_without_the_transfers_share():
    # On worker 0 a Relu ran 12 ms, 8 of them beside an 8 ms transfer to worker 1 that the
    # one core also copied (share 1 at both ends): the Relu's own work is 4 + 8 / 2 = 8 ms.
    w0 = "/job:worker/replica:0/task:0/device:CPU:0"
    w1 = "/job:worker/replica:0/task:1/device:CPU:0"
    g = Graph([op("x", "Placeholder"), op("relu", "Relu", ["x"]), op("w", "VarHandleOp")])
    base = 1_000_000_000_000
    relu = ns("relu", "Relu", dur_ns=12_000_000, inputs=["x"])
    relu.all_start_micros, relu.all_start_nanos = base // 1000, base
    recv = ns("RecvTensor", "", dur_ns=8_000_000, outputs=[((), 64 << 20)],
              label=f"edge_3_w from {w0} to {w1}")
    recv.all_start_micros = (base + 4_000_000) // 1000
    meta = run_metadata({w0: [relu], w1: [recv]})
    plain = {s.op: s.seconds for s in profile(meta, g).compute}
    assert plain["relu"] == pytest.approx(0.012)
    shares = {(w0, w1): (1.0, 1.0)}
    got = {s.op: s.seconds for s in profile(meta, g, transfer_cpu=lambda a, b, n, t: shares.get(
        (a, b), (0.0, 0.0))).compute}
    assert got["relu"] == pytest.approx(0.008, rel=1e-3)
    half = {s.op: s.seconds for s in profile(meta, g, transfer_cpu=lambda a, b, n, t: (0.5, 0.0)
                                             ).compute}
    assert half["relu"] == pytest.approx(0.004 + 0.008 / 1.5, rel=1e-3)
    # the callback is told the tensor's bytes and how long its transfer was traced
    seen = []
    profile(meta, g, transfer_cpu=lambda a, b, n, t: seen.append((n, t)) or (0.0, 0.0))
    assert seen == [(64 << 20, pytest.approx(0.008))]


def test_kernels_overlapping_on_one_device_share_it():
    def timed(name, typ, start_ns, dur_ns, inputs=()):
        stats = ns(name, typ, start_ns=0, dur_ns=dur_ns, inputs=inputs)
        stats.all_start_micros, stats.all_start_nanos = start_ns // 1000, start_ns
        return stats

    g = Graph([op("x", "Placeholder"), op("a", "Relu", ["x"]), op("b", "Relu", ["x"])])
    base = 1_000_000_000
    meta = run_metadata({D0: [timed("a", "Relu", base, 40_000, ["x"]),
                              timed("b", "Relu", base + 20_000, 40_000, ["x"])]})
    p = profile(meta, g, untraced_s=100e-6)
    seconds = {s.op: s.seconds for s in p.compute}
    assert seconds["a"] == pytest.approx(30e-6) and seconds["b"] == pytest.approx(30e-6)
    assert p.busy_s[D0] == pytest.approx(60e-6) and p.kernel_s[D0] == pytest.approx(80e-6)
    assert p.concurrency[D0] == pytest.approx(80 / 60)
    assert p.span_s == pytest.approx(60e-6) and p.overhead_s == pytest.approx(40e-6)
    assert p.scale == 1.0
    # untraced, the step is shorter than the traced kernels' span: tracing's own work
    fast = profile(meta, g, untraced_s=45e-6)
    assert fast.scale == pytest.approx(0.75) and fast.overhead_s == 0.0
    assert [s.seconds for s in fast.compute] == pytest.approx([22.5e-6, 22.5e-6])
    assert profile(meta, g).overhead_s is None
    # a 20 us gap between two kernels of one device waiting for nothing else is the
    # executor's: it counts in the overhead (a replay runs b right after a)
    gap = run_metadata({D0: [timed("a", "Relu", base, 40_000, ["x"]),
                             timed("b", "Relu", base + 60_000, 40_000, ["x"])]})
    p = profile(gap, g, untraced_s=110e-6)
    assert p.span_s == pytest.approx(100e-6) and p.busy_s[D0] == pytest.approx(80e-6)
    assert p.overhead_s == pytest.approx(30e-6)  # 110 - 80
    assert profile(gap, g, untraced_s=50e-6).overhead_s == pytest.approx(10e-6)  # 50 - 80/2
    # on two devices, idle time within the span may be waiting for the other one: only what
    # lies beyond the span counts
    two = run_metadata({D0: [timed("a", "Relu", base, 40_000, ["x"])],
                        D1: [timed("b", "Relu", base + 60_000, 40_000, ["x"])]})
    assert profile(two, g, untraced_s=110e-6).overhead_s == pytest.approx(10e-6)
