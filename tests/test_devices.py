import pytest

from fastt import devices
from fastt.errors import FasttError


@pytest.mark.parametrize("name,full", [
    ("/cpu:1", "/job:localhost/replica:0/task:0/device:CPU:1"),
    ("/device:GPU:0", "/job:localhost/replica:0/task:0/device:GPU:0"),
    ("/job:worker/task:2/device:CPU:0", "/job:worker/replica:0/task:2/device:CPU:0"),
    ("/job:worker/replica:0/task:1/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"),
])
def test_canonical(name, full):
    assert devices.canonical(name) == full


def test_bad_names_are_named():
    for bad in ("", "/gpu", "/job:w/task:x", "/device:GPU:x"):
        with pytest.raises(FasttError, match="invalid device name"):
            devices.parse(bad)


def test_type_and_process():
    assert devices.device_type("/job:w/task:1/device:GPU:3") == "GPU"
    assert devices.same_process("/cpu:0", "/cpu:1")
    assert not devices.same_process("/job:w/task:0/cpu:0", "/job:w/task:1/cpu:0")


def test_a_dgx1_links_its_gpus_as_its_hybrid_cube_mesh():
    from fastt.sched.sim.device_spec import DGX1_NVLINKS, parse
    assert all(sum(row) == 6 for row in DGX1_NVLINKS)  # a V100's six NVLinks
    assert all(DGX1_NVLINKS[i][j] == DGX1_NVLINKS[j][i] for i in range(8) for j in range(8))
    ds = parse("8xV100:dgx1")
    n = [d.name for d in ds.devices]
    assert ds.link(n[0], n[1]) == (5e-6, 1 / 50e9)  # two NVLinks
    assert ds.link(n[0], n[2]) == (5e-6, 1 / 25e9)  # one
    assert ds.link(n[0], n[5]) == ds.link(n[5], n[0]) == parse("2xV100:pcie").link(
        *[d.name for d in parse("2xV100:pcie").devices])  # none: PCIe
    four = parse("4xV100:dgx1")  # one socket's four: every pair NVLinked
    assert all(four.link(a.name, b.name)[1] <= 1 / 25e9
               for a in four.devices for b in four.devices if a is not b)
    two = parse("2x8xV100:dgx1")
    m = [d.name for d in two.devices]
    assert two.link(m[8], m[9]) == ds.link(n[0], n[1]) and two.link(m[0], m[9])[0] == 20e-6


def test_an_nvswitch_joins_every_pair_by_six_nvlinks():
    from fastt.sched.sim.device_spec import parse
    ds = parse("16xV100:nvswitch")
    n = [d.name for d in ds.devices]
    assert {ds.link(a, b) for a in n for b in n if a != b} == {(5e-6, 1 / 150e9)}


@pytest.mark.parametrize("spec, said", [("9xV100:dgx1", "a DGX-1 has 8 GPUs, not 9"),
                                        ("17xV100:nvswitch", "at most 16 GPUs, not 17")])
def test_a_topology_too_small_for_the_gpus_is_named(spec, said):
    from fastt.errors import FasttError
    from fastt.sched.sim.device_spec import parse
    with pytest.raises(FasttError, match=said):
        parse(spec)
