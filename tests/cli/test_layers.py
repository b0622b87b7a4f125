"""The house rules docs/architecture.md states, checked: no import circle among chunkbench's modules (imports
inside functions count: a lazy import only hides a circle; those under `if TYPE_CHECKING:` are annotations,
never run, and do not), no module much over 300 lines, no function much over 80, and no dates or issue
numbers in comments and docstrings."""

import ast
import importlib.metadata
import io
import re
import tokenize
from pathlib import Path

import networkx as nx

from tests.conftest import REPO

PACKAGES = {"chunkbench": REPO / "chunkbench", "chunkbench.sweeps": REPO / "sweeps"}
MOST_LINES = 330  # the house style's ~300, with a little room


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            if package == "chunkbench" and path.parent.name == "sweeps":
                continue
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    annotations_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
        for n in ast.walk(block)
    }
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
    shadowing = {
        name: installed[name]
        for name in folders
        if any(dist.lower() != "chunkbench" for dist in installed.get(name, []))
    }
    assert not shadowing, f"top-level folders named like installed packages: {shadowing}"


MOST_FUNCTION_LINES = 88  # the house style's ~80, with a little room


def test_no_function_over_about_80_lines():
    long = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MOST_FUNCTION_LINES:
                    long[f"{name}.{node.name}"] = length
    assert not long, f"functions over {MOST_FUNCTION_LINES} lines: {long}"


DATED = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\bissues? \d+\b", re.I)


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file."""
    text = path.read_text()
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((getattr(node, "lineno", 1), doc))
    return found


def test_no_dates_or_issue_numbers_in_comments_and_docstrings():
    """What was measured when lives in docs/measurements/ with its command; the code says what and why."""
    paths = [p for folder in ("chunkbench", "tests", "scripts", "sweeps") for p in (REPO / folder).rglob("*.py")]
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in paths
        for line, text in comments_and_docstrings(path)
        if DATED.search(text)
    ]
    assert not found, f"dates or issue numbers in comments or docstrings: {found}"
