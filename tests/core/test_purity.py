"""`copus.core` is pure math: importing it pulls in neither torch nor ray."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import copus.core


def test_core_imports_no_torch_and_no_ray():
    modules = [f"copus.core.{m.name}" for m in pkgutil.iter_modules(copus.core.__path__)]
    assert modules, "copus.core has no modules?"
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "bad = [m for m in ('torch', 'ray', 'mlflow') if m in sys.modules]\nprint(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"copus.core imported {out}"


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
