"""What real clients send `chunkbench serve`, against a tiny Hugging Face directory (a trained BPE
tokenizer with a chat template, scripts/tiny_llama.py): the official OpenAI SDK, vLLM's request shapes (neutral
values of fields the server does not implement, unknown fields, content parts), and the sampling extensions
(stop strings, stop_token_ids, min_tokens, top_k, seed, echo), each checked against an answer known from a
greedy run of the same request."""

import contextlib
import json
import logging
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import torch
import uvicorn
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.executor import sample
from chunkbench.engine.outputs import ScheduledChunk
from chunkbench.engine.request import Request, SamplingParams
from fastapi.testclient import TestClient

from chunkbench.serving.server import create_app
from tests.conftest import REPO, free_port
from tests.serving.test_server import idle

MAX_MODEL_LEN = 256
PROMPT = "the first school of the city"


def tiny_hf_dir(path, chat_template: bool = True):
    """scripts/tiny_llama.py's model (about 5 s to write)."""
    flags = [] if chat_template else ["--no-chat-template"]
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "tiny_llama.py"), str(path), *flags],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return path


@contextlib.contextmanager
def serving(app):
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="critical"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    while not uv.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{uv.config.port}"
    finally:
        uv.should_exit = True
        thread.join(timeout=20)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return tiny_hf_dir(tmp_path_factory.mktemp("hf") / "tiny-llama")


@pytest.fixture(scope="module")
def server(hf_dir):
    app = create_app(
        EngineConfig.create(str(hf_dir), max_model_len=MAX_MODEL_LEN, num_blocks=256, max_num_batched_tokens=128)
    )
    with serving(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0)


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


# ---- the OpenAI SDK ----


def test_openai_sdk_completions_stop_where_stop_says_streaming_or_not(client):
    full = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=24, temperature=0)
    text = full.choices[0].text
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 24 and len(text) > 10
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    stopped = client.completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop], seed=3
    )
    assert stopped.choices[0].text == text[: text.index(stop)] and stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens < 24
    chunks = list(
        client.completions.create(
            model="tiny-llama",
            prompt=PROMPT,
            max_tokens=24,
            temperature=0,
            stop=stop,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text[: text.index(stop)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == stopped.usage.completion_tokens


def test_openai_sdk_chat_streaming_or_not(client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    full = client.chat.completions.create(
        model="tiny-llama", messages=messages, max_completion_tokens=20, temperature=0
    )
    text = full.choices[0].message.content
    assert full.choices[0].message.role == "assistant" and full.usage.completion_tokens == 20
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    chunks = list(
        client.chat.completions.create(
            model="tiny-llama",
            messages=messages,
            max_tokens=20,
            temperature=0,
            stop=[stop],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text[: text.index(stop)]
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_openai_sdk_seed_makes_sampling_repeatable(client):
    def draw(seed):
        return (
            client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=16, temperature=1.0, seed=seed)
            .choices[0]
            .text
        )

    assert draw(5) == draw(5)
    assert len({draw(seed) for seed in range(4)}) > 1  # different seeds, different samples


# ---- vLLM's request shapes ----


def test_what_vllms_client_sends_is_served_and_unknown_fields_are_logged_once(server, caplog):
    url, _ = server
    body = {
        "model": "tiny-llama",
        "prompt": PROMPT,
        "repetition_penalty": 1.0,
        "max_tokens": 4,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "stop": None,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "top_k": -1,
        "min_tokens": 0,
        "echo": False,
        "best_of": 1,
        "n": 1,
        "min_p": 0.0,
        "a_field_nobody_knows": {"x": [1]},
    }
    with caplog.at_level(logging.WARNING, logger="chunkbench.serving.server"):
        for _ in range(2):
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
                assert response.status_code == 200
                events = [
                    json.loads(line[6:])
                    for line in response.iter_lines()
                    if line.startswith("data: ") and line != "data: [DONE]"
                ]
    assert [e["usage"]["completion_tokens"] for e in events] == [1, 2, 3, 4, 4]  # continuous, then the total
    assert events[-2]["choices"][0]["finish_reason"] == "length" and events[-1]["choices"] == []
    logged = [r.getMessage() for r in caplog.records if "a_field_nobody_knows" in r.getMessage()]
    assert len(logged) == 1  # once, not per request


@pytest.mark.parametrize(
    "field, value",
    [
        ("presence_penalty", 0.5),
        ("repetition_penalty", 1.2),
        ("logprobs", 2),
        ("best_of", 2),
        ("logit_bias", {"5": 10}),
        ("n", 2),
    ],
)
def test_a_known_field_that_would_change_the_result_is_a_400_naming_it(server, field, value):
    response = post(server[0], "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, field: value})
    assert response.status_code == 400 and response.json()["error"]["param"] == field, response.text


def test_chat_content_parts_are_the_text_joined_and_other_parts_are_a_400(server):
    url, _ = server
    as_string = post(
        url,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hello\nworld"}], "max_tokens": 6, "temperature": 0},
    ).json()
    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]
    as_parts = post(
        url,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": parts}], "max_tokens": 6, "temperature": 0},
    ).json()
    assert as_parts["choices"][0]["message"] == as_string["choices"][0]["message"]
    assert as_parts["usage"] == as_string["usage"]
    image = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    refused = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": image}], "max_tokens": 2})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages.0.content.0.type"
    assert "image_url" in refused.json()["error"]["message"]


def test_the_chat_prompt_is_the_template_rendered_then_tokenized(server, hf_dir):
    """transformers 5's apply_chat_template(tokenize=True) returns a BatchEncoding: the server renders text."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    messages = [{"role": "user", "content": "hello"}]
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    usage = post(server[0], "/v1/chat/completions", {"messages": messages, "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == len(ids)


def test_a_model_without_a_chat_template_answers_chat_with_a_400(tmp_path):
    hf = tiny_hf_dir(tmp_path / "no-template", chat_template=False)
    app = create_app(EngineConfig.create(str(hf), max_model_len=64, num_blocks=16))
    with TestClient(app) as http:
        response = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
        assert "no chat template" in response.json()["error"]["message"]
        assert http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


# ---- the sampling extensions, against a greedy run of the same request ----


def greedy_ids(server, **extra) -> tuple[dict, list[int]]:
    url, app = server
    body = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, **extra}).json()
    return body, app.state.engine.finished[body["id"]].output_token_ids


def test_stop_token_ids_end_at_the_first_such_token_and_min_tokens_masks_it(server):
    _, ids = greedy_ids(server)
    k = 3
    token = ids[k]
    first = ids.index(token)
    body, stopped = greedy_ids(server, stop_token_ids=[token])
    assert stopped == ids[: first + 1] and body["usage"]["completion_tokens"] == first + 1
    assert body["choices"][0]["finish_reason"] == "stop" and body["choices"][0]["stop_reason"] == token
    body, masked = greedy_ids(server, stop_token_ids=[token], min_tokens=first + 2)
    assert masked[:first] == ids[:first] and token not in masked[: first + 2] and len(masked) >= first + 2


def test_top_k_1_samples_the_greedy_tokens_and_echo_prepends_the_prompt(server):
    greedy, ids = greedy_ids(server)
    sampled, top1 = greedy_ids(server, temperature=1.0, top_k=1, seed=11)
    assert top1 == ids and sampled["choices"][0]["text"] == greedy["choices"][0]["text"]
    echoed, _ = greedy_ids(server, echo=True)
    assert echoed["choices"][0]["text"] == PROMPT + greedy["choices"][0]["text"]


def test_min_tokens_masks_eos_in_the_sampler_and_in_the_stop_check():
    sampling = SamplingParams(max_tokens=8, min_tokens=2, stop_token_ids=(4,))
    chunk = ScheduledChunk(
        request_id="r",
        token_ids=[1],
        start_pos=0,
        block_table=[0],
        sample=True,
        is_decode=True,
        sampling=sampling,
        sample_index=0,
        sample_seed=0,
    )
    logits = torch.tensor([[0.0, 9.0, 8.0, 1.0, 7.0]])  # EOS (1) first, then 2, then stop id 4
    assert sample(logits, [chunk], eos_token_id=1) == [2]
    late = ScheduledChunk("r", [1], 0, [0], True, True, sampling, sample_index=2, sample_seed=0)
    assert sample(logits, [late], eos_token_id=1) == [1]
    request = Request("r", [5], sampling, eos_token_id=1)
    request.append_output(1, 0.0)
    assert not request.is_finished  # one output, min_tokens 2: EOS does not end it yet
    request.append_output(4, 0.0)
    assert request.finish_reason == "stop" and request.stop_reason == 4


# ---- limits, as vLLM states them ----


def test_max_tokens_beyond_the_room_left_is_a_400_naming_both_numbers(server):
    url, _ = server
    prompt = list(range(10, 110))  # 100 tokens: 156 left under max_model_len 256
    refused = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 157})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"
    assert "256" in refused.json()["error"]["message"] and "157" in refused.json()["error"]["message"]
    assert post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 156}).status_code == 200
    whole = post(url, "/v1/completions", {"prompt": list(range(10, 10 + MAX_MODEL_LEN)), "max_tokens": 1})
    assert whole.status_code == 400 and whole.json()["error"]["param"] == "prompt"
    chat = post(
        url,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0, "max_completion_tokens": 4},
    )
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "max_tokens"
    assert idle(server[1].state.engine) == 0


def test_405_keeps_allow_and_a_json_syntax_error_names_no_field(server):
    url, _ = server
    response = httpx.delete(url + "/health")
    assert response.status_code == 405 and response.headers["allow"] == "GET"
    broken = httpx.post(
        url + "/v1/completions", content=b'{"prompt": "x",}', headers={"content-type": "application/json"}
    )
    assert broken.status_code == 400 and broken.json()["error"]["param"] is None
    assert "not valid JSON" in broken.json()["error"]["message"]


def test_greedy_sampling_takes_torch_argmax_choice_on_ties_nan_and_all_inf_rows():
    """The CPU path's NumPy argmax (executor.sample) must pick what torch.argmax picks: the first maximum."""
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [1.0, nan, 5.0, nan], [-inf, -inf, -inf, -inf], [0.0, 0.0, 0.0, 2.0]])
    chunks = [
        ScheduledChunk(f"r{i}", [1], 0, [0], True, True, SamplingParams(max_tokens=2), sample_index=0, sample_seed=0)
        for i in range(len(logits))
    ]
    assert sample(logits, chunks) == logits.argmax(dim=-1).tolist() == [1, 1, 0, 3]
