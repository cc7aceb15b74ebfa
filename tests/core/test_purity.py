"""`copus.core` is pure math: importing it pulls in neither torch nor ray."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import copus.core


def _imported_in_a_fresh_process(modules, watched: tuple[str, ...]) -> list[str]:
    """Which of `watched` a fresh interpreter has imported after importing `modules`."""
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + f"print(','.join(m for m in {watched!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return out.split(",") if out else []


def test_core_imports_no_torch_and_no_ray():
    modules = [f"copus.core.{m.name}" for m in pkgutil.iter_modules(copus.core.__path__)]
    assert modules, "copus.core has no modules?"
    bad = _imported_in_a_fresh_process(modules, ("torch", "ray", "mlflow"))
    assert bad == [], f"copus.core imported {bad}"


# What `copus run`, `profile`, `compare`, `calibrate` and `gns` import in the driver's process.
DRIVER_MODULES = (
    "copus.cli",
    "copus.cluster.driver",
    "copus.cluster.profiler",
    "copus.cluster.compare",
    "copus.cluster.calibrate",
    "copus.cluster.gns_command",
    "copus.cluster.progress",
)


def test_the_driver_imports_no_torch():
    """torch is imported where a tensor is made (the workers): in the driver it was ~5 s of every
    command's start (the workers' entry points are named through copus.cluster.entry)."""
    assert _imported_in_a_fresh_process(DRIVER_MODULES, ("torch",)) == []


def test_only_cluster_imports_ray():
    import pathlib

    root = pathlib.Path(copus.core.__file__).parents[1]
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "cluster" not in p.relative_to(root).parts
        and any(line.strip().startswith(("import ray", "from ray")) for line in p.read_text().splitlines())
    ]
    assert offenders == []


def _imports(path) -> set[str]:
    """The modules a file imports (at any depth in the file), by their full dotted names."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_workloads_use_only_pure_copus_and_import_no_cycle():
    """Models and data (workloads/) may use copus.core's pure types, never the engine's layers:
    the engine receives a model as a spec (workloads.registry), not the other way round. And no
    two workloads modules import each other, directly or around a loop."""
    import pathlib

    folder = pathlib.Path(copus.core.__file__).parents[3] / "workloads"
    graph = {p.stem: _imports(p) for p in folder.glob("*.py") if p.stem != "__init__"}
    climbing = {
        m: sorted(i for i in imps if i.startswith("copus.") and not i.startswith("copus.core"))
        for m, imps in graph.items()
    }
    assert {m: v for m, v in climbing.items() if v} == {}
    edges = {
        m: {i.split(".")[1] for i in imps if i.startswith("workloads.") and i.split(".")[1] in graph}
        for m, imps in graph.items()
    }
    edges = {m: e - {m} for m, e in edges.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in edges[start])

    assert [m for m in graph if reaches(m, m, {m})] == []
