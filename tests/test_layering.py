"""The layering rules, checked: the scheduling core, the cost models and ``fastt.inspect``
import no TensorFlow (so their tests run in seconds and they can be used without it), only
``tf_patches/`` reaches into TensorFlow's internals (``tensorflow.python``), every module
imports only from its own room or the rooms below it (``LAYERS``), and no imports go round in a
circle."""
import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# TensorFlow-free: IR, profiler, cost models, scheduler and simulator, dumps and reports
CORE = ("fastt.aside", "fastt.ir", "fastt.profiler", "fastt.sharing", "fastt.schemas",
        "fastt.costs", "fastt.passes", "fastt.sched", "fastt.inspect")
TF_SIDE = ("tensorflow", "tf_keras", "tf_slim", "tf_patches", "fastt.adapters", "fastt.plugin")
# The rooms from the bottom up; a module belongs to the longest prefix naming it and imports
# (at module level, inside functions or for type checking) only from its room or lower ones.
LAYERS = (
    ("fastt", "fastt._version", "fastt.aside", "fastt.errors", "fastt.jsonio",
     "fastt.dtypes", "fastt.devices", "fastt.op_types", "fastt.sharing", "fastt.schemas"),
    ("fastt.ir",),
    ("fastt.profiler",),
    ("fastt.costs",),
    ("fastt.passes",),
    ("fastt.sched.sim",),
    ("fastt.sched.placers",),
    ("fastt.sched.registry",),
    ("fastt.sched.search",),
    ("fastt.sched",),
    ("fastt.inspect",),
    ("tf_patches",),
    ("fastt.zoo", "fastt.cluster"),
    ("fastt.adapters",),
    ("fastt.plugin",),
    ("fastt.demo", "fastt.fit_cmd", "fastt.plan_cmd", "fastt.verify_cmd"),
    ("fastt.cli", "fastt.startup"),
)


def _modules() -> dict[str, str]:
    """Every module of the project: dotted name -> file."""
    out = {}
    for top in ("fastt", "tf_patches"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, f), ROOT)[:-3]
                    name = rel.replace(os.sep, ".").removesuffix(".__init__")
                    out[name] = os.path.join(folder, f)
    return out


def _imports(path: str, module: str, top_level_only: bool) -> set[str]:
    """Dotted names ``path`` imports (module level only, or also inside functions)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # also imports under module-level if/try blocks
        nodes = [n for stmt in tree.body for n in ast.walk(stmt)
                 if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        nodes += [n for stmt in tree.body if isinstance(stmt, ast.ClassDef)
                  for n in stmt.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    found = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            found.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:  # relative: resolve against this module's package
                pkg = module.split(".")
                pkg = pkg[:len(pkg) - n.level + (1 if path.endswith("__init__.py") else 0)]
                base = ".".join(pkg + ([n.module] if n.module else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in n.names)
    return found


def _resolve(name: str, modules: dict[str, str]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _chain_to_tf_side(start: str, modules: dict[str, str], top_level_only: bool
                      ) -> list[str] | None:
    """An import chain from ``start`` to a TensorFlow-side module, or None."""
    seen, stack = {start}, [[start]]
    while stack:
        path = stack.pop()
        for name in sorted(_imports(modules[path[-1]], path[-1], top_level_only)):
            if any(name == t or name.startswith(t + ".") for t in TF_SIDE):
                return path + [name]
            mod = _resolve(name, modules)
            while mod:  # importing a.b.c runs a/__init__ and a/b/__init__ too
                if mod in modules and mod not in seen:
                    seen.add(mod)
                    stack.append(path + [mod])
                mod = mod.rpartition(".")[0]
    return None


def test_the_core_imports_nothing_from_the_tensorflow_side():
    modules = _modules()
    core = [m for m in modules if any(m == c or m.startswith(c + ".") for c in CORE)]
    assert len(core) > 20, core  # the walk found the packages
    chains = {m: c for m in core if (c := _chain_to_tf_side(m, modules, True))}
    assert not chains, "\n".join(" -> ".join(c) for c in chains.values())


def test_the_cores_deferred_imports_stay_off_the_tensorflow_side_too():
    modules = _modules()
    core = [m for m in modules if any(m == c or m.startswith(c + ".") for c in CORE)]
    chains = {m: c for m in core if (c := _chain_to_tf_side(m, modules, False))}
    assert not chains, "\n".join(" -> ".join(c) for c in chains.values())


def test_importing_the_core_loads_no_tensorflow():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in CORE) +
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'tf_keras', 'tf_slim', 'tf_patches'))\n"
            "print(bad[:5])\nsys.exit(1 if bad else 0)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_scheduler_plans_without_importing_scikit_learn():
    # scikit-learn (a second to import) serves the link regression, not the scheduler
    code = ("import sys\nimport fastt.sched.strategy, fastt.sched.registry\n"
            "sys.exit(1 if 'sklearn' in sys.modules else 0)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("top", ["fastt", "benchmarks", "examples"])
def test_only_tf_patches_reaches_into_tensorflow_internals(top):
    bad = []
    for folder, _, files in os.walk(os.path.join(ROOT, top)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                for name in _imports(path, "", False):
                    if name == "tensorflow.python" or name.startswith("tensorflow.python."):
                        bad.append(f"{os.path.relpath(path, ROOT)}: {name}")
    assert not bad, bad


def _layer(module: str) -> int:
    """The index in ``LAYERS`` of the room ``module`` belongs to (-1: none)."""
    best, found = "", -1
    for i, room in enumerate(LAYERS):
        for prefix in room:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, found = prefix, i
    return found


def _edges(modules: dict[str, str]) -> dict[str, set[str]]:
    """module -> the project's modules it imports, anywhere in its file."""
    out = {}
    for m, path in modules.items():
        targets = {_resolve(n, modules) for n in _imports(path, m, False)}
        out[m] = {t for t in targets if t and t != m and not m.startswith(t + ".")}
    return out


def upward_imports(modules: dict[str, str]) -> list[str]:
    """``a -> b`` for every import of a module in a higher room than the importer's."""
    return sorted(f"{a} -> {b}" for a, targets in _edges(modules).items() for b in targets
                  if _layer(b) > _layer(a))


def import_circles(modules: dict[str, str]) -> list[list[str]]:
    """The sets of modules that import each other round a circle (Tarjan's strongly connected
    components, O(modules + imports))."""
    edges = _edges(modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                circles.append(sorted(members))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return circles


def test_every_module_has_a_room():
    assert [m for m in _modules() if _layer(m) < 0] == []


def test_no_module_imports_from_a_room_above_its_own():
    assert upward_imports(_modules()) == []


def test_no_imports_go_round_in_a_circle():
    assert import_circles(_modules()) == []


def test_the_room_checks_see_a_violation(tmp_path):
    pkg = tmp_path / "fastt"
    (pkg / "ir").mkdir(parents=True)
    (pkg / "costs").mkdir()
    (pkg / "ir" / "a.py").write_text("def f():\n    from fastt.costs import b\n")
    (pkg / "costs" / "b.py").write_text("from fastt.ir.a import f\n")
    modules = {"fastt.ir.a": str(pkg / "ir" / "a.py"), "fastt.costs.b": str(pkg / "costs" / "b.py")}
    assert upward_imports(modules) == ["fastt.ir.a -> fastt.costs.b"]
    assert import_circles(modules) == [["fastt.costs.b", "fastt.ir.a"]]


def test_the_checker_sees_a_violation(tmp_path):
    # a core module importing the TensorFlow side through another module is found
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import b\n")
    b.write_text("def f():\n    import tensorflow\n")
    modules = {"a": str(a), "b": str(b)}
    assert _chain_to_tf_side("a", modules, True) is None
    assert _chain_to_tf_side("a", modules, False) == ["a", "b", "tensorflow"]
    b.write_text("from fastt.adapters import rewrite\n")
    assert _chain_to_tf_side("a", modules, True) == ["a", "b", "fastt.adapters"]

