"""The rules by which `chunked` follows vLLM 0.32's scheduler, each on a case small enough to work out by hand
(tests/vllm/test_scheduler_oracle.py checks them against vLLM itself)."""

import pytest

from chunkbench.engine.block_manager import BlockManager
from chunkbench.engine.config import ConfigError, EngineConfig, SchedulerConfig
from chunkbench.engine.outputs import StepResult
from chunkbench.engine.request import Request, SamplingParams
from chunkbench.engine.scheduler import Scheduler

BLOCK = 16


def scheduler(num_blocks=64, caching=False, **knobs) -> Scheduler:
    config = SchedulerConfig(policy="chunked", max_model_len=1024, **knobs)
    return Scheduler(config, BlockManager(num_blocks, BLOCK, enable_caching=caching))


def add(s: Scheduler, rid: str, prompt: list[int] | int, max_tokens: int = 4) -> Request:
    tokens = list(range(prompt)) if isinstance(prompt, int) else prompt
    r = Request(rid, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    s.add(r)
    return r


def step(s: Scheduler) -> dict[str, int]:
    out = s.schedule()
    s.update(out, StepResult({c.request_id: 7 for c in out.chunks if c.sample}, 0.0), 0.0)
    return {c.request_id: c.num_tokens for c in out.chunks}


def test_chunk_size_is_not_applied_to_a_lone_request():
    s = scheduler(max_num_batched_tokens=256, chunk_size=64)
    add(s, "a", 900)
    assert [step(s)["a"] for _ in range(4)] == [256, 256, 256, 132]  # the budget, not 64: nobody to starve
    s = scheduler(max_num_batched_tokens=256, chunk_size=64)
    add(s, "a", 900), add(s, "b", 900)
    assert step(s) == {"a": 64, "b": 64}


def test_the_adaptive_threshold_is_a_fair_share_of_the_budget():
    s = scheduler(max_num_batched_tokens=256, chunk_size=32, long_prefill_token_threshold_adaptive=True)
    for rid in "abc":
        add(s, rid, 500)
    assert step(s) == {"a": 85, "b": 85, "c": 85}  # max(32, 256 // 3)


def test_a_request_is_admitted_only_when_its_whole_prompt_fits():
    # 10 free blocks of 16: a 191-token prompt needs 12. Reserving its first chunk only, it would be admitted.
    for full, admitted in ((True, False), (False, True)):
        s = scheduler(num_blocks=14, max_num_batched_tokens=64, scheduler_reserve_full_isl=full)
        add(s, "a", 60, max_tokens=20)  # 4 blocks
        step(s)
        add(s, "b", 191)
        assert ("b" in step(s)) is admitted


def test_max_num_active_seqs_caps_admissions():
    s = scheduler(max_num_batched_tokens=256, max_num_seqs=8, max_num_active_seqs=2)
    for rid in "abcd":
        add(s, rid, 10)
    assert sorted(step(s)) == ["a", "b"]


def test_a_block_is_cached_for_requests_admitted_later_in_the_same_step():
    shared = list(range(100, 164))  # four blocks
    s = scheduler(caching=True, max_num_batched_tokens=512)
    add(s, "a", shared + [1, 2, 3])
    b = add(s, "b", shared + [4, 5, 6])
    assert step(s) == {"a": 67, "b": 3}  # b reuses a's four blocks, cached when a's chunk was given them
    assert b.num_cached_tokens == 64


def test_the_new_knobs_are_checked():
    with pytest.raises(ConfigError, match="max-num-active-seqs"):
        EngineConfig.create("tiny", max_num_seqs=4, max_num_active_seqs=5)
    with pytest.raises(ConfigError, match="watermark"):
        EngineConfig.create("tiny", watermark=1.0)
    assert EngineConfig.create("tiny").scheduler.scheduler_reserve_full_isl  # vLLM 0.32's default
