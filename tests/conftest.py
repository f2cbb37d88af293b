import os
import tempfile

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# fastt's plan cache (``fastt.plugin.cache``) of the scripts the tests run: not the user's
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="fastt-tests-cache-")


@pytest.fixture
def plugin(tmp_path):
    """``plugin(**settings)`` installs fastt's session plugin with the in-process test
    settings (``tests.test_session_plugin.settings``, dumps in ``tmp_path``); uninstalled
    after the test."""
    import fastt.plugin
    from tests.test_session_plugin import settings

    def install(**kw):
        fastt.plugin.install(settings(tmp_path, **kw))
    yield install
    fastt.plugin.uninstall()
