"""Comments and docstrings say what holds today: no dates or issue numbers (what was measured when lives in
docs/measurements/), no path to a file of ours that is gone, no reference to a module or class of ours that does not
define the name cited, and module docstrings short enough to read before the code.

A cited path is ours when its first folder is one of ours (found from the repository's root, from chunkbench/ or
from the citing module's folder); a bare Python file name must be a file of ours somewhere. Another project's file
is cited by its own path (`vllm/v1/core/sched/scheduler.py`), whose first folder is not ours.

A reference `a.b` (or `a.b.c`) is checked when `a` names one of ours: a module by its short name (`harness`,
`presearch`) or a class (`Scheduler.advance`). Left alone: an `a` the file's code uses that is not an import of
ours (a variable's attribute), an importable or built-in module (`torch.cuda`), a file name (`vllm.yaml`), another
project's class, and OTHERS. Any other lowercase `a` names a module that is gone."""

import ast
import builtins
import functools
import importlib.util
import io
import re
import tokenize
from pathlib import Path

from tests.conftest import REPO

FOLDERS = ("chunkbench", "engine", "kernels", "tests", "scripts", "sweeps")
MOST_DOC_LINES = 12  # a module docstring of ~10 lines, with a little room
DATED = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\bissues? \d+\b", re.I)
PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w-]+\.(?:py|md|toml|json|csv|yaml|c|sh)|[\w-]+\.py)\b")
REFERENCE = re.compile(r"(?<![\w./-])([A-Za-z_]\w*)((?:\.[A-Za-z_]\w*)+)(?![\w/-])")
FILE_KINDS = set("py md json jsonl yaml yml toml csv txt c sh html parquet png log so".split())  # `vllm.yaml`
# git ignores the folders commands write to (results/runs/, results/profiles/): a path there names an output.
OUTPUTS = tuple(line for line in (REPO / ".gitignore").read_text().split() if line.endswith("/"))
# Names that prose cites as `a.b` and are no module of ours: vLLM's and SGLang's packages, numpy's alias, OpenAI
# API fields, and variables the text names without the code using them.
OTHERS = {"vllm", "sglang", "np", "gpu_model_runner", "usage", "stream_options", "args", "self", "cls"}


def python_files(folders=FOLDERS) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py"))


def comments_and_docstrings(text: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file's text."""
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


@functools.cache
def our_modules() -> dict[str, list[Path]]:
    """Each importable module of ours (scripts/ are run, not imported) by its short name (`harness`; a package's by
    its folder's) with every file so named."""
    found = {}
    for path in python_files(tuple(f for f in FOLDERS if f != "scripts")):
        found.setdefault(path.parent.name if path.name == "__init__.py" else path.stem, []).append(path)
    return found


def stale_paths(text: str, folder: Path) -> list[str]:
    """The paths of ours in `text`, cited from a module in `folder`, that name no file or folder."""
    bases = (REPO, REPO / "chunkbench", folder)
    stale = []
    for path in PATH.findall(text):
        if path.startswith(OUTPUTS):
            continue
        if "/" not in path:
            if not any(p.name == path for p in python_files()):
                stale.append(path)
        elif any((base / path.split("/")[0]).is_dir() for base in bases):
            if not any((base / path).exists() for base in bases):
                stale.append(path)
    return stale


@functools.cache
def top_level(path: Path) -> dict[str, ast.AST]:
    """A module's top-level names (defined, assigned or imported) with the statement that binds each."""
    names = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update({n.id: node for n in ast.walk(target) if isinstance(n, ast.Name)})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:` and `try: import` bind names too
            names.update({n.id: node for n in ast.walk(node) if isinstance(n, ast.Name)})
    return names


@functools.cache
def our_classes() -> dict[str, list[ast.ClassDef]]:
    found = {}
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(node)
    return found


def has_member(cls: ast.ClassDef, name: str, depth: int = 0) -> bool:
    """A class of ours defines `name` (in its body, as an attribute its methods set, or through a base), or has
    a base from elsewhere, which may."""
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            if getattr(node, "id", None) == name or getattr(node, "attr", None) == name:
                return True
    bases = [ast.unparse(b).rpartition(".")[2] for b in cls.bases]
    if any(b not in our_classes() and b not in ("object", "Protocol") for b in bases):
        return True
    return depth < 5 and any(has_member(c, name, depth + 1) for b in bases for c in our_classes().get(b, []))


def defines(path: Path, chain: list[str]) -> bool:
    """The module at `path` holds `chain` (`["server", "fit"]`: a submodule then a name, or a class's member)."""
    name, rest = chain[0], chain[1:]
    if path.name == "__init__.py":
        inside = path.parent / name
        for sub in (inside / "__init__.py", inside.with_suffix(".py")):
            if sub.exists():
                return not rest or defines(sub, rest)
    node = top_level(path).get(name)
    if node is None:
        return False
    return not rest or not isinstance(node, ast.ClassDef) or has_member(node, rest[0])


@functools.cache
def importable(name: str) -> bool:
    return hasattr(builtins, name) or importlib.util.find_spec(name) is not None


def code_names(tree: ast.AST) -> tuple[set[str], dict[str, str]]:
    """The names a module's code uses, and those that import a module of ours, with that module's short name."""
    names, ours = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and (node.level or node.module.startswith("chunkbench")):
            ours.update({a.asname or a.name: a.name for a in node.names if a.name in our_modules()})
    return names | set(ours), ours


def stale_references(text: str, names: set[str] = frozenset(), ours: dict[str, str] | None = None) -> list[str]:
    """The references `a.b` in `text` to a module or class of ours that does not hold `b`; `names` and `ours`:
    the citing file's code_names."""
    stale, ours = [], ours or {}
    for first, rest in REFERENCE.findall(text):
        chain, module = rest[1:].split("."), ours.get(first, first)
        if chain[-1] in FILE_KINDS or len(first) == 1 or (first in names and first not in ours):
            continue
        if first[0].isupper():
            classes = our_classes().get(first, [])
            if classes and not any(has_member(c, chain[0]) for c in classes):
                stale.append(first + rest)
        elif module not in OTHERS and not importable(module):
            if not any(defines(path, chain) for path in our_modules().get(module, [])):
                stale.append(first + rest)
    return stale


def test_no_dates_or_issue_numbers_in_comments_and_docstrings():
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in python_files()
        for line, text in comments_and_docstrings(path.read_text())
        if DATED.search(text)
    ]
    assert not found, f"dates or issue numbers in comments or docstrings: {found}"


def test_comments_and_docstrings_cite_files_that_exist():
    found = [
        f"{path.relative_to(REPO)}:{line} {cited}"
        for path in python_files()
        for line, text in comments_and_docstrings(path.read_text())
        for cited in stale_paths(text, path.parent)
    ]
    assert not found, "cited paths that do not exist:\n" + "\n".join(found)


def test_comments_and_docstrings_cite_names_that_exist():
    found = []
    for path in python_files():
        text = path.read_text()
        names, ours = code_names(ast.parse(text))
        for line, words in comments_and_docstrings(text):
            found += [f"{path.relative_to(REPO)}:{line} {cited}" for cited in stale_references(words, names, ours)]
    assert not found, "cited names that do not exist:\n" + "\n".join(found)


def test_a_planted_stale_citation_fails_the_checks():
    text = "# see bench/workload.py, tests/foo/test_x.py, docs/x.md, gone.py; calibrate.fit, harness.no_such_thing"
    (_, comment), *_ = comments_and_docstrings(text)
    assert stale_paths(comment, REPO / "chunkbench") == [
        "bench/workload.py",
        "tests/foo/test_x.py",
        "docs/x.md",
        "gone.py",
    ]
    assert stale_references(comment) == ["calibrate.fit", "harness.no_such_thing"]
    assert stale_references("Scheduler.no_such_method, BlockManager.allocate") == ["Scheduler.no_such_method"]
    assert DATED.search("# measured 2026-12-05") and DATED.search("# see issue 12")


def test_the_checks_leave_others_names_alone():
    fine = (
        "vllm/v1/core/sched/scheduler.py, engine/scheduler.py, sim/families.py, harness.py; config.scheduler, "
        "spec.backend, self.x, vllm.yaml, np.diff, torch.cuda, LLMEngine.step, harness.run_workload, "
        "presearch.server.fit"
    )
    assert stale_paths(fine, REPO / "chunkbench" / "bench") == []
    assert stale_references(fine, names={"config", "spec"}) == []


def test_module_docstrings_are_short():
    """A module's docstring says what it does and why; figures and how they were found go to docs/measurements/."""
    long = {}
    for path in python_files(("chunkbench", "engine", "kernels")):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
        if len(doc.splitlines()) > MOST_DOC_LINES:
            long[str(path.relative_to(REPO))] = len(doc.splitlines())
    assert not long, f"module docstrings over {MOST_DOC_LINES} lines: {long}"
