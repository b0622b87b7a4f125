"""`chunkbench run` and `compare` end to end on `tiny`, `chunkbench bench` against a scripted server, and their
user errors."""

import json

import pandas as pd
import pytest

from chunkbench.backends.engine import EngineBackend
from chunkbench.bench.runs import compare, config_for_policy, parse_policy_spec
from chunkbench.errors import UserError
from chunkbench.workloads.spec import WorkloadSpec, build_workload
from tests.conftest import run_cli
from tests.serving.scripted_server import DONE, ScriptedServer, tok, usage

TINY = ["--model", "tiny", "--num-blocks", "512", "--max-model-len", "1024", "--no-progress", "--warmup-steps", "1"]


def test_run_writes_summary_and_parquet(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, _ = run_cli(
        [
            "run",
            *TINY,
            "--workload",
            "chat",
            "--num-requests",
            "8",
            "--rate",
            "50",
            "--max-num-batched-tokens",
            "128",
            "--goodput",
            "ttft:60000",
            "--out",
            str(out),
            "--json",
            str(tmp_path / "s.json"),
        ],
        capsys,
    )
    assert code == 0, stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 8 and summary["failed"] == 0
    assert summary["config"]["scheduler"]["max_num_batched_tokens"] == 128
    for key in (
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_tpot_ms",
        "p99_itl_ms",
        "std_e2el_ms",
        "p90_scheduling_delay_ms",
        "sla_attainment_pct",
        "num_stalls",
        "longest_stall_ms",
        "num_preemptions",
        "peak_kv_blocks",
        "max_output_tokens_per_s",
    ):
        assert key in summary
    assert summary["sla_attainment_pct"] == 100.0
    requests = pd.read_parquet(out / "requests.parquet")
    steps = pd.read_parquet(out / "steps.parquet")
    assert len(requests) == 8 and (requests["num_output_tokens"] == requests["output_len"]).all()
    assert steps["prefill_tokens"].sum() == requests["prompt_len"].sum()
    assert (steps["prefill_tokens"] + steps["decode_tokens"] <= 128).all()
    assert json.loads((tmp_path / "s.json").read_text())["completed"] == 8


def test_compare_runs_the_same_requests_through_each_policy(tmp_path, capsys):
    out = tmp_path / "cmp"
    code, stdout, _ = run_cli(
        [
            "compare",
            "static",
            "continuous",
            "chunked:budget=64,schedule=32,16",
            *TINY,
            "--workload",
            "rag-mix",
            "--num-requests",
            "6",
            "--rate",
            "20",
            "--out",
            str(out),
            "--json",
            str(tmp_path / "c.json"),
        ],
        capsys,
    )
    assert code == 0, stdout
    runs = json.loads((tmp_path / "c.json").read_text())["runs"]
    assert list(runs) == ["static", "continuous", "chunked:budget=64,schedule=32,16"]
    assert all(r["completed"] == 6 for r in runs.values())
    assert len({r["total_input_tokens"] for r in runs.values()}) == 1
    frames = [pd.read_parquet(p / "requests.parquet") for p in sorted(out.iterdir()) if p.is_dir()]
    assert len(frames) == 3
    for frame in frames[1:]:
        pd.testing.assert_frame_equal(
            frame[["prompt_len", "output_len", "arrival_time"]], frames[0][["prompt_len", "output_len", "arrival_time"]]
        )
    for name in ("report.html", "ttft_cdf.png", "itl_cdf.png", "timeline.png", "comparison.md"):
        assert (out / name).stat().st_size > 1000 or name == "comparison.md"
    assert "<table>" in (out / "report.html").read_text()


def test_policy_specs():
    assert parse_policy_spec("chunked:budget=512,schedule=2048,1024,512,tile=16") == (
        "chunked",
        {"policy": "chunked", "max_num_batched_tokens": 512, "chunk_schedule": (2048, 1024, 512), "tile": 16},
    )
    assert parse_policy_spec("orca") == ("orca", {"policy": "orca"})
    base = dict(model="tiny", max_num_batched_tokens=256, max_model_len=1024)
    assert config_for_policy(base, "continuous").scheduler.max_num_batched_tokens == 2048
    assert config_for_policy(base, "chunked").scheduler.max_num_batched_tokens == 256
    for bad, message in [
        ("chunked:size=5", "unknown knob 'size'"),
        ("chunked:budget=x", "whole number"),
        ("chunked:budget", "not key=value"),
    ]:
        with pytest.raises(UserError, match=message):
            parse_policy_spec(bad)


def test_compare_needs_a_policy():
    with pytest.raises(UserError, match="at least one policy"):
        compare({"model": "tiny"}, [], build_workload(WorkloadSpec(num_requests=1)), EngineBackend())


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--workload", "nope"], "unknown workload 'nope'"),
        (["run", "--policy", "fifo"], "--policy must be one of"),
        (["compare", "static", "fifo"], "--policy must be one of"),
        (["run", "--rate", "0"], "--rate must be > 0"),
        (["run", "--rate", "-2"], "--rate must be > 0"),
        (["run", "--workload", "/no/such.csv"], "no such file"),
        (["run", "--goodput", "ttft=300"], "--goodput"),
        (["run", "--goodput", "itl:30"], "unknown metric 'itl'"),
    ],
)
def test_bench_user_errors(args, message, capsys):
    code, _, err = run_cli([*args, "--model", "tiny", "--no-progress"], capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("flag, value", [("--temperature", "nan"), ("--top-p", "inf"), ("--min-p", "-inf")])
def test_bench_refuses_a_sampling_value_json_cannot_carry_before_any_request(flag, value, capsys):
    code, _, err = run_cli(["bench", "--endpoint", "http://127.0.0.1:1/v1", flag, value], capsys)
    assert code == 2 and err.count("\n") == 1 and f"{flag} must be a finite number" in err, err


def test_malformed_trace_file_is_a_user_error(tmp_path, capsys):
    bad = tmp_path / "trace.csv"
    bad.write_text("prompt_len,output_len\n12,seven\n")
    unreadable = tmp_path / "locked.jsonl"
    unreadable.write_text("{not json")
    for path in (bad, unreadable):
        code, _, err = run_cli(["run", "--model", "tiny", "--workload", str(path), "--no-progress"], capsys)
        assert code == 2 and err.startswith("chunkbench: error: --workload"), err


# ---------- chunkbench bench against a scripted server (tests/serving/scripted_server.py) ----------

BENCH = [
    "--workload",
    "synthetic",
    "--prompt-len",
    "fixed:8",
    "--output-len",
    "fixed:3",
    "--num-requests",
    "4",
    "--rate",
    "50",
]
SCRIPT = [0.01, tok(), 0.01, tok(), 0.01, tok(), usage(3), DONE]


def test_bench_without_a_known_vocabulary_asks_for_it_before_any_request(tmp_path, capsys):
    with ScriptedServer({3: SCRIPT}, card={"id": "m"}) as server:  # no vocab_size, no /detokenize
        code, _, err = run_cli(["bench", "--endpoint", server.url, *BENCH, "--out", str(tmp_path)], capsys)
    assert code == 2 and err.count("\n") == 1 and "--vocab-size" in err, err
    assert server.served == []


def test_bench_bounds_prompt_ids_by_the_servers_detokenize_and_sends_no_sampling_field(tmp_path, capsys):
    with ScriptedServer({3: SCRIPT}, card={"id": "m"}, vocab_size=300) as server:
        code, stdout, _ = run_cli(["bench", "--endpoint", server.url, *BENCH, "--out", str(tmp_path / "o")], capsys)
    assert code == 0, stdout
    ids = [t for s in server.served for t in s.body["prompt"]]
    assert len(ids) == 32 and 200 < max(ids) < 300  # every id in the vocabulary, its top used
    assert all(not {"temperature", "top_p", "top_k"} & set(s.body) for s in server.served)
    assert server.probes.count("/detokenize") < 40  # a search, not a scan


def test_bench_sampling_flags_warmups_and_save_result_layout(tmp_path, capsys):
    with ScriptedServer({3: SCRIPT}, card={"id": "org/m", "vocab_size": 1000}) as server:
        code, stdout, _ = run_cli(
            [
                "bench",
                "--endpoint",
                server.url,
                *BENCH,
                "--out",
                str(tmp_path / "o"),
                "--temperature",
                "0",
                "--top-k",
                "4",
                "--num-warmups",
                "2",
                "--save-result",
                "--result-dir",
                str(tmp_path / "r"),
                "--max-concurrency",
                "2",
            ],
            capsys,
        )
    assert code == 0, stdout
    warm, timed = server.served[:2], server.served[2:]  # 2 warm-ups, both request 0's body, before the run
    assert len(timed) == 4 and warm[0].body == warm[1].body and sum(warm[0].body == s.body for s in timed) == 1
    assert all(s.body["temperature"] == 0.0 and s.body["top_k"] == 4 for s in server.served)
    (path,) = (tmp_path / "r").iterdir()
    assert path.name.startswith("openai-50.0qps-concurrency2-m-") and path.suffix == ".json"
    result = json.loads(path.read_text())
    stats = {
        f"{s}_{m}_ms"
        for m in ("ttft", "tpot", "itl", "client_queue_time", "e2el_including_client_queue")
        for s in ("mean", "median", "std", "p99")
    }
    assert (
        set(result)
        == {
            "date",
            "endpoint_type",
            "backend",
            "label",
            "model_id",
            "tokenizer_id",
            "num_prompts",
            "request_rate",
            "burstiness",
            "max_concurrency",
            "duration",
            "completed",
            "failed",
            "total_input_tokens",
            "total_output_tokens",
            "request_throughput",
            "request_goodput",
            "output_throughput",
            "total_token_throughput",
            "latencies",
            "queue_times",
            "max_output_tokens_per_s",
            "max_concurrent_requests",
            "rtfx",
        }
        | stats
    )
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert result["completed"] == summary["completed"] == 4 and result["total_output_tokens"] == 12
    assert result["mean_ttft_ms"] == summary["mean_ttft_ms"] and result["request_goodput"] is None
    assert len(result["latencies"]) == 4 and result["model_id"] == "org/m"
