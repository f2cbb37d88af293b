import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# fastt's plan cache (``fastt.plugin.cache``) of the scripts the tests run: not the user's
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="fastt-tests-cache-")


@pytest.fixture
def plugin(tmp_path):
    """``plugin(**settings)`` installs fastt's session plugin with the in-process test
    settings (``tests.plugin_helpers.settings``, dumps in ``tmp_path``); uninstalled
    after the test."""
    import fastt.plugin
    from tests.plugin_helpers import settings

    def install(**kw):
        fastt.plugin.install(settings(tmp_path, **kw))
    yield install
    fastt.plugin.uninstall()


# Test modules that run TensorFlow in processes they start, without naming it themselves
RUN_TENSORFLOW = {"test_examples.py", "test_cli.py", "test_hybrid.py", "test_pipeline.py",
                  "test_transfer_order.py"}


def _runs_tensorflow(path: Path, seen: dict[Path, bool] = {}) -> bool:
    if path not in seen:
        seen[path] = path.name in RUN_TENSORFLOW or "tensorflow" in path.read_text()
    return seen[path]


def pytest_collection_modifyitems(config, items):
    """The tiers: ``tf`` (runs TensorFlow, in this process or in processes it starts),
    ``slow`` (the same: seconds to minutes each; ``pytest -m "not slow"`` is the fast tier,
    the scheduling core, cost models, controller and CLI in about a minute) and ``cluster``
    (starts a local TensorFlow gRPC cluster)."""
    for item in items:
        if _runs_tensorflow(item.path):
            item.add_marker(pytest.mark.tf)
            item.add_marker(pytest.mark.slow)
        if "cluster" in item.path.name or "cluster" in item.name:
            item.add_marker(pytest.mark.cluster)
