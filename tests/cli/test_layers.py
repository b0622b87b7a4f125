"""The house rules docs/architecture.md states, checked: each package imports only itself and the floors below it
in that page's diagram (every import counts: lazy ones and those under `if TYPE_CHECKING:`), no import circle among
modules, no module much over 300 lines, no function much over 80."""

import ast
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import networkx as nx
import pytest

from tests.conftest import REPO

MOST_LINES = 330  # the house style's ~300, with a little room
MOST_FUNCTION_LINES = 88  # the house style's ~80, with a little room
ROOT = "__init__.py"  # the root package's own module (chunkbench.LLM): the diagram's name for it


def package_dirs() -> dict[str, Path]:
    """Each installed package whose folder pyproject.toml maps elsewhere (engine/, kernels/, sweeps/), and the root."""
    mapped = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {package: REPO / folder for package, folder in mapped.items()}


def modules() -> dict[str, Path]:
    """Every module of chunkbench by its dotted name, wherever its folder lies in the repository."""
    roots = package_dirs()
    found = {}
    for package, folder in roots.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            if not any(
                name.startswith(other + ".") and other != package for other in roots if len(other) > len(package)
            ):
                found[name] = path
    return found


def floors() -> list[list[str]]:
    """The diagram under "## Layers" in docs/architecture.md, top floor first: each line's leading names
    (`tune/`, `gate.py`), before its description."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    found = []
    for line in block.splitlines():
        names = []
        for word in line.split():
            if not re.fullmatch(r"\w+(/|\.py)", word):
                break
            names.append(word.removesuffix("/").removesuffix(".py") if word != ROOT else ROOT)
        if names:
            found.append(names)
    return found


def package_of(module: str) -> str:
    """The floor a module stands on: `chunkbench.bench.runs` -> bench, `chunkbench.errors` -> errors."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def imports(name: str, text: str, is_package: bool, known: set[str], type_only: bool = True) -> set[str]:
    """The chunkbench modules a module's text imports, lazy ones included; `type_only=False` leaves out those
    under `if TYPE_CHECKING:` (never run: no circle at run time)."""
    package = name if is_package else name.rpartition(".")[0]
    tree = ast.parse(text)
    annotations_only = set()
    if not type_only:
        annotations_only = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
            for n in ast.walk(block)
        }
    found = set()
    for node in ast.walk(tree):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        named = [t for t in targets if t in known and t != name]
        if named:
            found.add(max(named, key=len))  # `from chunkbench import servers` imports chunkbench.servers
    return found


def against_the_floors(sources: dict[str, tuple[str, bool]], table: list[list[str]]) -> list[str]:
    """Every import from one package into another on its own floor or above: `module -> target`."""
    level = {package: i for i, floor in enumerate(table) for package in floor}
    known = set(sources)
    found = []
    for name, (text, is_package) in sources.items():
        here = package_of(name)
        for target in imports(name, text, is_package, known):
            there = package_of(target)
            if there != here and level[there] <= level[here]:
                found.append(f"{name} -> {target}")
    return sorted(found)


def sources() -> dict[str, tuple[str, bool]]:
    return {name: (path.read_text(), path.name == "__init__.py") for name, path in modules().items()}


def test_every_package_stands_on_one_floor_of_the_diagram():
    placed = [package for floor in floors() for package in floor]
    assert len(placed) == len(set(placed)), f"a package on two floors: {placed}"
    assert {package_of(name) for name in modules()} == set(placed)


def test_each_package_imports_only_the_floors_below_it():
    wrong = against_the_floors(sources(), floors())
    assert not wrong, "imports against docs/architecture.md's layers: " + "; ".join(wrong)


def test_a_planted_upward_import_fails_the_layer_check():
    planted = dict(sources())
    planted["chunkbench.engine.planted"] = ("def f():\n    from chunkbench.tune import run\n", False)
    planted["chunkbench.sim.typed"] = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from chunkbench.bench.metrics import RequestRecord\n",
        False,
    )
    planted["chunkbench.bench.sideways"] = ("from chunkbench import backends\n", False)
    assert against_the_floors(planted, floors()) == [
        "chunkbench.bench.sideways -> chunkbench.backends",
        "chunkbench.engine.planted -> chunkbench.tune.run",
        "chunkbench.sim.typed -> chunkbench.bench.metrics",
    ]


def test_no_import_cycle_between_packages_type_only_imports_included():
    graph = nx.DiGraph()
    for name, (text, is_package) in sources().items():
        for target in imports(name, text, is_package, set(modules())):
            if package_of(target) != package_of(name):
                graph.add_edge(package_of(name), package_of(target))
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"package cycles: {cycles[:5]}"


def test_no_import_circle_between_modules():
    graph = nx.DiGraph()
    found = modules()
    for name, path in found.items():
        for target in imports(name, path.read_text(), path.name == "__init__.py", set(found), type_only=False):
            if not name.startswith(target + "."):  # a module importing its own package's __init__
                graph.add_edge(name, target)
    cycles = [c for c in nx.simple_cycles(graph) if len(c) > 1]
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c + c[:1]) for c in cycles[:5])


def test_no_module_over_about_300_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MOST_LINES}
    assert not long, f"modules over {MOST_LINES} lines: {long}"


def test_no_function_over_about_80_lines():
    long = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MOST_FUNCTION_LINES:
                    long[f"{name}.{node.name}"] = length
    assert not long, f"functions over {MOST_FUNCTION_LINES} lines: {long}"


def test_the_top_level_kernels_folder_hides_no_installed_kernels():
    """kernels/ sits at the top of the checkout (installed as chunkbench.kernels); transformers imports Hugging
    Face's `kernels`. The tests put the checkout last on sys.path (tests/conftest.py) and `python -m
    chunkbench.cli` moves it last, so the installed one is found in both."""
    ours = str(REPO / "kernels" / "__init__.py")
    spec = importlib.util.find_spec("kernels")
    assert spec is None or spec.origin != ours
    probe = (
        "import atexit, importlib.util, runpy, sys; "
        "atexit.register(lambda: print('KERNELS', getattr(importlib.util.find_spec('kernels'), 'origin', None))); "
        "sys.argv = ['chunkbench', '--help']; runpy.run_module('chunkbench.cli', run_name='__main__')"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120).stdout
    origin = out.split("KERNELS ", 1)[1].strip()
    assert origin != ours


@pytest.mark.parametrize("module", ["chunkbench.engine", "chunkbench.kernels", "chunkbench.sweeps"])
def test_mapped_packages_import_from_their_top_level_folders(module):
    spec = importlib.util.find_spec(module)
    assert Path(spec.origin).parent == package_dirs()[module]
