"""The simulator's fast path (chunkbench/sim/fastforward.py) changes nothing but speed: every policy, with
prefix caching, with preemptions (a small KV cache), gives the same summary, requests and steps with it on
and off."""

import dataclasses

import pandas as pd
import pytest

from chunkbench.backends import SimBackend
from chunkbench.engine.config import EngineConfig, ModelConfig
from chunkbench.runs import requests_frame, run_benchmark, steps_frame
from chunkbench.workload import WorkloadSpec, build_workload

ON, OFF = SimBackend("h100-sxm", fast_forward=True), SimBackend("h100-sxm", fast_forward=False)


def both(config, workload, **options):
    """Run with the fast path and without; assert equal outputs and that the fast path did run steps."""
    import chunkbench.harness as harness

    original, skipped = harness.fast_forward, []

    def counting(*args):
        steps, done = original(*args)
        skipped.append(steps)
        return steps, done
    harness.fast_forward = counting
    try:
        fast = run_benchmark(config, workload, backend=ON, progress=False, **options)
    finally:
        harness.fast_forward = original
    slow = run_benchmark(config, workload, backend=OFF, progress=False, **options)
    assert sum(skipped) > 0
    assert fast.summary == slow.summary
    pd.testing.assert_frame_equal(requests_frame(fast.result), requests_frame(slow.result))
    pd.testing.assert_frame_equal(steps_frame(fast.result), steps_frame(slow.result))
    return slow


@pytest.mark.parametrize("policy", ["static", "continuous", "orca", "chunked"])
@pytest.mark.parametrize("caching", [False, True])
def test_same_results_with_preemptions(policy, caching):
    # Three shared 256-token prefixes, round-robin, for the prefix cache; 200 blocks of 16 tokens cannot hold
    # the batch: requests are preempted.
    # (Not static: there a step that preempts without scheduling anything stops the run, fast path or not.)
    workload = build_workload(WorkloadSpec(name="rag-mix", num_requests=60, rate=20.0, seed=1, prefix_len=256,
                                           num_prefixes=3), 2048)
    config = EngineConfig.create("llama-3-8b", policy=policy, max_num_batched_tokens=2048, max_model_len=2048,
                                 num_blocks=None if policy == "static" else 200, enable_prefix_caching=caching,
                                 max_num_seqs=24)
    slow = both(config, workload, goodput_ms={"ttft": 500})
    assert slow.summary["completed"] == 60
    if policy != "static":
        assert slow.summary["num_preemptions"] > 0
    if caching and policy != "static":  # static admits its batch at once: nothing is cached yet
        assert any(r.num_cached_tokens for r in slow.result.requests)


@pytest.mark.parametrize("policy", ["static", "chunked"])
def test_same_results_on_a_trace_with_idle_gaps(policy):
    # azure-conv: long decodes, arrivals that interrupt stretches, idle gaps (cold steps); a seat limit below
    # the queue keeps waiting requests behind full seats.
    workload = build_workload(WorkloadSpec(name="azure-conv", num_requests=150), 4096)
    config = EngineConfig.create("llama-3-8b", policy=policy, max_num_batched_tokens=4096, max_model_len=4096,
                                 max_num_seqs=8)
    both(config, workload)


def test_fast_path_is_taken(monkeypatch):
    import chunkbench.harness as harness

    calls = []
    original = harness.fast_forward
    monkeypatch.setattr(harness, "fast_forward", lambda *a: calls.append(original(*a)) or calls[-1])
    workload = build_workload(WorkloadSpec(name="azure-conv", num_requests=100))
    config = EngineConfig.create("llama-3-8b", policy="chunked", max_num_batched_tokens=2048)
    with ON.session(config) as serve:
        result = serve(workload, progress=False)
    assert sum(k for k, _ in calls) > 0.8 * len(result.steps)  # most steps were fast-forwarded
    assert sum(done for _, done in calls) > 50  # and most requests finished in a stretch


def test_switch_from_the_environment(monkeypatch):
    from chunkbench.sim.executor import SimExecutor
    from chunkbench.sim.roofline import RooflineCostModel
    from chunkbench.sim.gpus import GPUS

    cost = RooflineCostModel(ModelConfig.from_name("llama-3-8b"), GPUS["h100-sxm"])
    monkeypatch.setenv("CHUNKBENCH_FAST_FORWARD", "0")
    assert not SimExecutor(cost, 1).fast_forward
    monkeypatch.delenv("CHUNKBENCH_FAST_FORWARD")
    assert SimExecutor(cost, 1).fast_forward
    assert dataclasses.replace(ON, fast_forward=False) == OFF
