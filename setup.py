"""fastt: automatic parallelization of TensorFlow graph-mode training (FastT, Middleware 2020)."""
import os
import re
import shutil

from setuptools import Extension, find_packages, setup
from setuptools.command.build_py import build_py

TF_SERIES = "~=2.21.0"


def tensorflow_requirement() -> list:
    """Which TensorFlow wheel to depend on.

    ``FASTT_TF_PACKAGE`` chooses (``tensorflow``, ``tensorflow-cpu``, or ``none`` to keep the
    TensorFlow already installed); otherwise the full wheel where an NVIDIA GPU is visible and
    ``tensorflow-cpu`` elsewhere. Never both: they install the same ``tensorflow`` module.
    """
    choice = os.environ.get("FASTT_TF_PACKAGE", "").strip()
    if choice == "none":
        return []
    if choice:
        if choice not in ("tensorflow", "tensorflow-cpu"):
            raise SystemExit(f"FASTT_TF_PACKAGE={choice!r}: expected tensorflow, "
                             "tensorflow-cpu or none")
        return [choice + TF_SERIES]
    gpu = os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None
    return [("tensorflow" if gpu else "tensorflow-cpu") + TF_SERIES]


class build_py_with_hook(build_py):
    """Also ship ``fastt.pth``, the start-up hook, at the root of site-packages."""

    def run(self) -> None:
        super().run()
        self.copy_file(os.path.join(here, "fastt.pth"), os.path.join(self.build_lib, "fastt.pth"))

    def get_outputs(self, include_bytecode: bool = True) -> list:
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, "fastt.pth")]


def priority_executor() -> list:
    """The priority executor plugin, compiled against the TensorFlow of the build environment
    (``pyproject.toml`` puts the same series there). Optional: without TensorFlow headers or a
    C++ compiler the package installs without it, and ordering uses control dependencies."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
        compile_flags, link_flags = tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()
        version = tf.__version__
    except Exception as e:  # noqa: BLE001 - any failure means: build without it
        print(f"fastt: not building the priority executor ({type(e).__name__}: {e})")
        return []
    return [Extension(
        "tf_patches._priority_executor", ["tf_patches/native/priority_executor.cc"],
        language="c++", optional=True,
        extra_compile_args=compile_flags + ["-O2", "-w", "-fvisibility=hidden",
                                            f'-DFASTT_TF_VERSION="{version}"'],
        extra_link_args=link_flags)]


here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "fastt", "_version.py"), encoding="utf-8") as f:
    version = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)

setup(
    name="fastt",
    version=version,
    description="Automatic placement, ordering and splitting of TensorFlow graph-mode training",
    long_description=open(os.path.join(here, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["fastt", "fastt.*", "tf_patches", "tf_patches.*"]),
    package_data={"fastt.schemas": ["*.json"], "fastt.costs": ["calibration.json"]},
    install_requires=tensorflow_requirement() + [
        "numpy>=1.26",
        "scikit-learn>=1.3",
        "networkx>=3.0",
        "scipy>=1.11",  # HiGHS, for m-SCT's linear program
        "grpcio>=1.60",
        "matplotlib>=3.7",  # the charts of strategy reports (fastt.inspect)
    ],
    extras_require={
        # tf-keras (needed by tf-slim's nets) must be installed with --no-deps next to
        # tensorflow-cpu: it names the full `tensorflow` wheel. The README's test command does.
        "test": ["pytest>=7", "tf-slim==1.1.0", "ruff>=0.5", "mypy>=1.10"],
    },
    entry_points={"console_scripts": ["fastt=fastt.cli:main"]},
    # Optional: without a C compiler the package still installs, local clusters warn that
    # their servers listen on every interface, and the simulator runs its loop in Python.
    ext_modules=[Extension("tf_patches._bind_loopback", ["tf_patches/native/bind_loopback.c"],
                           libraries=["dl"], optional=True),
                 Extension("fastt.sched.sim._simcore",
                           ["fastt/sched/sim/_simcore.c", "fastt/sched/sim/_simpeaks.c",
                            "fastt/sched/sim/_simeft.c", "fastt/sched/sim/_simedges.c"],
                           depends=["fastt/sched/sim/_simcore.h"], extra_compile_args=["-O2"],
                           optional=True)] + priority_executor(),
    cmdclass={"build_py": build_py_with_hook},
)
