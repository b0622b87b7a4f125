"""The CI gate: catches a real regression, stays quiet on noise, writes parseable reports, refuses bad input."""

import xml.etree.ElementTree as ET

import pytest

from chunkbench.gate import Guard, judge
from tests.conftest import run_cli

SIM_CASE = """
[defaults]
model = "llama-3-8b"
backend = "sim"
gpu = "h100-sxm"
workload = "rag-mix"
rate = 4.0
num_requests = 150

[[case]]
name = "rag"
policy = "{policy}"
knobs = {{ max_num_batched_tokens = 512 }}
guard = [
  {{ metric = "p99_itl_ms", direction = "lower", tolerance = 0.05 }},
  {{ metric = "output_throughput", direction = "higher", tolerance = 0.02 }},
]
"""


def gate(tmp_path, capsys, policy="chunked", *extra):
    suite = tmp_path / "suite.toml"
    suite.write_text(SIM_CASE.format(policy=policy))
    return run_cli(["gate", "--suite", str(suite), "--baseline", str(tmp_path / "base.json"), *extra], capsys)


def test_a_worse_config_fails_the_gate_and_names_the_metric(tmp_path, capsys):
    assert gate(tmp_path, capsys, "chunked", "--update")[0] == 0
    code, _, err = gate(tmp_path, capsys, "chunked")
    assert code == 0 and err == ""
    code, _, err = gate(tmp_path, capsys, "continuous")  # the stall-free policy replaced by the stalling one
    assert code == 1
    assert "REGRESSION rag p99_itl_ms" in err


def test_reports_parse(tmp_path, capsys):
    gate(tmp_path, capsys, "chunked", "--update")
    code, _, _ = gate(
        tmp_path, capsys, "continuous", "--junit", str(tmp_path / "j.xml"), "--markdown", str(tmp_path / "g.md")
    )
    assert code == 1
    suite = ET.parse(tmp_path / "j.xml").getroot()
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["p99_itl_ms", "output_throughput"]
    assert suite.get("tests") == "2" and cases[0].find("failure") is not None
    table = (tmp_path / "g.md").read_text().splitlines()
    assert table[0].startswith("### chunkbench gate") and len([r for r in table if r.startswith("| rag |")]) == 2


def test_judge_is_quiet_on_noise_and_strict_on_shifts():
    guard = Guard("p99_itl_ms", "lower", 0.10)
    noisy = [0.52, 0.61, 0.55, 0.71, 0.49]  # around a baseline of 0.57
    assert judge(guard, "c", 0.57, noisy).verdict == "ok"
    shifted = [0.98, 1.03, 0.95, 1.10, 0.99]  # a real regression, e.g. the ratio went from 0.57 to 1.0
    assert judge(guard, "c", 0.57, shifted).verdict == "REGRESSED"
    assert judge(guard, "c", 0.57, [0.30, 0.31, 0.29]).verdict == "improved"
    higher = Guard("output_throughput", "higher", 0.02)
    assert judge(higher, "c", 100.0, [97.0]).verdict == "REGRESSED"
    assert judge(higher, "c", 100.0, [99.0]).verdict == "ok"


@pytest.mark.parametrize(
    "suite, message",
    [
        (
            "[[case]]\nname='a'\npolicy='fifo'\nguard=[{metric='p99_itl_ms', direction='lower'}]\n",
            "unknown policy 'fifo'",
        ),
        (
            "[[case]]\nname='a'\npolicy='chunked'\nguard=[{metric='p99_latency', direction='lower'}]\n",
            "unknown metric 'p99_latency'",
        ),
        ("[[case]]\nname='a'\npolicy='chunked'\nguard=[{metric='p99_itl_ms', direction='down'}]\n", "direction"),
        ("[[case]]\nname='a'\npolicy='chunked'\n", "guards no metric"),
        ("title = 'x'\n", "no [[case]] tables"),
    ],
)
def test_bad_suites_exit_2(suite, message, tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(suite)
    code, _, err = run_cli(["gate", "--suite", str(path), "--baseline", str(tmp_path / "b.json")], capsys)
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_missing_baseline_says_how_to_create_it(tmp_path, capsys):
    code, _, err = gate(tmp_path, capsys, "chunked")
    assert code == 2 and "no baseline at" in err and "--update" in err
