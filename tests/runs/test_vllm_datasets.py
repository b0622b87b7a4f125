"""vllm bench serve's datasets as workloads (chunkbench/workloads/vllm_datasets.py) on the sample files in
tests/data/datasets, vLLM's command line read by `bench`, and --plot-timeline's HTML."""

import json
import random
from html.parser import HTMLParser
from xml.etree import ElementTree

import numpy as np
import pandas as pd
import pytest

from chunkbench.bench.metrics import RequestRecord
from chunkbench.bench.timeline import timeline_html
from chunkbench.errors import UserError
from chunkbench.workloads.spec import WorkloadSpec, build_workload
from tests.conftest import REPO, run_cli
from tests.serving.scripted_server import DONE, ScriptedServer, chat_tok, usage

SAMPLES = REPO / "tests" / "data" / "datasets"
MOONCAKE = SAMPLES / "mooncake_conversation_200.jsonl"


def counts(name: str, **fields) -> list[tuple[int, int]]:
    return [(r.prompt_len, r.output_len) for r in build_workload(WorkloadSpec(name=name, **fields))]


def test_random_draws_vllm_s_lengths_in_its_order():
    """vLLM's get_sampling_params for the same seed: uniform integers in [floor(m(1-r)), ceil(m(1+r))],
    inputs then outputs from one default_rng(seed); the prefix is added to every prompt."""
    got = counts(
        "random",
        num_requests=50,
        random_input_len=100,
        random_output_len=10,
        random_range_ratio=0.3,
        prefix_len=7,
        seed=3,
    )
    rng = np.random.default_rng(3)
    inputs, outputs = rng.integers(70, 131, 50), rng.integers(7, 14, 50)
    assert got == [(int(i) + 7, int(o)) for i, o in zip(inputs, outputs)]
    assert counts("random", num_requests=3, random_input_len=64, random_output_len=5) == [(64, 5)] * 3


def test_prefix_repetition_shares_each_prefix_and_shuffles_as_vllm():
    requests = build_workload(
        WorkloadSpec(
            name="prefix_repetition",
            num_requests=23,
            seed=5,
            prefix_repetition_num_prefixes=4,
            prefix_repetition_prefix_len=32,
            prefix_repetition_suffix_len=8,
            prefix_repetition_output_len=6,
        )
    )
    assert len(requests) == 20 and {(r.prompt_len, r.output_len) for r in requests} == {(40, 6)}
    groups = [g for g in range(4) for _ in range(5)]
    random.Random(5).shuffle(groups)
    assert [r.shared[0][0] for r in requests] == [4_000_000 + g for g in groups]
    assert all(r.shared[0][1] == 32 for r in requests)
    with pytest.raises(UserError, match="at least --prefix-repetition-num-prefixes"):
        build_workload(WorkloadSpec(name="prefix_repetition", num_requests=3))


def test_burstgpt_takes_gpt4_rows_with_a_response_as_vllm_samples_them():
    path = SAMPLES / "burstgpt_300.csv"
    frame = pd.read_csv(path)
    rows = frame[(frame["Model"] == "GPT-4") & (frame["Response tokens"] > 0)]
    sampled = rows.sample(n=40, random_state=2)
    assert counts(f"burstgpt:{path}", num_requests=40, seed=2) == list(
        zip(sampled["Request tokens"], sampled["Response tokens"])
    )
    replayed = build_workload(WorkloadSpec(name=f"burstgpt:{path}", num_requests=5, arrival="trace"))
    first = rows.head(5)
    assert [r.arrival_time for r in replayed] == list((first["Timestamp"] - first["Timestamp"].min()).astype(float))


def test_custom_and_hf_count_prompt_tokens_and_take_outputs_as_asked():
    lines = [json.loads(x) for x in (SAMPLES / "custom_200.jsonl").read_text().splitlines()]
    by_chars = [max(1, round(len(x["prompt"]) / 4)) for x in lines]
    assert counts(f"custom:{SAMPLES / 'custom_200.jsonl'}", num_requests=None) == [(p, 256) for p in by_chars]
    mine = counts(f"custom:{SAMPLES / 'custom_200.jsonl'}", num_requests=10, custom_output_len=-1)
    assert mine == [(p, x["output_tokens"]) for p, x in zip(by_chars, lines[:10])]
    hf = counts(f"hf:{SAMPLES / 'hf_qa_200'}", num_requests=10)
    answers = [json.loads(x)["answer"] for x in (SAMPLES / "hf_qa_200" / "train.jsonl").read_text().splitlines()]
    assert hf == [(p, max(1, round(len(a) / 4))) for p, a in zip(by_chars, answers[:10])]
    assert counts(f"hf:{SAMPLES / 'hf_qa_200'}", num_requests=3, hf_output_len=9) == [(p, 9) for p in by_chars[:3]]


def test_timed_trace_expands_hash_ids_into_blocks_with_shared_prefixes():
    """Mooncake's rows: 512-token blocks, the last cut to the input length; equal ids, equal segments."""
    rows = [json.loads(x) for x in MOONCAKE.read_text().splitlines()[:30]]
    requests = build_workload(
        WorkloadSpec(name=f"timed_trace:{MOONCAKE}", num_requests=30, time_scale=0.001, timed_trace_chunk_hash_size=512)
    )
    for row, r in zip(rows, requests):
        assert r.prompt_len == min(row["input_length"], 512 * len(row["hash_ids"]))
        assert r.output_len == row["output_length"] and r.arrival_time == row["timestamp"] * 0.001
        assert len(r.shared) == len(row["hash_ids"]) or r.prompt_len == row["input_length"]
    first = {r.shared[0] for r in requests}  # every conversation starts with hash id 0: one shared block
    assert first == {(5_000_000, 512)}


def test_timed_trace_prefix_cache_hit_rate_is_the_share_of_repeated_blocks(tmp_path, capsys):
    """On the engine, with requests one at a time (each ends before the next arrives) and a cache large enough
    to keep every block, the prompt tokens the prefix cache serves are exactly the blocks whose whole chain
    of ids came before, counted here from the file alone. Each prompt ends with a block of its own, so no
    prompt is wholly cached (vLLM then recomputes the last token)."""
    rng = np.random.default_rng(0)
    rows, fresh = [], iter(range(1000, 10_000))
    for i in range(12):
        start = [int(h) for h in rng.choice(3, size=int(rng.integers(0, 4)))]  # ids 0-2: often repeated
        ids = start + [next(fresh)]
        rows.append({"ts": i * 0.25, "in": 16 * len(ids), "out": 2, "ids": ids})
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen, hit = set(), 0
    for row in rows:
        chain = tuple(row["ids"])
        hit += 16 * next((k for k in range(len(chain), 0, -1) if chain[:k] in seen), 0)
        seen.update(chain[:k] for k in range(1, len(chain) + 1))
    expected = 100 * hit / sum(r["in"] for r in rows)
    assert expected > 10
    out = tmp_path / "run"
    code, stdout, _ = run_cli(
        [
            "run",
            "--model",
            "tiny",
            "--backend",
            "engine",
            "--num-blocks",
            "512",
            "--max-model-len",
            "1024",
            "--no-progress",
            "--warmup-steps",
            "0",
            "--enable-prefix-caching",
            "--workload",
            f"timed_trace:{path}",
            "--timed-trace-label-timestamp",
            "ts",
            "--timed-trace-label-input-length",
            "in",
            "--timed-trace-label-output-length",
            "out",
            "--timed-trace-label-hash-ids",
            "ids",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0, stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prefix_cache_hit_rate_pct"] == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(
    "name, error",
    [
        ("timed_trace", "timed_trace:PATH"),
        ("random:x.csv", "'random'"),
        ("burstgpt:/no/such.csv", "no such file"),
    ],
)
def test_dataset_names_and_paths_are_checked(name, error):
    with pytest.raises(UserError, match=error):
        build_workload(WorkloadSpec(name=name))


def test_bad_dataset_files_are_one_line_errors(tmp_path, capsys):
    bad = {
        "timed_trace": '{"timestamp": 0, "input_length": 3.5, "output_length": 2, "hash_ids": [1]}\n',
        "custom": '{"text": "no prompt field"}\n',
        "burstgpt": "Timestamp,Model,Request tokens\n1,GPT-4,5\n",
    }
    for kind, text in bad.items():
        path = tmp_path / f"{kind}.data"
        path.write_text(text)
        code, _, err = run_cli(["run", "--model", "tiny", "--workload", f"{kind}:{path}", "--no-progress"], capsys)
        assert code == 2 and err.count("\n") == 1 and err.startswith("chunkbench: error: --workload"), (kind, err)
    code, _, err = run_cli(
        ["run", "--model", "tiny", "--workload", "random", "--random-range-ratio", "1", "--no-progress"], capsys
    )
    assert code == 2 and "--random-range-ratio" in err


def test_a_vllm_bench_serve_command_line_runs_with_chunkbench_bench(tmp_path, capsys):
    """vLLM's names: --base-url and an --endpoint path, --backend openai-chat, --dataset-name random with its
    options, --num-prompts, --request-rate, options it accepts and ignores; and --plot-timeline."""
    script = [0.01, chat_tok("x", "assistant"), 0.01, chat_tok(), 0.01, chat_tok(), usage(3), DONE]
    with ScriptedServer({3: script}, card={"id": "m", "vocab_size": 1000}) as server:
        base = server.url.removesuffix("/v1")
        code, stdout, _ = run_cli(
            [
                "bench",
                "--backend",
                "openai-chat",
                "--base-url",
                base,
                "--endpoint",
                "/v1/chat/completions",
                "--served-model-name",
                "m",
                "--dataset-name",
                "random",
                "--random-input-len",
                "12",
                "--random-output-len",
                "3",
                "--num-prompts",
                "4",
                "--request-rate",
                "50",
                "--trust-remote-code",
                "--ignore-eos",
                "--disable-tqdm",
                "--plot-timeline",
                "--timeline-itl-thresholds",
                "5,20",
                "--save-result",
                "--result-dir",
                str(tmp_path / "r"),
                "--out",
                str(tmp_path / "o"),
            ],
            capsys,
        )
    assert code == 0, stdout
    assert len(server.served) == 4 and all(s.path == "/v1/chat/completions" for s in server.served)
    assert all(s.body["model"] == "m" and s.body["max_completion_tokens"] == 3 for s in server.served)
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["completed"] == 4 and summary["workload"]["name"] == "random"
    (timeline,) = (tmp_path / "r").glob("*.timeline.html")
    check_timeline(timeline.read_text(), requests=4)


def check_timeline(text: str, requests: int) -> None:
    """Well-formed HTML whose SVG parses as XML and has a titled group per request."""

    class Tags(HTMLParser):
        def __init__(self):
            super().__init__()
            self.stack, self.errors = [], []

        def handle_starttag(self, tag, attrs):
            if tag not in ("meta", "rect"):
                self.stack.append(tag)

        def handle_startendtag(self, tag, attrs):
            pass

        def handle_endtag(self, tag):
            if tag in ("meta", "rect"):
                return
            if not self.stack or self.stack.pop() != tag:
                self.errors.append(tag)

    tags = Tags()
    tags.feed(text)
    assert tags.errors == [] and tags.stack == [], (tags.errors, tags.stack)
    svg = ElementTree.fromstring(text[text.index("<svg") : text.index("</svg>") + 6])
    groups = svg.findall("{http://www.w3.org/2000/svg}g")
    assert len(groups) == requests and all(g.find("{http://www.w3.org/2000/svg}title") is not None for g in groups)


def test_timeline_colours_each_gap_by_the_thresholds():
    records = [
        RequestRecord(8, 4, 0.0, [0.1, 0.11, 0.14, 0.25], send_time=0.0),  # gaps 10, 30, 110 ms
        RequestRecord(8, 4, 0.05, [], error="boom", send_time=0.05, end_time=0.2),
    ]
    text = timeline_html(records, (20.0, 50.0), "t")
    check_timeline(text, requests=2)
    svg = ElementTree.fromstring(text[text.index("<svg") : text.index("</svg>") + 6])
    first, second = svg.findall("{http://www.w3.org/2000/svg}g")
    fills = [r.get("fill") for r in first.findall("{http://www.w3.org/2000/svg}rect")]
    assert fills == ["#b0b0b0", "#2ca02c", "#ff7f0e", "#d62728"]  # wait, < 20 ms, <= 50 ms, > 50 ms
    widths = [float(r.get("width")) for r in first.findall("{http://www.w3.org/2000/svg}rect")]
    assert widths[3] / widths[0] == pytest.approx(1.1, rel=1e-3)  # 110 ms against the 100 ms wait
    assert "failed: boom" in second.find("{http://www.w3.org/2000/svg}title").text
    failed_width = float(second.find("{http://www.w3.org/2000/svg}rect").get("width"))
    assert failed_width == pytest.approx(widths[0] * 1.5, rel=1e-3)  # send to end: 150 ms


@pytest.mark.parametrize(
    "args, error",
    [
        (["--port", "99999"], "--port must be <= 65535"),
        (["--timeline-itl-thresholds", "inf,inf"], "--timeline-itl-thresholds must be a finite number"),
        (["--timeline-itl-thresholds", "50,5"], "needs 0 <= LOW <= HIGH"),
        (["--dataset-name", "sonnet"], "--dataset-name: chunkbench reads"),
        (["--endpoint", "/v1/embeddings"], "an API path must be one of"),
    ],
)
def test_vllm_style_bench_flags_are_checked_before_any_request(args, error, capsys):
    code, _, err = run_cli(["bench", *args, "--num-prompts", "1"], capsys)
    assert code == 2 and err.count("\n") == 1 and error in err, err


def test_custom_prompts_that_look_like_numbers_are_text(tmp_path):
    """As vLLM 0.34 reads a custom JSONL: "00123" is five characters of text, not the number 123 (then no text)."""
    path = tmp_path / "digits.jsonl"
    path.write_text('{"prompt": "00123456"}\n{"prompt": "0042"}\n')
    assert counts(f"custom:{path}", num_requests=None, custom_output_len=8) == [(2, 8), (1, 8)]
