"""The package's shape: imports run one way, no cycles, light entry points, small modules.

The import graph is read from the source (AST; nothing is imported), counting
every ``import`` anywhere in a module, function bodies included: a lazy import
still couples two modules.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "aspc"

# The compile half: it must run without the runtime or the CLI installed.
COMPILE_PACKAGES = (
    "aspc.anneal",
    "aspc.choices",
    "aspc.compiler",
    "aspc.costs",
    "aspc.emit",
    "aspc.io",
    "aspc.partition",
    "aspc.predict",
)
# Runtime layers, bottom first: a module may import its own layer or lower ones only.
RUNTIME_LAYERS = (
    ("aspc.runtime.config", "aspc.runtime.work", "aspc.runtime.lengths", "aspc.runtime.contracts"),
    ("aspc.runtime.core",),
    ("aspc.runtime.backends", "aspc.runtime.engines", "aspc.runtime.trainers"),
    ("aspc.runtime.registry",),
    ("aspc.runtime.record",),
    ("aspc.runtime.api", "aspc.runtime.calibrate"),
)
# Concrete backends, engines and trainers: built by name in the registry only.
CONCRETE = (
    "aspc.runtime.backends.sim",
    "aspc.runtime.backends.hf",
    "aspc.runtime.backends.vllm",
    "aspc.runtime.engines.threads",
    "aspc.runtime.engines.virtual",
    "aspc.runtime.engines.ray",
    "aspc.runtime.trainers.sim",
    "aspc.runtime.trainers.grpo",
)
MAX_LINES = 450
# Being split by the predictor work in parallel; remove once it lands.
TOO_LONG_FOR_NOW = {"aspc/predict/transformer.py"}


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The aspc module that ``name`` (a module or an attribute path) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    """aspc modules that ``module`` imports (``from pkg import submodule`` counts the submodule only)."""
    path, is_pkg = MODULES[module]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_pkg else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(target)
    return {o for name in found if name.split(".")[0] == "aspc" and (o := _owner(name)) and o != module}


def _third_party(module: str) -> set[str]:
    path, _ = MODULES[module]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


GRAPH = {m: _imports(m) for m in MODULES}


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_graph_reader_sees_imports():
    assert "aspc.runtime.core.scheduler" in GRAPH["aspc.runtime.core.events"]
    assert "aspc.runtime.backends.sim" in GRAPH["aspc.runtime.registry"]  # a function-level import


def test_no_import_cycles():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == [], f"import cycles: {cycles}"


def test_compile_packages_never_import_the_runtime_or_the_cli():
    bad = {
        m: sorted(d for d in deps if _within(d, ("aspc.runtime", "aspc.cli", "aspc.simulate", "aspc.report")))
        for m, deps in GRAPH.items()
        if _within(m, COMPILE_PACKAGES)
    }
    assert {m: d for m, d in bad.items() if d} == {}


def test_only_the_cli_imports_rich():
    users = sorted(m for m in MODULES if "rich" in _third_party(m) and not _within(m, ("aspc.cli",)))
    assert users == []


def test_runtime_layers_point_down():
    def layer(m: str) -> int | None:
        for i, prefixes in enumerate(RUNTIME_LAYERS):
            if _within(m, prefixes):
                return i
        return None

    up = []
    for m, deps in GRAPH.items():
        lm = layer(m)
        if lm is None:
            continue
        up += [(m, d) for d in deps if (ld := layer(d)) is not None and ld > lm]
    assert up == []


def test_only_the_registry_builds_concrete_classes():
    bad = []
    for m, deps in GRAPH.items():
        for d in deps & set(CONCRETE):
            family = d.rpartition(".")[0]  # backends, engines and trainers may build on their siblings
            if m != "aspc.runtime.registry" and not _within(m, (family,)):
                bad.append((m, d))
    assert bad == []


def test_library_never_imports_its_test_fixtures():
    users = sorted(m for m, deps in GRAPH.items() if not _within(m, ("aspc.testing",)) and any(
        _within(d, ("aspc.testing",)) for d in deps))
    assert users == []


def test_runtime_package_face_only_re_exports():
    tree = ast.parse((PKG / "runtime" / "__init__.py").read_text(encoding="utf-8"))
    kinds = {type(node).__name__ for node in tree.body}
    assert kinds <= {"Expr", "ImportFrom", "Import", "Assign", "FunctionDef"}
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [f.name for f in funcs] == ["__getattr__"]  # PEP 562: the lazy re-export, nothing else
    import aspc.runtime as face

    for name in face.__all__:
        assert getattr(face, name) is not None


def test_modules_stay_small():
    long = {
        str(path.relative_to(ROOT)): n
        for path, _ in MODULES.values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert {k: v for k, v in long.items() if k not in TOO_LONG_FOR_NOW} == {}


def _loaded_after(code: str) -> set[str]:
    """Top-level packages in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = (
        "import sys\n"
        f"{code}\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return set(out.stdout.split())


HEAVY = {"numba", "pyarrow", "torch", "transformers", "ray", "matplotlib"}


def test_the_scheduler_loads_neither_numba_nor_pyarrow():
    loaded = _loaded_after("import aspc.runtime.core.scheduler")
    assert loaded & HEAVY == set()


@pytest.mark.parametrize("args", [[], ["run"], ["simulate"], ["compile"], ["calibrate"]])
def test_help_imports_nothing_heavy(args):
    code = (
        "from aspc.cli import main\n"
        f"try:\n    main({[*args, '--help']!r}, standalone_mode=False)\n"
        "except SystemExit:\n    pass\n"
    )
    loaded = _loaded_after(code)
    assert loaded & HEAVY == set()


def test_cli_choices_are_the_library_names():
    from aspc.choices import MINIBATCH_COSTS, STRATEGIES
    from aspc.cli.run import run_cmd
    from aspc.cli.simulate import simulate_cmd
    from aspc.runtime.backends.options import DTYPES
    from aspc.runtime.config import RETURN_MODES
    from aspc.runtime.registry import BACKENDS, ENGINES

    def choices(cmd, flag):
        (opt,) = [p for p in cmd.params if flag in getattr(p, "opts", ())]
        return tuple(opt.type.choices)

    assert choices(run_cmd, "--backend") == BACKENDS
    assert choices(run_cmd, "--engine") == ENGINES
    assert choices(run_cmd, "--return-mode") == RETURN_MODES
    assert choices(run_cmd, "--dtype") == DTYPES
    assert choices(simulate_cmd, "--strategy") == STRATEGIES
    assert choices(simulate_cmd, "--minibatch-cost") == MINIBATCH_COSTS
