"""Hostile input to `bench`, `run`, `compare` and `tune`: each bad value or file is one line on stderr naming the
flag and what was wrong, exit code 2, before any work, nothing written, no library's text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SHORT_REQUESTS, run_cli

SIM = ["--backend", "sim", "--model", "llama-3-8b", "--no-progress"]
UNREACHABLE = ["--endpoint", "http://127.0.0.1:9/v1"]  # refused before the server would be asked

SHAREGPT = '[{"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi"}]}]'
BAD_FILES = {  # name -> (content, what the line says); every file kind vLLM's datasets and chunkbench read
    "empty.json": (b"", "is empty"),
    "blank.jsonl": (b"\n  \n", "is empty"),
    "random.json": (bytes(range(128, 256)) * 8, "is not text"),
    "random.parquet": (b"PAR2" + bytes(range(200, 256)) * 9, "is not text"),
    "prose.json": (b"hello world\n", "not JSON"),
    "number.json": (b"42", "holds a JSON number"),
    "no_conversations.json": (b'[{"id": 1}]', "no 'conversations'"),
    "turns_not_a_list.json": (b'[{"conversations": "hi"}]', "must be a list of turns"),
    "columns.csv": (b"a,b\n1,2\n", "no prompt_len column"),
    "fractions.csv": (b"prompt_len,output_len\n1.5,2\n", "fractional"),
}


def bad_file(tmp_path: Path, name: str) -> tuple[Path, str]:
    content, says = BAD_FILES[name]
    path = tmp_path / name
    path.write_bytes(content)
    return path, says


def fails_in_one_line(args: list[str], capsys, out: Path, *says: str) -> str:
    code, stdout, err = run_cli(args, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert all(s in lines[0] for s in says) and "Traceback" not in stdout + err, lines[0]
    assert not out.exists()
    return lines[0]


# ---- dataset files: ShareGPT, vLLM's file datasets and chunkbench's own files, in every command ----

SHAREGPT_BAD = ["empty.json", "blank.jsonl", "random.json", "random.parquet", "prose.json", "number.json"]
SHAREGPT_BAD += ["no_conversations.json", "turns_not_a_list.json"]


@pytest.mark.parametrize("name", SHAREGPT_BAD)
def test_a_bad_sharegpt_file_in_bench_names_dataset_path(name, tmp_path, capsys):
    path, says = bad_file(tmp_path, name)
    args = ["bench", *UNREACHABLE, "--dataset-name", "sharegpt", "--dataset-path", str(path)]
    fails_in_one_line([*args, "--out", str(tmp_path / "o")], capsys, tmp_path / "o", "--dataset-path", str(path), says)


@pytest.mark.parametrize("name", SHAREGPT_BAD)
@pytest.mark.parametrize("form", ["sharegpt:{}", "{}"])
def test_a_bad_sharegpt_file_in_run_names_workload(name, form, tmp_path, capsys):
    path, says = bad_file(tmp_path, name)
    if form == "{}" and path.suffix != ".json":  # a bare path is read by its suffix
        return
    args = ["run", *SIM, "--workload", form.format(path), "--out", str(tmp_path / "o")]
    fails_in_one_line(args, capsys, tmp_path / "o", "--workload", str(path), says)


@pytest.mark.parametrize("kind", ["custom", "burstgpt", "timed_trace"])
@pytest.mark.parametrize("name", ["empty.json", "random.json", "random.parquet", "prose.json", "columns.csv"])
def test_vllm_file_datasets_refuse_bad_files_in_one_line(kind, name, tmp_path, capsys):
    path, _ = bad_file(tmp_path, name)
    out = tmp_path / "o"
    args = ["bench", *UNREACHABLE, "--dataset-name", kind, "--dataset-path", str(path), "--out", str(out)]
    line = fails_in_one_line(args, capsys, out, "--dataset-path", str(path))
    assert "codec" not in line and "position 0" not in line, line  # the reason in the user's terms


@pytest.mark.parametrize("name", ["columns.csv", "fractions.csv", "empty.json"])
def test_chunkbench_token_files_refuse_bad_content(name, tmp_path, capsys):
    path, says = bad_file(tmp_path, name)
    out = tmp_path / "o"
    fails_in_one_line(["run", *SIM, "--workload", str(path), "--out", str(out)], capsys, out, str(path), says)


def test_a_folder_where_a_file_belongs_is_named(tmp_path, capsys):
    folder = tmp_path / "data.json"
    folder.mkdir()
    out = tmp_path / "o"
    for args in (
        ["run", *SIM, "--workload", str(folder)],
        ["run", *SIM, "--workload", f"custom:{folder}"],
        ["bench", *UNREACHABLE, "--dataset-name", "sharegpt", "--dataset-path", str(folder)],
    ):
        fails_in_one_line([*args, "--out", str(out)], capsys, out, str(folder), "is a folder")


def test_a_bad_sharegpt_file_in_tune_writes_no_study(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path, says = bad_file(tmp_path, "empty.json")
    args = ["tune", *SIM, "--workload", f"sharegpt:{path}", "--sla-ttft", "2s", "--n-trials", "1"]
    fails_in_one_line(args, capsys, tmp_path / "results", "--workload", str(path), says)


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`chunkbench ARGS` in a process of its own: what a library prints to the terminal is seen too."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "chunkbench.cli", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=240
    )


def test_no_library_prints_around_the_one_line(tmp_path):
    """datasets logs a bad file's pyarrow error itself; that line must not reach the terminal."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "train.parquet").write_bytes(BAD_FILES["random.parquet"][0])
    (tmp_path / "sharegpt.json").write_bytes(BAD_FILES["random.json"][0])
    for args in (
        ["run", *SIM, "--workload", f"hf:{tmp_path / 'hf'}", "--out", str(tmp_path / "o")],
        ["run", *SIM, "--workload", f"sharegpt:{tmp_path / 'sharegpt.json'}", "--out", str(tmp_path / "o")],
        ["bench", *UNREACHABLE, "--dataset-name", "hf", "--dataset-path", str(tmp_path / "hf")],
    ):
        done = cli(args, tmp_path)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("chunkbench: error: "), done.stderr
        assert "Failed to" not in done.stdout + done.stderr and not (tmp_path / "o").exists(), done.stdout


# ---- compare across load: a capacity search refuses what can decide nothing, before any run ----


@pytest.mark.parametrize(
    "args, says",
    [
        (["--backend", "sim", "--model", "llama-3-8b", "--workload", "{trace}"], "1 request cannot decide a capacity"),
        (
            ["--backend", "engine", "--model", "tiny", "--max-num-batched-tokens", "256", "--num-requests", "2"],
            "give --num-requests 716 or more",
        ),
        (["--backend", "sim", "--model", "llama-3-8b", "--arrival", "all-at-once"], "all arrive at once"),
        (["--backend", "sim", "--model", "llama-3-8b", "--rates", "1e-9"], "--rates 1e-09: a run of"),
        (["--backend", "sim", "--model", "llama-3-8b", "--rates", "nan"], "--rates must be a finite number"),
    ],
)
def test_compare_across_load_refuses_what_cannot_decide_a_capacity(args, says, tmp_path, capsys):
    trace = tmp_path / "one.csv"
    trace.write_text("prompt_len,output_len\n100,20\n")
    out = tmp_path / "o"
    args = ["compare", "continuous", "chunked", "--no-progress", *[a.format(trace=trace) for a in args]]
    fails_in_one_line([*args, "--out", str(out)], capsys, out, says)


def test_the_simulator_draws_its_own_requests_where_the_users_are_too_few():
    """`--num-requests 1` on the simulator: the probes run on the workload's own draws, the SLA is set on
    them, and the output says so (instead of no capacity at any rate)."""
    from chunkbench.backends.choice import resolve
    from chunkbench.commands.compare_load import check_requests
    from chunkbench.workloads.spec import WorkloadSpec, build_workload

    spec = WorkloadSpec(name="rag-mix", num_requests=1)
    backend = resolve("sim", "llama-3-8b", gpu="h100-sxm").backend
    note, pool = check_requests(build_workload(spec, 8192), spec, [], 8192, backend, [])
    assert len(pool) >= 716 and "1 requests are too few" in note and "draws its own" in note


def test_a_rate_given_twice_is_run_once(tmp_path, capsys, monkeypatch):
    from chunkbench.commands import compare_load
    from chunkbench.errors import StudyFailed

    asked = []

    def sweep(label, config, backend, requests, slos, delay, rates, *rest, **options):
        asked.append(rates)
        raise StudyFailed("stopped here")

    monkeypatch.setattr(compare_load, "sweep_policy", sweep)
    args = ["compare", "chunked", *SIM, "--num-requests", "20", "--rates", "2,2,4,2", "--out", str(tmp_path / "o")]
    code, _, err = run_cli(args, capsys)
    assert code == 1 and "stopped here" in err and asked == [[2.0, 4.0]], (asked, err)


def test_the_rates_probed_reach_a_capacity_far_from_the_pool_s_own_rate():
    """A trace replayed at 1e9 req/s against a server that sustains 0.5: the lattice is centred on the hint
    (the saturation throughput), not clamped 7 octaves from the pool's rate (7.8e6 req/s)."""
    from types import SimpleNamespace

    from chunkbench.bench.capacity import Lattice
    from chunkbench.workloads.spec import WorkloadRequest

    pool = [WorkloadRequest(10, 10, i * 1e-9) for i in range(10)]
    lattice = Lattice(SimpleNamespace(pool=pool), center=0.5)
    assert lattice.rate(lattice.index(0.5)) == pytest.approx(0.5, rel=0.03)
    assert lattice.rate(lattice.index(1e-3)) == pytest.approx(0.5 / 2**7, rel=0.03)  # 7 octaves below


# ---- other hostile values: paths that are not what the flag reads, numbers past what a run can do ----


def test_unreadable_and_special_files_are_named(tmp_path, capsys):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)  # opening it to read would wait for a writer forever
    out = tmp_path / "o"
    fails_in_one_line(["run", *SIM, "--workload", str(fifo), "--out", str(out)], capsys, out, "is not a file")
    if Path("/proc/self/mem").exists():  # a regular file that cannot be read from its start, even by root
        args = ["run", *SIM, "--workload", "sharegpt:/proc/self/mem", "--out", str(out)]
        fails_in_one_line(args, capsys, out, "cannot read /proc/self/mem")


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--tokenizer", "{folder}", "--workload", "random"], "no tokenizer that Hugging Face can load"),
        (["--tokenizer", "{file}", "--workload", "random"], "is a file; give the tokenizer's folder"),
        (["--cost-model", "{folder}"], "--cost-model: cannot read"),
        (["--probe-request-rate", "1e308"], "--probe-request-rate 1e+308"),
        (["--probe-request-rate", "99999999999999999999"], "at most 1e+07"),
        (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "9", "--ramp-up-end-rps", "3"], "at most"),
    ],
)
def test_run_refuses_hostile_values_in_one_line(flags, says, tmp_path, capsys):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("{}")
    flags = [f.format(folder=tmp_path / "folder", file=tmp_path / "file") for f in flags]
    out = tmp_path / "o"
    line = fails_in_one_line(["run", *SIM, "--num-requests", "5", *flags, "--out", str(out)], capsys, out, says)
    assert "\\n" not in line and "Errno" not in line, line


def test_a_step_time_target_far_above_every_step_still_plots(tmp_path, capsys):
    out = tmp_path / "o"
    args = ["compare", "continuous", "chunked", *SIM, "--num-requests", "5", "--rate", "2", "--out", str(out)]
    code, _, err = run_cli([*args, "--step-time-target", "1e308"], capsys)
    assert code == 0 and (out / "step_times.png").exists(), err


@pytest.mark.slow
def test_compare_on_one_request_finds_a_capacity_on_the_simulator_s_own_draws(tmp_path, capsys):
    """The probe's case: `compare ... --num-requests 1` met the SLA 'at no rate down to 7.81e+06 req/s'."""
    import json

    out = tmp_path / "o"
    args = ["compare", "chunked", *SIM, "--gpu", "h100-sxm", "--num-requests", "1", "--out", str(out)]
    args += SHORT_REQUESTS  # short long runs
    code, stdout, err = run_cli(args, capsys)
    assert code == 0, err
    assert "1 requests are too few for a steady verdict" in " ".join(stdout.split())
    assert "a decode step of 32 requests" in stdout  # the default SLA is set on the draws, not on one request
    assert json.loads((out / "comparison.json").read_text())["load"]["common_rate"] > 0
