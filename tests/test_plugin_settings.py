"""The plugin's environment variables: defaults, values, and errors that name the variable."""
import dataclasses
import os

import pytest

from fastt.plugin.settings import LOCAL_CPU, Settings, SettingsError, from_env, parse_devices


def test_defaults_are_off_and_os_dpos():
    s = from_env({})
    # the plan cache, on by default, in the user's cache directory; off for Settings() made
    # in code
    assert s.cache_dir == os.path.join(os.path.expanduser("~"), ".cache", "fastt")
    assert dataclasses.replace(s, cache_dir="") == Settings()
    assert not s.enabled and s.strategy == "os-dpos" and s.order and s.split
    assert (s.overhead_fraction, s.overhead_s) == (0.03, 2.0)


def test_the_plan_cache_is_placed_or_turned_off():
    assert from_env({"XDG_CACHE_HOME": "/c"}).cache_dir == "/c/fastt"
    assert from_env({"FASTT_CACHE_DIR": "/d", "XDG_CACHE_HOME": "/c"}).cache_dir == "/d"
    assert from_env({"FASTT_CACHE": "0", "FASTT_CACHE_DIR": "/d"}).cache_dir == ""
    with pytest.raises(SettingsError, match="FASTT_CACHE="):
        from_env({"FASTT_CACHE": "sometimes"})


def test_values_are_read():
    s = from_env({"FASTT": "1", "FASTT_DEVICES": "cpu:4", "FASTT_STRATEGY": "dpos",
                  "FASTT_DUMP_DIR": "/tmp/x", "FASTT_WARMUP_STEPS": "7",
                  "FASTT_PROFILE_STEPS": "2", "FASTT_MEASURE_STEPS": "9",
                  "FASTT_MAX_ROUNDS": "4", "FASTT_REPROFILE_EVERY": "0",
                  "FASTT_REPLAN_THRESHOLD": "0.25", "FASTT_ORDER": "off", "FASTT_SPLIT": "no",
                  "FASTT_STRICT": "yes", "FASTT_LOG_LEVEL": "debug"})
    assert s.enabled and s.devices == [LOCAL_CPU.format(i) for i in range(4)]
    assert s.logical_cpus == 4 and s.strategy == "dpos" and s.dump_dir == "/tmp/x"
    assert (s.warmup_steps, s.profile_steps, s.measure_steps) == (7, 2, 9)
    assert (s.max_rounds, s.reprofile_every, s.replan_threshold) == (4, 0, 0.25)
    assert not s.order and not s.split and s.strict and s.log_level == "DEBUG"


@pytest.mark.parametrize("raw, mode", [("", "auto"), ("auto", "auto"), ("1", "on"),
                                       ("on", "on"), ("off", "off"), ("false", "off")])
def test_transfer_priorities_are_auto_on_or_off(raw, mode):
    assert from_env({"FASTT_TRANSFER_PRIORITIES": raw}).transfer_priorities == mode
    assert Settings().transfer_priorities == "auto"


def test_device_lists():
    names, cpus = parse_devices("/device:CPU:0, /device:CPU:2")
    assert names == [LOCAL_CPU.format(0), LOCAL_CPU.format(2)] and cpus == 3
    names, cpus = parse_devices("/job:worker/task:0/device:CPU:0,/job:worker/task:1/device:CPU:0")
    assert names[1] == "/job:worker/replica:0/task:1/device:CPU:0" and cpus == 1


@pytest.mark.parametrize("env, variable", [
    ({"FASTT": "maybe"}, "FASTT="),
    ({"FASTT_DEVICES": "cpu:0"}, "FASTT_DEVICES"),
    ({"FASTT_DEVICES": "gpu0"}, "FASTT_DEVICES"),
    ({"FASTT_DEVICES": "/device:CPU:0,/device:CPU:0"}, "FASTT_DEVICES"),
    ({"FASTT_DEVICES": " , "}, "FASTT_DEVICES"),
    ({"FASTT_STRATEGY": "fastest"}, "FASTT_STRATEGY"),
    ({"FASTT_WARMUP_STEPS": "1"}, "FASTT_WARMUP_STEPS"),
    ({"FASTT_PROFILE_STEPS": "three"}, "FASTT_PROFILE_STEPS"),
    ({"FASTT_MEASURE_STEPS": "-1"}, "FASTT_MEASURE_STEPS"),
    ({"FASTT_MEASURE_SECONDS": "-0.5"}, "FASTT_MEASURE_SECONDS"),
    ({"FASTT_MEASURE_SECONDS": "inf"}, "FASTT_MEASURE_SECONDS"),
    ({"FASTT_REPROFILE_EVERY": "x"}, "FASTT_REPROFILE_EVERY"),
    ({"FASTT_REPLAN_THRESHOLD": "2"}, "FASTT_REPLAN_THRESHOLD"),
    ({"FASTT_ORDER": "sometimes"}, "FASTT_ORDER"),
    ({"FASTT_SPLIT": "2"}, "FASTT_SPLIT"),
    ({"FASTT_STRICT": "y"}, "FASTT_STRICT"),
    ({"FASTT_LOG_LEVEL": "loud"}, "FASTT_LOG_LEVEL"),
    ({"FASTT_TRANSFER_PRIORITIES": "first"}, "FASTT_TRANSFER_PRIORITIES"),
    ({"FASTT_DEVICE_MEMORY_MB": "0"}, "FASTT_DEVICE_MEMORY_MB"),
    ({"FASTT_DEVICE_MEMORY_MB": "16GB"}, "FASTT_DEVICE_MEMORY_MB"),
    ({"FASTT_DEVICE_MEMORY_MB": "inf"}, "FASTT_DEVICE_MEMORY_MB"),
])
def test_invalid_values_name_the_variable(env, variable):
    with pytest.raises(SettingsError, match=variable):
        from_env(env)


def test_device_memory_bounds_every_device_fastt_plans_over():
    """``FASTT_DEVICE_MEMORY_MB``: a CPU's memory (unbounded otherwise) and a GPU's, when
    smaller than what the session lists."""
    from types import SimpleNamespace as NS

    from fastt.plugin import remote
    assert from_env({"FASTT_DEVICE_MEMORY_MB": "64"}).device_memory_mb == 64.0
    assert Settings().device_memory_mb == float("inf")
    gpu = "/job:localhost/replica:0/task:0/device:GPU:0"
    sess = NS(list_devices=lambda: [NS(name=LOCAL_CPU.format(0), device_type="CPU",
                                       memory_limit_bytes=0),
                                    NS(name=gpu, device_type="GPU", memory_limit_bytes=2 ** 30)])
    names = [LOCAL_CPU.format(0), gpu]
    assert [d.memory for d in remote.devices(sess, names)] == [float("inf"), 2 ** 30]
    assert [d.memory for d in remote.devices(sess, names, 64 * 2 ** 20)] == [64 * 2 ** 20] * 2
    assert [d.memory for d in remote.devices(sess, names, 2 ** 31)] == [2 ** 31, 2 ** 30]


def test_the_cpu_allocators_limit_is_read_as_its_allocator_reads_it_and_shared():
    """``TF_CPU_BFC_MEM_LIMIT_IN_MB`` bounds this process's CPU devices, in equal shares (one
    allocator serves them all), only where ``TF_CPU_ALLOCATOR_USE_BFC`` turns the BFC
    allocator on; a remote CPU stays unbounded; what TensorFlow enforces on the first device
    alone is the whole limit."""
    from types import SimpleNamespace as NS

    from fastt.plugin import remote
    on = {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPU_BFC_MEM_LIMIT_IN_MB": "300"}
    assert from_env(on).cpu_allocator_mb == 300.0
    assert from_env({**on, "TF_CPU_ALLOCATOR_USE_BFC": "1"}).cpu_allocator_mb == 300.0
    assert from_env({**on, "TF_CPU_ALLOCATOR_USE_BFC": "false"}).cpu_allocator_mb == \
        float("inf")
    assert from_env({"TF_CPU_ALLOCATOR_USE_BFC": "true"}).cpu_allocator_mb == float("inf")
    with pytest.raises(SettingsError, match="TF_CPU_BFC_MEM_LIMIT_IN_MB='lots': expected a "
                                            "whole number of megabytes > 0"):
        from_env({**on, "TF_CPU_BFC_MEM_LIMIT_IN_MB": "lots"})
    far = "/job:worker/replica:0/task:1/device:CPU:0"
    sess = NS(list_devices=lambda: [NS(name=n, device_type="CPU", memory_limit_bytes=0)
                                    for n in (LOCAL_CPU.format(0), LOCAL_CPU.format(1), far)])
    names = [LOCAL_CPU.format(0), LOCAL_CPU.format(1), far]
    assert [d.memory for d in remote.devices(sess, names, cpu_allocator=300.0)] == \
        [150.0, 150.0, float("inf")]
    assert [d.memory for d in remote.devices(sess, names, 100.0, 300.0)] == \
        [100.0, 100.0, 100.0]
    assert remote.enforced_memory(sess, names, 300.0) == 300.0
    assert remote.enforced_memory(sess, [far], 300.0) == float("inf")
    assert remote.enforced_memory(sess, names) == float("inf")
