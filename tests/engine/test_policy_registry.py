"""Adding a policy is one module and one registration: a toy policy registered here runs through `compare` and
a simulated `tune`, and no code outside engine/policies/ tells policies apart by their names."""

import ast
import json

import pytest
from chunkbench.engine import policies
from chunkbench.engine.policies.whole_prompt import admit_whole_prompts

from tests.conftest import REPO, run_cli


class DecodeFirst(policies.Policy):
    """A toy: running requests first (a decode token each, or their whole prompt), then whole new prompts;
    it counts the steps it scheduled."""

    name = "toy-decode-first"
    help = "decodes first, whole prompts after (a test's policy)"
    in_vllm = False
    steps = 0

    def schedule(self, scheduler, scheduled, preempted):
        DecodeFirst.steps += 1
        budget = scheduler.config.max_num_batched_tokens
        for request in list(scheduler.running):
            n = 1 if request.is_decoding else request.num_tokens_to_compute
            if n <= budget and request in scheduler.running and scheduler._reserve(request, n, scheduled, preempted):
                budget -= n
        if not preempted:
            admit_whole_prompts(scheduler, budget, scheduled)


@pytest.fixture
def toy():
    policies.register(DecodeFirst)
    DecodeFirst.steps = 0
    yield DecodeFirst.name
    policies.unregister(DecodeFirst.name)


SIM = ["--model", "llama-3-8b", "--backend", "sim", "--gpu", "h100-sxm", "--no-progress"]


def test_a_registered_policy_runs_in_compare(toy, tmp_path, capsys):
    code, stdout, _ = run_cli(
        [
            "compare",
            toy,
            "continuous",
            *SIM,
            "--workload",
            "rag-mix",
            "--num-requests",
            "20",
            "--rate",
            "2",
            "--out",
            str(tmp_path / "c"),
            "--json",
            str(tmp_path / "c.json"),
        ],
        capsys,
    )
    assert code == 0, stdout
    runs = json.loads((tmp_path / "c.json").read_text())["runs"]
    assert runs[toy]["completed"] == 20 and runs["continuous"]["completed"] == 20
    assert DecodeFirst.steps >= 20  # a step at least per admission (decode-only runs are fast-forwarded)
    assert runs[toy]["total_input_tokens"] == runs["continuous"]["total_input_tokens"]


def test_a_registered_policy_is_searched_by_a_simulated_tune(toy, tmp_path, capsys):
    space = tmp_path / "space.toml"
    space.write_text(
        f'[workload]\nname = "chat"\nrate = 2.0\nnum_requests = 30\n\n[space]\n'
        f'policy = ["{toy}", "chunked"]\nmax_num_batched_tokens = [2048, 8192]\nmax_num_seqs = [64]\n'
    )
    out = tmp_path / "t"
    code, stdout, _ = run_cli(
        [
            "tune",
            *SIM,
            "--space",
            str(space),
            "--objective",
            "goodput",
            "--n-trials",
            "4",
            "--verify-top",
            "0",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0, stdout
    assert DecodeFirst.steps > 0  # a trial ran it
    trials = (out / "trials.csv").read_text()
    assert toy in trials


def test_no_policy_name_is_compared_outside_the_registry():
    """`x == "chunked"`, `policy in ("static", "orca")`: each such test belongs to a policy's declaration."""
    names = set(policies.names())
    found = []
    for path in (REPO / "chunkbench").rglob("*.py"):
        if "policies" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                literals = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)]
                if names & {v for v in literals if isinstance(v, str)}:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found
