"""Objectives are registered once (chunkbench/tune/objectives/registry.py): one registered from outside the
package tunes end to end through the CLI, and nothing outside the package tells objectives apart by name."""

from __future__ import annotations

import ast
from pathlib import Path

import optuna
import pytest

from chunkbench.errors import UserError
from chunkbench.tune.objectives import OBJECTIVES, Objective, get, register, unregister
from tests.conftest import REPO, run_cli

PACKAGE = REPO / "chunkbench" / "tune" / "objectives"


class Throughput(Objective):
    """Output tokens/s at the workload's rate, the SLAs as constraints: a toy objective of this module."""

    name = "toy-throughput"
    help = "toy-throughput (output tokens/s)"
    value_labels = ("output throughput (tok/s)",)
    headline_name = "output throughput"
    column = ("throughput tok/s", "output_throughput")
    rows = (("output_throughput", "output tok/s"),)

    def values(self, summary: dict) -> list[float]:
        return [summary["output_throughput"]]


@pytest.fixture
def toy():
    objective = register(Throughput())
    yield objective
    unregister(objective.name)


def test_a_registered_objective_tunes_end_to_end_and_its_study_resumes(toy, tmp_path, capsys):
    out = tmp_path / "toy"
    args = [
        "tune",
        "--backend",
        "sim",
        "--model",
        "llama-3-8b",
        "--no-progress",
        "--objective",
        toy.name,
        "--sla-ttft",
        "2s",
        "--num-requests",
        "20",
        "--rate",
        "4",
        "--out",
        str(out),
    ]
    code, stdout, err = run_cli([*args, "--n-trials", "3"], capsys)
    assert code == 0, err
    assert f"({toy.name}, simulated" in stdout and "throughput tok/s" in stdout.replace("\n", " ")
    assert "Margin:" in stdout and "output throughput" in stdout
    for name in ("recommended.toml", "trials.csv", "search.png", "knobs.png", "report.html"):
        assert (out / name).exists(), name
    url = f"sqlite:///{out / 'study.db'}"
    study = optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url)
    assert study.study_name.endswith(f"-{toy.name}") and study.user_attrs["objective"] == toy.name
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 3 and all(t.values == [t.user_attrs["metrics"]["output_throughput"]] for t in done)
    code, stdout, err = run_cli([*args, "--n-trials", "4"], capsys)  # the stored study loads by its name
    assert code == 0, err
    assert "resuming study" in stdout and "3 complete trials kept" in stdout
    assert len(optuna.load_study(study_name=study.study_name, storage=url).trials) == 4


def test_the_registry_refuses_a_taken_name_and_names_every_choice(toy):
    assert get(toy.name) is toy and list(OBJECTIVES)[:3] == ["goodput", "capacity", "pareto"]
    with pytest.raises(ValueError, match="taken"):
        register(Throughput())
    with pytest.raises(UserError, match=f"--objective must be one of goodput, capacity, pareto, {toy.name}, got 'x'"):
        get("x")


def _reads_objective(node: ast.AST) -> bool:
    """An expression that reads an objective's name: `objective`, `x.objective`, `x["objective"]`,
    `x.get("objective")`."""
    if isinstance(node, ast.Name):
        return "objective" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "objective" in node.attr.lower()
    if isinstance(node, ast.Subscript):
        return _is_text(node.slice) and "objective" in node.slice.value
    if isinstance(node, ast.Call):
        return any(_is_text(a) and "objective" in a.value for a in node.args)
    return False


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _has_text(node: ast.AST) -> bool:
    """A string literal, or a tuple, list or set holding one (`objective in ("a", "b")`)."""
    return _is_text(node) or isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(map(_is_text, node.elts))


def name_comparisons(source: str) -> list[int]:
    """The lines where an objective's name is compared with a string literal (==, !=, in, not in, match)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(map(_reads_objective, sides)) and any(map(_has_text, sides)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Match) and _reads_objective(node.subject):
            lines += [
                case.pattern.lineno
                for case in node.cases
                if isinstance(case.pattern, ast.MatchValue) and _is_text(case.pattern.value)
            ]
    return lines


def test_the_check_finds_name_dispatch():
    assert name_comparisons('if spec.objective == "pareto":\n    pass') == [1]
    assert name_comparisons('x = 1 if study.user_attrs.get("objective") != "capacity" else 0') == [1]
    assert name_comparisons('ok = objective not in ("goodput", "capacity")') == [1]
    assert name_comparisons('match spec.objective:\n    case "pareto":\n        pass') == [2]
    assert name_comparisons('index = get(spec.objective).headline\nok = args.presearch == "sim"') == []


def test_no_objective_is_told_apart_by_its_name_outside_the_registry():
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sorted((REPO / "chunkbench").rglob("*.py"))
        if PACKAGE not in path.parents
        for line in name_comparisons(Path(path).read_text())
    ]
    assert not found, f"compare the objective through its registry (tune/objectives/registry.get): {found}"
