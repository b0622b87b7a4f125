"""chunkbench's `chunked` scheduler makes vLLM 0.32's decisions: the oracle is vLLM's own scheduler.

Each stream (generated from a seed: budgets, seats, chunk caps, a lone long prompt, a KV cache small enough to
preempt, shared prefixes with prefix caching on, a stream that ends while a long prompt still prefills, and
vLLM's scheduler knobs) runs through vLLM's LLMEngine in-process (tests/vllm/vllm_oracle.py, under vLLM's venv,
which records every step's SchedulerOutput.num_scheduled_tokens) and through chunkbench's simulator on the same
prompt token ids, every request arriving before the first step so that timing cannot change a decision. The
two must agree step by step: the same requests get the same tokens in every step, with the same number of
preemptions and the same prefix-cache hits per request. vLLM counts a null block: chunkbench's N blocks are its
num_gpu_blocks_override N + 1. A new vLLM release that schedules differently fails here, step by step.
"""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from chunkbench.bench.backends import DEFAULT_SIM_GPU
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.knobs import VLLM_VERSION
from chunkbench.engine.request import SamplingParams
from chunkbench.sim.executor import sim_engine
from chunkbench.sim.roofline import RooflineCostModel, gpu_spec
from tests.conftest import REPO
from tests.vllm.conftest import VLLM_BLOCK, VLLM_PYTHON, vllm_env

VOCAB = 600  # ids below the tiny Llama's vocabulary (659)
MAX_MODEL_LEN = 2048


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
    for name in (
        "scheduler_reserve_full_isl",
        "long_prefill_token_threshold_adaptive",
        "max_num_active_seqs",
        "watermark",
    ):
        if name in knobs:
            args[name] = knobs[name]
    return args


def chunkbench_steps(model, knobs: dict, requests: list[dict]) -> dict:
    """The stream through chunkbench's simulator (its engine loop, step by step): the same record as vLLM's."""
    config = EngineConfig.create(str(model), policy="chunked", block_size=VLLM_BLOCK, **knobs)
    cost = RooflineCostModel.for_config(config, gpu_spec(DEFAULT_SIM_GPU), None)
    engine = sim_engine(config, cost, knobs["num_blocks"], fast_forward=False)
    added = [
        engine.add_request(
            r["prompt"],
            SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True),
            request_id=r["id"],
            arrival_time=0.0,
        )
        for r in requests
    ]
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


@pytest.fixture(scope="module")
def oracle(tiny_model, tmp_path_factory) -> dict:
    """vLLM's record of every stream (one subprocess under vLLM's venv, ~10 s plus ~2 s a stream)."""
    folder = tmp_path_factory.mktemp("oracle")
    spec = dict(
        model=str(tiny_model),
        streams=[dict(name=s["name"], engine=vllm_engine_args(s["knobs"]), requests=s["requests"]) for s in streams()],
    )
    (folder / "in.json").write_text(json.dumps(spec))
    run = subprocess.run(
        [
            str(VLLM_PYTHON),
            str(REPO / "tests" / "vllm" / "vllm_oracle.py"),
            str(folder / "in.json"),
            str(folder / "out.json"),
        ],
        env=vllm_env(VLLM_ENABLE_V1_MULTIPROCESSING="0"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((folder / "out.json").read_text())


def test_the_oracle_is_the_vllm_release_the_knobs_name(oracle):
    assert oracle["vllm_version"] == VLLM_VERSION
    assert {s["scheduler"] for s in oracle["streams"].values()} == {"vllm.v1.core.sched.scheduler.Scheduler"}


def _first_difference(ours: list, theirs: list) -> str:
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if dict(a) != dict(b):
            return f"step {i + 1}: chunkbench {a}, vLLM {b}"
    return f"chunkbench ran {len(ours)} steps, vLLM {len(theirs)}"


@pytest.mark.parametrize("stream", streams(), ids=lambda s: s["name"])
def test_chunked_makes_vllms_decisions(stream, oracle, tiny_model):
    theirs = oracle["streams"][stream["name"]]
    ours = chunkbench_steps(tiny_model, stream["knobs"], stream["requests"])
    assert [dict(s) for s in ours["steps"]] == [dict(s) for s in theirs["steps"]], _first_difference(
        ours["steps"], theirs["steps"]
    )
    assert ours["preemptions"] == theirs["preemptions"]
    assert ours["cached"] == theirs["cached"]


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
