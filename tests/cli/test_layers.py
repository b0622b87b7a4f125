"""The house rules docs/architecture.md states, checked: no import circle among chunkbench's modules (imports
inside functions count: a lazy import only hides a circle; those under `if TYPE_CHECKING:` are annotations,
never run, and do not), and no module much over 300 lines."""

import ast
import importlib.metadata
from pathlib import Path

import networkx as nx

from tests.conftest import REPO

PACKAGES = {"chunkbench": REPO / "chunkbench", "chunkbench.engine": REPO / "engine",
            "chunkbench.sweeps": REPO / "sweeps"}
MOST_LINES = 330  # the house style's ~300, with a little room


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            if package == "chunkbench" and path.parent.name in ("engine", "sweeps"):
                continue
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    annotations_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                        and ast.unparse(block.test).endswith("TYPE_CHECKING") for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def test_no_import_circle():
    found = modules()
    graph = nx.DiGraph()
    for name, path in found.items():
        for target in imports(name, path, set(found)):
            if not (name.startswith(target + ".")):  # a module importing its own package's __init__
                graph.add_edge(name, target)
    cycles = [c for c in nx.simple_cycles(graph) if len(c) > 1]
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c + c[:1]) for c in cycles[:5])


def test_no_module_over_about_300_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MOST_LINES}
    assert not long, f"modules over {MOST_LINES} lines: {long}"


def test_no_top_level_folder_shadows_an_installed_package():
    """The repository's root is on sys.path in the tests (pytest's rootdir) and under `python -m` from it, so a
    top-level package folder named like an installed distribution's module hides that module: a top-level
    kernels/ hid Hugging Face's `kernels`, which transformers 5.25 imports, and every model load failed."""
    installed = importlib.metadata.packages_distributions()
    folders = {p.parent.name for p in REPO.glob("*/__init__.py")}
    shadowing = {name: installed[name] for name in folders
                 if any(dist.lower() != "chunkbench" for dist in installed.get(name, []))}
    assert not shadowing, f"top-level folders named like installed packages: {shadowing}"
