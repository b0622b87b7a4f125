"""`chunkbench bench` accepts and refuses vllm bench serve's rate, ramp-up, burstiness, prompt-count, probe,
seed, concurrency, warm-up and header flags as vLLM does. The verdicts are vLLM 0.32's own, found by running
its code (scripts/vllm_rate_rules.py, in .venv-vllm): its parser (add_cli_args), main_async's checks
("Validate ramp-up arguments", --max-concurrency, np.random.seed, --header) and get_request's asserts
(burstiness > 0, a request at least, every request's rate > 0 from _get_current_request_rate). vLLM 0.34's
code gives the same verdicts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

RAMP = ["--ramp-up-strategy"]
# (flags, vLLM 0.32's verdict: where it stops them, or "accepted")
CASES = [
    ([*RAMP, "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "5"], "accepted"),
    ([*RAMP, "exponential", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "16"], "accepted"),
    ([*RAMP, "linear", "--ramp-up-start-rps", "5", "--ramp-up-end-rps", "5"], "accepted"),
    ([*RAMP, "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "5", "--num-prompts", "1"], "accepted"),
    ([*RAMP, "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "5", "--request-rate", "inf"], "accepted"),
    ([*RAMP, "linear", "--ramp-up-start-rps", "0", "--ramp-up-end-rps", "5"], "get_request"),  # first rate 0
    ([*RAMP, "linear", "--ramp-up-start-rps", "0", "--ramp-up-end-rps", "0"], "get_request"),
    ([*RAMP, "linear", "--ramp-up-start-rps", "10", "--ramp-up-end-rps", "2"], "main_async"),  # start > end
    ([*RAMP, "exponential", "--ramp-up-start-rps", "0", "--ramp-up-end-rps", "5"], "main_async"),
    ([*RAMP, "linear", "--ramp-up-start-rps", "-1", "--ramp-up-end-rps", "5"], "main_async"),
    ([*RAMP, "linear", "--ramp-up-start-rps", "1"], "main_async"),
    ([*RAMP, "linear"], "main_async"),
    ([*RAMP, "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "5", "--request-rate", "3"], "main_async"),
    ([*RAMP, "linear", "--ramp-up-start-rps", "2.5", "--ramp-up-end-rps", "5"], "argparse"),  # type=int
    ([*RAMP, "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "nan"], "argparse"),
    ([*RAMP, "steps", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "5"], "argparse"),
    (["--ramp-up-start-rps", "10", "--ramp-up-end-rps", "2"], "accepted"),  # ignored without a strategy
    (["--request-rate", "inf"], "accepted"),
    (["--request-rate", "2.5"], "accepted"),
    (["--request-rate", "0"], "get_request"),
    (["--request-rate", "-1"], "get_request"),
    (["--request-rate", "nan"], "get_request"),
    (["--request-rate", "fast"], "argparse"),
    (["--request-rate", "2", "--burstiness", "inf"], "accepted"),  # constant gaps
    (["--request-rate", "2", "--burstiness", "0.25"], "accepted"),
    (["--request-rate", "2", "--burstiness", "0"], "get_request"),
    (["--request-rate", "2", "--burstiness", "-1"], "get_request"),
    (["--request-rate", "2", "--burstiness", "nan"], "get_request"),
    (["--burstiness", "0"], "get_request"),  # checked at vLLM's default rate (inf) too
    (["--num-prompts", "1"], "accepted"),
    (["--num-prompts", "0"], "get_request"),
    (["--num-prompts", "-5"], "get_request"),
    (["--num-prompts", "2.5"], "argparse"),
    (["--probe-request-rate", "2"], "accepted"),
    (["--probe-request-rate", "inf"], "accepted"),  # back to back
    (["--probe-request-rate", "-1"], "accepted"),  # no probes
    (["--probe-request-rate", "nan"], "accepted"),  # no probes
    (["--seed", "4294967295"], "accepted"),
    (["--seed", "-1"], "main_async"),  # np.random.seed
    (["--seed", "4294967296"], "main_async"),
    (["--max-concurrency", "1"], "accepted"),
    (["--max-concurrency", "0"], "main_async"),
    (["--max-concurrency", "2.5"], "argparse"),
    (["--num-warmups", "-1"], "accepted"),  # range(-1): none
    (["--header", "x-info=0.3"], "accepted"),  # vLLM's KEY=VALUE (chunkbench's NAME:VALUE too)
    (["--header", "x-info"], "main_async"),
]
# Where chunkbench refuses what vLLM takes, on purpose: (flags, vLLM's verdict, what chunkbench says)
DIVERGES = [
    (["--request-rate", "1e-300"], "accepted", "at most 1e+09 s"),  # vLLM would wait 1e302 s for the last one
    (["--num-prompts", "100000000"], "accepted", "--num-requests must be <= 1e+07"),  # a mistake, not a workload
    (["--temperature", "nan"], "accepted", "--temperature must be a finite number"),  # JSON has no NaN
]
UNREACHABLE = "no model list at"  # the flags passed every check; then the server was asked and is not there


def verdict(flags: list[str], capsys, tmp_path: Path) -> str:
    """'accepted' or chunkbench's one-line refusal, checked before any request."""
    out = tmp_path / "out"
    code, _, err = run_cli(["bench", "--endpoint", "http://127.0.0.1:9/v1", *flags, "--out", str(out)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()
    return "accepted" if UNREACHABLE in err else err.strip()


@pytest.mark.parametrize("flags, theirs", CASES, ids=[" ".join(f) for f, _ in CASES])
def test_bench_accepts_and_refuses_what_vllm_does(flags, theirs, capsys, tmp_path):
    ours = verdict(flags, capsys, tmp_path)
    assert (ours == "accepted") == (theirs == "accepted"), (theirs, ours)


@pytest.mark.parametrize("flags, theirs, message", DIVERGES, ids=[" ".join(f) for f, _, _ in DIVERGES])
def test_where_bench_refuses_what_vllm_takes_it_says_why(flags, theirs, message, capsys, tmp_path):
    assert message in verdict(flags, capsys, tmp_path)


VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


@pytest.mark.vllm
@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="needs vLLM 0.32's venv, .venv-vllm (make test-vllm)")
def test_the_table_is_what_vllm_s_own_code_says():
    cases = [flags for flags, _ in CASES] + [flags for flags, _, _ in DIVERGES]
    done = subprocess.run(
        [str(VLLM_PYTHON), str(REPO / "scripts" / "vllm_rate_rules.py"), json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs == [v for _, v in CASES] + [v for _, v, _ in DIVERGES]
