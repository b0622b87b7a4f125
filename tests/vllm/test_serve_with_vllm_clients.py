"""vLLM's own client against `chunkbench serve`: `vllm bench serve --backend vllm` (completions) and
`--backend openai-chat` (chat, content as a list of text parts), both as vLLM 0.32 sends them (repetition_penalty,
logprobs null, stream_options), from the tier's venv, against `chunkbench serve --model <the tiny HF dir>`. Every
request succeeds, and the token counts vLLM's client reports (from the usage chunks) are the server's own
(its vllm:request_*_tokens histograms). And the chat template path under the tier's transformers (the lower end
of the range pyproject.toml allows) gives the same prompt tokens as under the project's."""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, free_port
from tests.vllm.conftest import VLLM_CLI, VLLM_PYTHON, start_server, vllm_env

NUM_PROMPTS = 40
INPUT_LEN, OUTPUT_LEN = 32, 16


@contextlib.contextmanager
def chunkbench_serve(model: Path, log: Path):
    """`chunkbench serve --model DIR` as a user runs it (this venv's console script); its base URL."""
    port = free_port()
    args = [
        str(Path(sys.executable).parent / "chunkbench"),
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--max-model-len",
        "2048",
    ]
    with start_server(args, log, timeout_s=120, env=dict(os.environ)) as url:
        yield url.removesuffix("/v1")


def served_tokens(base: str) -> dict[str, float]:
    """The server's own counts: requests, prompt and generated tokens (vLLM's histogram names)."""
    out = {}
    for family in text_string_to_metric_families(httpx.get(base + "/metrics").text):
        for sample in family.samples:
            if sample.name in (
                "vllm:request_prompt_tokens_count",
                "vllm:request_prompt_tokens_sum",
                "vllm:request_generation_tokens_sum",
            ):
                out[sample.name.removeprefix("vllm:request_")] = sample.value
    return out


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    with chunkbench_serve(tiny_model, tmp_path_factory.mktemp("serve") / "serve.log") as base:
        yield base


@pytest.mark.parametrize("backend, endpoint", [("vllm", "/v1/completions"), ("openai-chat", "/v1/chat/completions")])
def test_vllm_bench_serve_against_chunkbench_serve(server, tiny_model, tmp_path, backend, endpoint):
    before = served_tokens(server)
    # --ready-check-timeout-sec 0: no untimed test request, so the server's counts are the benchmark's alone.
    done = subprocess.run(
        [
            str(VLLM_CLI),
            "bench",
            "serve",
            "--backend",
            backend,
            "--base-url",
            server,
            "--endpoint",
            endpoint,
            "--model",
            tiny_model.name,
            "--tokenizer",
            str(tiny_model),
            "--dataset-name",
            "random",
            "--random-input-len",
            str(INPUT_LEN),
            "--random-output-len",
            str(OUTPUT_LEN),
            "--num-prompts",
            str(NUM_PROMPTS),
            "--ignore-eos",
            "--ready-check-timeout-sec",
            "0",
            "--save-result",
            "--result-dir",
            str(tmp_path),
            "--result-filename",
            "result.json",
            "--disable-tqdm",
        ],
        env=vllm_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    after = served_tokens(server)
    assert result["completed"] == NUM_PROMPTS and result["failed"] == 0, result.get("errors")
    assert after["prompt_tokens_count"] - before["prompt_tokens_count"] == NUM_PROMPTS
    assert result["total_input_tokens"] == after["prompt_tokens_sum"] - before["prompt_tokens_sum"]
    assert result["total_output_tokens"] == after["generation_tokens_sum"] - before["generation_tokens_sum"]
    assert result["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN  # --ignore-eos: every request its full length
    print(
        f"\n{backend}: {result['completed']} of {NUM_PROMPTS} requests, {result['total_input_tokens']} prompt and "
        f"{result['total_output_tokens']} output tokens, as the server counted them"
    )


RENDER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("server_text", sys.argv[1])
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
import transformers
tokenizer = module.load_tokenizer(sys.argv[2])
messages = json.loads(sys.argv[3])
print(json.dumps([transformers.__version__, module.chat_prompt_ids(tokenizer, messages)]))
"""


def test_the_chat_template_gives_the_same_prompt_under_both_transformers_ends(tiny_model):
    """chunkbench/serving/text.py imports nothing from chunkbench, so the tier's venv (its own transformers) runs it as
    is."""
    messages = json.dumps([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}])
    outputs = [
        json.loads(
            subprocess.run(
                [
                    str(python),
                    "-c",
                    RENDER,
                    str(REPO / "chunkbench" / "serving" / "text.py"),
                    str(tiny_model),
                    messages,
                ],
                capture_output=True,
                text=True,
                check=True,
                env=vllm_env(),
                timeout=120,
                cwd=tiny_model,  # not the checkout: `-c` puts it first on sys.path, and its kernels/ would hide
            ).stdout  # Hugging Face's `kernels`, which transformers imports
        )
        for python in (VLLM_PYTHON, Path(sys.executable))
    ]
    (theirs, their_ids), (ours, our_ids) = outputs
    print(f"\ntransformers {theirs} and {ours}: {len(our_ids)} prompt tokens")
    assert their_ids == our_ids and len(our_ids) > 5


def test_text_usage_and_stop_strings_match_vllm_on_the_same_weights(server, vllm_server, tiny_model):
    """Greedy, the same request to both servers: the same text, token counts, and where a stop string ends it."""
    chat = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "the city"}, {"type": "text", "text": "of"}]},
        ]
    }
    for path, body in (("/completions", {"prompt": "the first school of the city"}), ("/chat/completions", chat)):
        body = {**body, "max_tokens": 24, "temperature": 0, "repetition_penalty": 1.0}

        def both(**extra):
            theirs = httpx.post(vllm_server + path, json={**body, **extra, "model": str(tiny_model)}, timeout=60)
            ours = httpx.post(server + "/v1" + path, json={**body, **extra}, timeout=60)
            assert theirs.status_code == ours.status_code == 200, (theirs.text, ours.text)
            counts = ("prompt_tokens", "completion_tokens", "total_tokens")  # vLLM adds *_details: None
            return [(r.json()["choices"][0], {k: r.json()["usage"][k] for k in counts}) for r in (theirs, ours)]

        def text(choice):
            return choice["text"] if "text" in choice else choice["message"]["content"]

        (vllm_choice, vllm_usage), (choice, usage) = both()
        assert text(choice) == text(vllm_choice) and usage == vllm_usage
        full = text(vllm_choice)
        stop = full[len(full) // 2 : len(full) // 2 + 3]  # from the middle: both must end before it
        (vllm_choice, vllm_usage), (choice, usage) = both(stop=[stop])
        assert text(choice) == text(vllm_choice) == full[: full.index(stop)]
        assert choice["finish_reason"] == vllm_choice["finish_reason"] == "stop"
        assert choice["stop_reason"] == vllm_choice["stop_reason"] == stop
        assert usage == vllm_usage
        print(f"\n{path}: {usage['completion_tokens']} tokens up to the stop {stop!r}, as vLLM")
