"""The architecture as a static contract: the import contracts of pyproject.toml ([tool.importlinter]) hold on the
code (checked by import-linter, as tools/test.sh does), and they break when an import crosses a layer (the same
linter run on a copy of the code with one forbidden import added); the package has no import cycle, function-level
imports included; an import inside a function says why it is there; and functions fit on a screen."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("edgetrain", "loaders", "android_demo")
grimp = pytest.importorskip("grimp", reason="import-linter (edgetrain[dev]) checks the layers")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """import-linter with cwd's pyproject.toml, on the packages found in cwd (ahead of the installed ones)."""
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_contracts_hold():
    proc = lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 kept, 0 broken" in proc.stdout, proc.stdout


# (file, the import added, the contract that must break)
CROSSINGS = {
    "core imports the build side": ("edgetrain/core/ir.py", "import edgetrain.derive.pipeline", "layers"),
    "graph imports the runtime": (
        "edgetrain/graph/passes.py",
        "from edgetrain.runtime import trainer",
        "layers",
    ),
    "runtime imports the build side": (
        "edgetrain/runtime/trainer.py",
        "import edgetrain.derive.losses",
        "layers",
    ),
    "the build side imports the runtime": (
        "edgetrain/derive/params.py",
        "import edgetrain.runtime.fused",
        "layers",
    ),
    "the runtime imports onnx": ("edgetrain/runtime/feeding.py", "import onnx", "device"),
    "the runtime imports the ONNX reader at the top": (
        "edgetrain/runtime/describe.py",
        "from edgetrain.onnx_io import reader",
        "device",
    ),
    "the phone app imports the converter": (
        "android_demo/policy.py",
        "import edgetrain.derive.pipeline",
        "device",
    ),
    "loaders imports the runtime": ("loaders/views.py", "import edgetrain.runtime", "loaders"),
    "an import inside a function counts": (
        "edgetrain/core/container.py",
        "def _later():\n    from edgetrain.graph import memory  # noqa: F401",
        "layers",
    ),
}


@pytest.mark.parametrize("case", list(CROSSINGS))
def test_a_forbidden_import_breaks_its_contract(tmp_path, case):
    path, line, contract = CROSSINGS[case]
    for pkg in PACKAGES:
        shutil.copytree(
            ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "data", "static")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / path
    target.write_text(target.read_text() + "\n" + line + "\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode != 0, proc.stdout
    names = {
        "layers": "edgetrain's layers",
        "device": "the device side needs numpy alone",
        "loaders": "loaders",
    }
    broken = [ln for ln in proc.stdout.splitlines() if " BROKEN" in ln]
    assert any(ln.startswith(names[contract]) for ln in broken), proc.stdout
    module = path.removesuffix(".py").replace("/", ".")
    assert module in proc.stdout, proc.stdout  # the report names the importer


def _cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself), by Tarjan."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in graph.modules or graph.is_module_squashed(w):
                continue
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
            if len(comp) > 1 or v in graph.find_modules_directly_imported_by(v):
                found.append(sorted(comp))

    for m in sorted(graph.modules):
        if m not in index and m.split(".")[0] in PACKAGES:
            visit(m)
    return found


def test_no_import_cycles():
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False)
    assert len(graph.modules) > 80
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for m in ("edgetrain.a", "edgetrain.b", "edgetrain.c"):
        graph.add_module(m)
    graph.add_import(importer="edgetrain.a", imported="edgetrain.b")
    graph.add_import(importer="edgetrain.b", imported="edgetrain.c")
    assert _cycles(graph) == []
    graph.add_import(importer="edgetrain.c", imported="edgetrain.a")
    assert _cycles(graph) == [["edgetrain.a", "edgetrain.b", "edgetrain.c"]]


def _function_imports(source: str) -> list[tuple[int, str]]:
    """(line, text) of every import statement inside a function."""
    found = []
    lines = source.splitlines()
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found.append((node.lineno, "\n".join(lines[node.lineno - 1 : node.end_lineno])))
    return sorted(set(found))


def test_an_import_inside_a_function_says_why():
    """Imports belong at the top of a module. One inside a function is for an optional dependency (onnx,
    matplotlib, flwr, threadpoolctl, ...) or for what it would cost every start-up, and its line says so."""
    silent = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for line, text in _function_imports(path.read_text()):
                if "#" not in text:
                    silent.append(f"{path.relative_to(ROOT)}:{line}: {text.strip()}")
    assert silent == [], "\n".join(silent)


def test_the_reason_check_sees_imports_inside_functions():
    source = "import os\n\ndef f():\n    import json\n    from . import x  # optional: x needs y\n"
    assert [line for line, _ in _function_imports(source)] == [4, 5]


def test_functions_fit_on_a_screen():
    """No function of the package is longer than 80 lines (CONTRIBUTING.md, style)."""
    long = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for fn in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and fn.end_lineno - fn.lineno >= 80
                ):
                    long.append(
                        f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name}: {fn.end_lineno - fn.lineno + 1}"
                    )
    assert long == [], "\n".join(long)
