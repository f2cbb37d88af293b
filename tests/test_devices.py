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
