"""The rules by which `chunked` follows vLLM 0.32's scheduler, each on a case small enough to work out by hand
(tests/vllm/test_scheduler_oracle.py checks them against vLLM itself)."""

import pytest
from chunkbench.engine.block_manager import BlockManager
from chunkbench.engine.config import EngineConfig, SchedulerConfig
from chunkbench.engine.outputs import StepResult
from chunkbench.engine.request import Request, SamplingParams
from chunkbench.engine.scheduler import Scheduler

from chunkbench.bench.runs import steps_frame
from chunkbench.errors import ConfigError
from chunkbench.workloads.spec import WorkloadRequest, WorkloadSpec, build_workload

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


# ---- vLLM 0.33+'s prefill_schedule_interval and 0.34's cache-aware admission ----


def steps_of(s: Scheduler, n: int) -> list[dict[str, int]]:
    return [step(s) for _ in range(n)]


def test_interval_holds_prefill_until_the_cadence_step():
    # a (10 tokens) decodes from step 2; b's 300 tokens prefill only on steps 1, 4, 7, 10, 13 (54 + 4 * 63 with
    # a's decode token in each); the steps between carry a's decode alone, b's admitted prompt included.
    s = scheduler(max_num_batched_tokens=64, prefill_schedule_interval=3)
    add(s, "a", 10, max_tokens=20)
    add(s, "b", 300)
    steps = steps_of(s, 15)
    assert [i + 1 for i, st in enumerate(steps) if st.get("b", 0) > 1] == [1, 4, 7, 10, 13]
    assert [steps[i]["b"] for i in (0, 3, 6, 9, 12)] == [54, 63, 63, 63, 57]
    assert all(st == {"a": 1} for i, st in enumerate(steps[:13]) if i % 3)
    s = scheduler(max_num_batched_tokens=64)  # interval 1: b every step
    add(s, "a", 10, max_tokens=20)
    add(s, "b", 300)
    assert [st["b"] for st in steps_of(s, 5)] == [54, 63, 63, 63, 57]


def test_a_prompt_arriving_while_held_waits_for_the_cadence_step():
    s = scheduler(max_num_batched_tokens=64, prefill_schedule_interval=4)
    add(s, "a", 10, max_tokens=20)
    assert step(s) == {"a": 10}  # the first step is never held
    add(s, "b", 20)
    assert steps_of(s, 4) == [{"a": 1}, {"a": 1}, {"a": 1}, {"a": 1, "b": 20}]  # steps 2-4 held, 5 = 1 + 4


def test_without_a_decoding_request_nothing_is_held():
    s = scheduler(max_num_batched_tokens=64, prefill_schedule_interval=3)
    add(s, "a", 200)
    assert [st["a"] for st in steps_of(s, 4)] == [64, 64, 64, 8]  # a prefills alone: nobody's decode to protect


def test_a_release_step_that_leaves_requests_waiting_turns_the_hold_off():
    # Two seats: c waits until a finishes, so every step up to its admission (step 7) admits what it can and
    # none holds (vLLM's capacity escape): the same steps as with interval 1. Then the queue is empty and step 8,
    # one after c's first chunk, holds c's second while b decodes.
    runs = []
    for interval in (1, 3):
        s = scheduler(max_num_batched_tokens=64, max_num_seqs=2, prefill_schedule_interval=interval)
        add(s, "a", 10, max_tokens=6)
        add(s, "b", 150, max_tokens=6)
        add(s, "c", 100, max_tokens=6)
        runs.append(steps_of(s, 9))
    assert runs[0][:7] == runs[1][:7]
    assert runs[1][1:3] == [{"a": 1, "b": 63}, {"a": 1, "b": 33}]  # steps 2 and 3, within the interval
    assert runs[1][6:] == [{"b": 1, "c": 63}, {"b": 1}, {"c": 37}]
    assert runs[0][7] == {"b": 1, "c": 37}


def test_a_recompute_stopping_one_token_short_is_still_prefill():
    # r was preempted after 5 outputs: 45 tokens to recompute, cut at 44 by chunk_size. Its last token is
    # prefill to vLLM (the chunk sampled nothing), so the held steps 2 and 3 skip it; step 4 computes it.
    s = scheduler(max_num_batched_tokens=64, chunk_size=44, prefill_schedule_interval=3)
    r = add(s, "r", 40, max_tokens=10)
    r.output_token_ids, r.num_preemptions = [7] * 5, 1
    add(s, "d", 10, max_tokens=20)
    assert steps_of(s, 4) == [{"r": 44, "d": 10}, {"d": 1}, {"d": 1}, {"r": 1, "d": 1}]


def test_a_held_step_admits_a_fully_cached_prompt_without_restarting_the_cadence():
    shared = list(range(100, 132))  # two blocks of 16
    s = scheduler(caching=True, max_num_batched_tokens=64, prefill_schedule_interval=3)
    add(s, "a", shared + [1], max_tokens=20)
    assert step(s) == {"a": 33}
    add(s, "b", shared + [2])  # 32 of 33 tokens cached: one token left, no prefill
    add(s, "c", 40)
    assert steps_of(s, 3) == [{"a": 1, "b": 1}, {"a": 1, "b": 1}, {"a": 1, "b": 1, "c": 40}]


def test_cache_aware_admission_puts_a_cached_prompt_first_above_the_threshold():
    # a holds 5 of 10 blocks (usage 0.5), 4 of them cached: w's prompt starts with them, c's does not.
    shared = list(range(100, 164))
    for threshold, window, first in ((0.5, 4, "w"), (0.6, 4, "c"), (0.0, 1, "c"), (0.0, 2, "w")):
        s = scheduler(
            num_blocks=10,
            caching=True,
            max_num_batched_tokens=128,
            cache_aware_admission_window=window,
            cache_aware_admission_threshold=threshold,
        )
        add(s, "a", shared + [1], max_tokens=20)
        step(s)
        add(s, "c", list(range(300, 340)))
        add(s, "w", shared + [2, 3, 4])
        assert list(step(s)) == ["a", first, "c" if first == "w" else "w"], (threshold, window)


def test_cache_aware_admission_keeps_a_preempted_request_in_its_place():
    # c1, then a preempted request p, then w (cached): w and c1 swap around p, which stays second.
    from chunkbench.engine.policies.chunked import put_cached_first

    shared = list(range(100, 164))
    s = scheduler(num_blocks=10, caching=True, cache_aware_admission_window=4, cache_aware_admission_threshold=0.0)
    add(s, "a", shared + [1], max_tokens=20)
    step(s)
    c1, p, w = add(s, "c1", 40), add(s, "p", shared + [5]), add(s, "w", shared + [2])
    p.num_preemptions = 1
    put_cached_first(s)
    assert [r.request_id for r in s.waiting] == ["w", "p", "c1"]
    s.waiting.clear()
    s.waiting.extend([c1, w])
    s.block_manager.enable_caching = False  # needs the prefix cache: arrival order
    put_cached_first(s)
    assert [r.request_id for r in s.waiting] == ["c1", "w"]


def test_the_simulator_runs_no_decode_step_past_the_rules():
    """The simulator skips schedule() on decode-only steps (decode_only_batch): not while the cadence still
    counts steps, nor while cache-aware admission may reorder the queue on every step."""
    s = scheduler(max_num_batched_tokens=64, prefill_schedule_interval=3)
    add(s, "a", 10, max_tokens=20)
    batches = []
    for _ in range(4):
        step(s)
        batches.append(s.decode_only_batch() is not None)
    assert batches == [False, False, True, True]  # after steps 1-4: step 4 = 1 + 3 is the next that may prefill
    for window, skippable in ((4, False), (0, True)):
        s = scheduler(caching=True, max_num_seqs=1, cache_aware_admission_window=window)
        add(s, "a", 10, max_tokens=20)
        step(s)
        add(s, "b", 10), add(s, "c", 10)
        assert (s.decode_only_batch() is not None) is skippable


def test_the_simulators_fast_path_keeps_the_cadence():
    """Fast path on and off, the same run: a decodes alone, b and c arrive a few decode steps after a prompt
    finished (within the interval if the skipped steps were not counted)."""
    from tests.sim.test_fast_forward import both

    workload = [
        WorkloadRequest(100, 300, 0.0),
        WorkloadRequest(100, 4, 0.05),
        WorkloadRequest(200, 4, 0.3),
    ]
    knobs = dict(policy="chunked", max_num_batched_tokens=2048, max_model_len=2048, num_blocks=200)
    ruled = both(EngineConfig.create("llama-3-8b", prefill_schedule_interval=4, **knobs), workload)
    plain = both(EngineConfig.create("llama-3-8b", **knobs), workload)
    assert steps_frame(ruled.result).equals(steps_frame(plain.result))  # decode stretches: nothing to hold


@pytest.mark.parametrize(
    "knobs",
    [
        dict(prefill_schedule_interval=3),
        dict(cache_aware_admission_window=4, cache_aware_admission_threshold=0.0, enable_prefix_caching=True),
    ],
    ids=["interval-3", "cache-aware"],
)
def test_the_simulators_fast_path_follows_the_rules(knobs):
    """The fast path on and off on a loaded run with shared prefixes: the same results, the rule in effect."""
    from tests.sim.test_fast_forward import both

    spec = WorkloadSpec(name="rag-mix", num_requests=60, rate=20.0, seed=1, prefix_len=256, num_prefixes=3)
    workload = build_workload(spec, 2048)
    base = dict(policy="chunked", max_num_batched_tokens=2048, max_model_len=2048, num_blocks=200, max_num_seqs=24)
    ruled = both(EngineConfig.create("llama-3-8b", **base, **knobs), workload)
    caching = knobs.get("enable_prefix_caching")
    plain = both(EngineConfig.create("llama-3-8b", **base, enable_prefix_caching=caching), workload)
    assert ruled.summary != plain.summary  # the rule changed this run
