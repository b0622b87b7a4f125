"""Prefix caching reuses KV blocks of shared prefixes and never changes the tokens."""

import random

import pytest
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.engine import LLMEngine, VirtualClock
from chunkbench.engine.request import SamplingParams
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chunkbench.workloads.spec import WorkloadSpec, build_workload
from tests.engine.test_scheduler_properties import EchoExecutor

SYSTEM = [random.Random(7).randrange(4096) for _ in range(90)]  # 5 full blocks of 16, and 10 tokens more


def prompts():
    rng = random.Random(3)
    own = [[rng.randrange(4096) for _ in range(n)] for n in (1, 7, 40, 70, 120, 5, 33)]
    return [SYSTEM + tail for tail in own] + [SYSTEM[:40], SYSTEM[:48], SYSTEM + own[2]]  # last: an exact repeat


def generate(caching: bool, **kwargs):
    kwargs.setdefault("num_blocks", 512)
    engine = LLMEngine(EngineConfig.create("tiny", enable_prefix_caching=caching, **kwargs))
    outputs = []
    for prompt in prompts():  # one at a time, so later requests find earlier ones' blocks
        request = engine.add_request(prompt, SamplingParams(max_tokens=12))
        while engine.has_unfinished():
            engine.step()
        outputs.append((request.output_token_ids, request.num_cached_tokens))
    assert engine.block_manager.num_used_blocks == 0
    return outputs, engine


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(policy="chunked", max_num_batched_tokens=16),
        dict(policy="chunked", max_num_batched_tokens=24),  # cached prefix ends inside a chunk
        dict(policy="chunked", max_num_batched_tokens=64, chunk_schedule="40,8"),
        dict(policy="continuous"),
        dict(policy="orca"),
        dict(policy="static"),
        dict(policy="chunked", max_num_batched_tokens=32, num_blocks=14),  # evictions and reuse
    ],
)
def test_same_tokens_with_and_without_caching(kwargs):
    off, _ = generate(False, **kwargs)
    on, engine = generate(True, **kwargs)
    assert [tokens for tokens, _ in on] == [tokens for tokens, _ in off]
    cached = [c for _, c in on]
    if kwargs.get("num_blocks") != 14:
        assert cached[0] == 0 and cached[1:7] == [80] * 6  # 5 full blocks of the system prompt
        assert cached[7] == 32 and cached[8] == 32  # 40 tokens: 2 full blocks; 48: 3 full, one is kept to compute
        assert cached[9] == 128  # the 130-token repeat: all 8 full blocks cached, 2 tokens left to compute
    assert all(c == 0 for _, c in off)


def test_batched_requests_share_blocks_while_running():
    engine = LLMEngine(
        EngineConfig.create(
            "tiny", policy="chunked", max_num_batched_tokens=256, num_blocks=64, enable_prefix_caching=True
        )
    )
    first = engine.add_request(SYSTEM + [1, 2, 3], SamplingParams(max_tokens=30))
    engine.step()  # the first request's prompt is computed and its 5 full blocks cached
    second = engine.add_request(SYSTEM + [4, 5], SamplingParams(max_tokens=30))
    engine.step()
    shared = set(engine.block_manager.block_table(first.request_id)[:5])
    assert second.num_cached_tokens == 80
    assert shared == set(engine.block_manager.block_table(second.request_id)[:5])
    assert all(engine.block_manager.ref_counts[b] == 2 for b in shared)
    while engine.has_unfinished():
        engine.step()
    assert engine.block_manager.num_used_blocks == 0


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(
        st.tuples(st.integers(0, 30), st.integers(0, 3), st.integers(1, 150), st.integers(1, 20)),
        min_size=1,
        max_size=20,
    ),
    policy=st.sampled_from(["static", "continuous", "orca", "chunked"]),
    budget=st.sampled_from([8, 32, 512]),
    num_blocks=st.integers(24, 60),
)
def test_cache_invariants_under_random_traffic(requests, policy, budget, num_blocks):
    """Reference counts match the tables, no block in use is on the free list (so none is evicted while read),
    cached prefixes really hold those tokens, and at the end every block is free (cached or not)."""
    max_model_len = 360
    if policy != "chunked":
        budget = max_model_len
    config = EngineConfig.create(
        "tiny",
        policy=policy,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        num_blocks=num_blocks,
        enable_prefix_caching=True,
    )
    engine = LLMEngine(config, executor=EchoExecutor(num_blocks), clock=VirtualClock())
    bm = engine.block_manager
    prefixes = [[random.Random(g).randrange(4096) for _ in range(200)] for g in range(4)]
    pending = sorted(requests)
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= step:
            _, group, own, out = pending.pop(0)
            engine.add_request(prefixes[group][:own] + [9] * (own % 7), SamplingParams(max_tokens=out))
        engine.step()
        step += 1
        assert step < 20000
        tables, free = bm.block_tables, bm.free_list()
        assert len(free) == len(set(free)) == bm.num_free
        for block in range(num_blocks):
            holders = sum(table.count(block) for table in tables.values())
            assert bm.ref_counts[block] == holders >= 0
            assert (block in free) == (holders == 0)
        for h, block in bm.cached.items():
            assert bm.block_hash[block] == h
        for request in engine.scheduler.running:  # every cached block it holds matches its own prefix hashes
            table = tables[request.request_id]
            for i, h in enumerate(request.block_hashes[: request.num_computed_tokens // bm.block_size]):
                if bm.block_hash[table[i]] is not None:
                    assert bm.block_hash[table[i]] == h
    assert bm.num_used_blocks == 0 and len(bm.free_list()) == num_blocks
    assert all(count == 0 for count in bm.ref_counts)


def test_shared_prefix_workloads():
    reqs = build_workload(
        WorkloadSpec(name="synthetic", num_requests=6, prefix_len=64, num_prefixes=2, prompt_len="fixed:10")
    )
    assert [r.prompt_len for r in reqs] == [74] * 6
    assert [r.shared[0] for r in reqs] == [(2_000_000, 64), (2_000_001, 64)] * 3
    turns = build_workload(WorkloadSpec(name="multi-turn", num_requests=8, rate=1.0))
    by_conversation = {}
    for r in turns:
        by_conversation.setdefault(r.shared[0][0], []).append(r)
    for conversation in by_conversation.values():
        for earlier, later in zip(conversation, conversation[1:]):  # each turn extends the previous one
            assert later.shared[: len(earlier.shared)] == earlier.shared and later.prompt_len > earlier.prompt_len


def test_a_prompt_left_waiting_keeps_its_cache_hit():
    """continuous: a prompt that does not fit the rest of this step's budget is admitted next step with
    its cached prefix, not recomputed from scratch."""
    engine = LLMEngine(
        EngineConfig.create(
            "tiny",
            policy="continuous",
            max_num_batched_tokens=256,
            max_model_len=256,
            num_blocks=128,
            enable_prefix_caching=True,
        )
    )
    engine.add_request(SYSTEM + [1] * 10, SamplingParams(max_tokens=1))
    while engine.has_unfinished():
        engine.step()
    b = engine.add_request(SYSTEM + [2] * 160, SamplingParams(max_tokens=2))  # 170 to compute after the hit
    c = engine.add_request(SYSTEM + [3] * 110, SamplingParams(max_tokens=2))  # 120 > the 86 left: waits
    engine.step()
    assert [ch.request_id for ch in engine.last_step[0].chunks] == [b.request_id]
    while engine.has_unfinished():
        engine.step()
    assert b.num_cached_tokens == 80 and c.num_cached_tokens == 80
