"""The simulator's fast path (chunkbench/sim/fastforward.py) changes nothing but speed: every policy, with
prefix caching, with preemptions (a small KV cache), gives the same summary, requests and steps with it on
and off."""

import dataclasses

import pandas as pd
import pytest
from chunkbench.engine.activation import step_activation_bytes
from chunkbench.engine.config import EngineConfig, ModelConfig

from chunkbench.backends.sim import SimBackend
from chunkbench.bench.runs import requests_frame, run_benchmark, steps_frame
from chunkbench.workloads.spec import WorkloadSpec, build_workload

ON, OFF = SimBackend("h100-sxm", fast_forward=True), SimBackend("h100-sxm", fast_forward=False)


def both(config, workload, on=ON, off=OFF, **options):
    """Run with the fast path and without; assert equal outputs and that the fast path did run steps."""
    import chunkbench.bench.harness as harness

    original, skipped = harness.fast_forward, []

    def counting(*args):
        skipped.append(original(*args))
        return skipped[-1]

    harness.fast_forward = counting
    try:
        fast = run_benchmark(config, workload, backend=on, progress=False, **options)
    finally:
        harness.fast_forward = original
    slow = run_benchmark(config, workload, backend=off, progress=False, **options)
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
    workload = build_workload(
        WorkloadSpec(name="rag-mix", num_requests=60, rate=20.0, seed=1, prefix_len=256, num_prefixes=3), 2048
    )
    config = EngineConfig.create(
        "llama-3-8b",
        policy=policy,
        max_num_batched_tokens=2048,
        max_model_len=2048,
        num_blocks=None if policy == "static" else 200,
        enable_prefix_caching=caching,
        max_num_seqs=24,
    )
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
    config = EngineConfig.create(
        "llama-3-8b", policy=policy, max_num_batched_tokens=4096, max_model_len=4096, max_num_seqs=8
    )
    both(config, workload)


def test_fast_path_is_taken(monkeypatch):
    import chunkbench.bench.harness as harness

    calls = []  # (steps run, requests finished) per call
    original = harness.fast_forward

    def counting(engine, *args):
        before = len(engine.scheduler.requests)
        calls.append((original(engine, *args), before - len(engine.scheduler.requests)))
        return calls[-1][0]

    monkeypatch.setattr(harness, "fast_forward", counting)
    workload = build_workload(WorkloadSpec(name="azure-conv", num_requests=100))
    config = EngineConfig.create("llama-3-8b", policy="chunked", max_num_batched_tokens=2048)
    with ON.session(config) as serve:
        result = serve(workload, progress=False)
    assert sum(k for k, _ in calls) > 0.8 * len(result.steps)  # most steps were fast-forwarded
    assert sum(done for _, done in calls) > 50  # and most requests finished in a stretch


def test_switch_from_the_environment(monkeypatch):
    from chunkbench.sim.executor import SimExecutor
    from chunkbench.sim.gpus import GPUS
    from chunkbench.sim.roofline import RooflineCostModel

    cost = RooflineCostModel(ModelConfig.from_name("llama-3-8b"), GPUS["h100-sxm"])
    monkeypatch.setenv("CHUNKBENCH_FAST_FORWARD", "0")
    assert not SimExecutor(cost, 1).fast_forward
    monkeypatch.delenv("CHUNKBENCH_FAST_FORWARD")
    assert SimExecutor(cost, 1).fast_forward
    assert dataclasses.replace(ON, fast_forward=False) == OFF


def test_decode_step_cost_is_predict_bit_for_bit():
    """The fast path's shortcut for the roofline: the same float as predict() on the decode-only shape, for
    TP, fp8 KV and the server-calibrated model with its per-sequence overhead."""
    import random

    from chunkbench.sim.cost_model import StepShape
    from chunkbench.sim.gpus import GPUS
    from chunkbench.sim.roofline import RooflineCostModel
    from chunkbench.sim.server_calibration import ServerCalibration

    models = [
        RooflineCostModel(ModelConfig.from_name("llama-3-8b"), GPUS["h100-sxm"]),
        RooflineCostModel(
            ModelConfig.from_name("llama-3.1-70b"), GPUS["a100-80g"], tensor_parallel_size=4, kv_dtype_bytes=1
        ),
        ServerCalibration("cpu", 0.3, 0.7, 0.004, 0.0002).cost_model(EngineConfig.create("small")),
    ]
    rng = random.Random(0)
    for cost in models:
        for _ in range(300):
            contexts = tuple(rng.randint(1, 8192) for _ in range(rng.choice([1, 2, 7, 64, 255])))
            shape = StepShape((), contexts, len(contexts))
            assert cost.decode_step_cost(len(contexts))(sum(contexts)) == cost.predict(shape)
            assert cost.rows_activation_bytes(len(contexts), len(contexts)) == cost.activation_bytes(shape)
    for cost in models[:2]:  # memoized by rows: the formula's value for any chunks and contexts
        base = getattr(cost, "base", cost)
        for _ in range(300):
            prefills = tuple((rng.randint(1, 2048), rng.randint(0, 8192)) for _ in range(rng.choice([1, 2, 5])))
            shape = StepShape(
                prefills, tuple(rng.randint(1, 8192) for _ in range(rng.randint(0, 40))), rng.randint(0, 45)
            )
            assert cost.activation_bytes(shape) == step_activation_bytes(
                base.model, prefills, shape.decodes, shape.num_sampled, 2, base.tensor_parallel_size, "flash"
            )


@pytest.mark.parametrize("kind", ["profile", "server-calibration"])
def test_same_results_with_other_cost_models(kind, tmp_path):
    """A fitted profile takes the shape-building path, the server-calibrated roofline the shortcut: both
    give what the step-by-step path gives."""
    from chunkbench.sim.fitted import FEATURE_NAMES, FittedCostModel
    from chunkbench.sim.server_calibration import ServerCalibration

    if kind == "profile":
        coefficients = [{"step": 0.004, "tokens": 2e-5, "decode_keys": 3e-8}.get(n, 0.0) for n in FEATURE_NAMES]
        FittedCostModel(tuple(coefficients), "llama-3-8b", "d", 4000).save(tmp_path / "p.json")
        on, off = (
            SimBackend(cost_model=str(tmp_path / "p.json"), fast_forward=True),
            SimBackend(cost_model=str(tmp_path / "p.json"), fast_forward=False),
        )
    else:
        calibration = ServerCalibration("cpu", 0.3, 0.7, 0.004, 0.0002)
        on, off = (
            SimBackend(server_calibration=calibration, fast_forward=True),
            SimBackend(server_calibration=calibration, fast_forward=False),
        )
    workload = build_workload(WorkloadSpec(name="azure-conv", num_requests=80), 4096)
    config = EngineConfig.create(
        "llama-3-8b", policy="chunked", max_num_batched_tokens=1024, max_model_len=4096, num_blocks=4000
    )
    both(config, workload, on, off)
