"""Chunking changes when prompt tokens are computed, never what: every policy and knob gives the same tokens."""

import random

import pytest
import torch
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.engine import LLMEngine
from chunkbench.engine.request import SamplingParams

PROMPT_LENS = [1, 2, 15, 16, 17, 33, 64, 100, 127, 200, 256, 301, 420, 512, 613, 700]
MAX_TOKENS = 32


def prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4096) for _ in range(n)] for n in PROMPT_LENS]


def run(dtype: str = "float32", sampling: SamplingParams | None = None, **kwargs) -> tuple[list, LLMEngine]:
    kwargs.setdefault("num_blocks", 1024)
    engine = LLMEngine(EngineConfig.create("tiny", dtype=dtype, **kwargs))
    engine.executor.keep_logits = True
    sampling = sampling or SamplingParams(max_tokens=MAX_TOKENS)
    requests = [engine.add_request(p, sampling) for p in prompts()]
    margins = {}  # smallest top-2 logit gap seen per request, to diagnose a flipped near-tie
    while engine.has_unfinished():
        engine.step()
        for rid, logits in engine.executor.last_logits.items():
            top2 = logits.topk(2).values
            margins[rid] = min(margins.get(rid, float("inf")), float(top2[0] - top2[1]))
    assert all(r.num_output_tokens == MAX_TOKENS for r in requests)
    return [r.output_token_ids for r in requests], engine, margins


CONFIGS = {
    "static": dict(policy="static"),
    "continuous": dict(policy="continuous"),
    "orca": dict(policy="orca"),
    "chunked-16": dict(policy="chunked", max_num_batched_tokens=16),
    "chunked-64": dict(policy="chunked", max_num_batched_tokens=64),
    "chunked-512": dict(policy="chunked", max_num_batched_tokens=512),
    "chunked-cap-48": dict(policy="chunked", max_num_batched_tokens=512, chunk_size=48),
    "chunked-schedule": dict(policy="chunked", max_num_batched_tokens=512, chunk_schedule="256,64,16"),
    "chunked-tile-16": dict(policy="chunked", max_num_batched_tokens=100, chunk_size=70, tile=16),
    "chunked-partial-1": dict(policy="chunked", max_num_batched_tokens=64, max_partial_prefills=1),
    "chunked-partial-4": dict(policy="chunked", max_num_batched_tokens=64, max_partial_prefills=4),
    "chunked-seats-3": dict(policy="chunked", max_num_batched_tokens=64, max_num_seqs=3),
}
PREEMPTING = {  # 50 blocks of 16 tokens hold about two of the longest requests at once
    "chunked-preempt": dict(policy="chunked", max_num_batched_tokens=64, num_blocks=50),
    "continuous-preempt": dict(policy="continuous", num_blocks=50),
    "orca-preempt": dict(policy="orca", num_blocks=50),
    "static-preempt": dict(policy="static", num_blocks=50),
}


@pytest.fixture(scope="module")
def reference():
    tokens, _, margins = run(policy="continuous")
    return tokens, margins


def assert_same(tokens, reference, name):
    expected, margins = reference
    for i, (got, want) in enumerate(zip(tokens, expected)):
        if got != want:
            pos = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
            pytest.fail(
                f"{name}: request {i} (prompt {PROMPT_LENS[i]} tokens) differs at output {pos}: "
                f"{got[pos]} vs {want[pos]}; smallest top-2 logit margin of the request "
                f"{margins.get(str(i)):.2e}"
            )


@pytest.mark.parametrize("name", CONFIGS)
def test_policies_give_identical_greedy_tokens(name, reference):
    tokens, engine, _ = run(**CONFIGS[name])
    assert_same(tokens, reference, name)
    assert engine.scheduler.num_preemptions == 0


@pytest.mark.parametrize("name", PREEMPTING)
def test_preemption_by_recompute_keeps_tokens(name, reference):
    tokens, engine, _ = run(**PREEMPTING[name])
    assert engine.scheduler.num_preemptions > 0, "the cache was meant to be small enough to preempt"
    assert_same(tokens, reference, name)
    assert engine.block_manager.num_used_blocks == 0


def test_seeded_sampling_does_not_depend_on_batching():
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.9, seed=1234)
    a, _, _ = run(sampling=sampling, policy="continuous")
    b, _, _ = run(sampling=sampling, policy="chunked", max_num_batched_tokens=32, chunk_schedule="64,16")
    greedy, _, _ = run(policy="continuous")
    assert a == b
    assert a != greedy  # it did sample


def test_chunk_schedule_and_tile_shape_the_steps():
    engine = LLMEngine(
        EngineConfig.create(
            "tiny", policy="chunked", max_num_batched_tokens=512, chunk_schedule="256,64,16", num_blocks=256
        )
    )
    engine.add_request(list(range(700)), SamplingParams(max_tokens=2))
    chunks = []
    while engine.has_unfinished():
        engine.step()
        output, _ = engine.last_step
        chunks.append(output.chunks[0].num_tokens)
    # 256, then 64, then 16 repeated: 700 = 256 + 64 + 23*16 + 12, then one decode.
    assert chunks == [256, 64] + [16] * 23 + [12, 1]

    engine = LLMEngine(
        EngineConfig.create("tiny", policy="chunked", max_num_batched_tokens=100, tile=16, num_blocks=256)
    )
    engine.add_request(list(range(300)), SamplingParams(max_tokens=4))
    steps = []
    while engine.has_unfinished():
        engine.step()
        steps.append(engine.last_step[0].num_tokens)
    assert steps[:3] == [96, 96, 96]  # cut chunks trimmed from 100 to the tile; the last one completes
    assert steps[3] == 12


@pytest.mark.slow
def test_float64_matches_float32_tokens(reference):
    """The fp32 equivalence is not luck: the same tokens come out of an fp64 run."""
    tokens, _, _ = run(dtype="float64", policy="chunked", max_num_batched_tokens=64)
    assert_same(tokens, reference, "chunked-64 in float64")


def test_engine_rejects_only_the_impossible_request():
    engine = LLMEngine(EngineConfig.create("tiny", max_model_len=512, num_blocks=64))
    ok = engine.add_request(list(range(100)), SamplingParams(max_tokens=4))
    too_long = engine.add_request(list(range(600)), SamplingParams(max_tokens=4))
    too_big = engine.add_request(list(range(500)), SamplingParams(max_tokens=1000))  # > 64 blocks * 16
    empty = engine.add_request([], SamplingParams(max_tokens=4))
    finished = []
    while engine.has_unfinished():
        finished += [r for r in engine.step() if r.is_finished]
    assert ok.output_token_ids and ok.finish_reason == "length"
    assert too_long.error == "prompt has 600 tokens, more than max_model_len (512)"
    assert too_big.finish_reason == "length" and too_big.num_tokens == 512  # stops at max_model_len
    assert empty.error == "prompt is empty"
    assert {r.request_id for r in finished} == {
        ok.request_id,
        too_long.request_id,
        too_big.request_id,
        empty.request_id,
    }
    small_cache = LLMEngine(EngineConfig.create("tiny", num_blocks=4))
    huge = small_cache.add_request(list(range(100)), SamplingParams(max_tokens=4))
    assert huge.error == "needs 7 KV blocks for 103 tokens, the cache has 4"


def test_abort_frees_blocks():
    engine = LLMEngine(EngineConfig.create("tiny", num_blocks=64))
    a = engine.add_request(list(range(50)), SamplingParams(max_tokens=8))
    b = engine.add_request(list(range(70)), SamplingParams(max_tokens=8))
    engine.step()
    assert engine.block_manager.num_used_blocks == 4 + 5
    engine.abort(a.request_id)
    assert a.finish_reason == "abort" and engine.block_manager.num_used_blocks == 5
    while engine.has_unfinished():
        engine.step()
    assert b.num_output_tokens == 8 and engine.block_manager.num_used_blocks == 0
    assert torch.get_default_dtype() == torch.float32
