"""Dynamic chunking: --step-time-target sizes each step's prompt chunks by a cost model, --num-chunks splits a
prompt into N chunks. They move chunk boundaries only: the tokens stay the same."""

import math
import random

import pytest
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.engine import LLMEngine, VirtualClock
from chunkbench.engine.outputs import SchedulerOutput, StepResult
from chunkbench.engine.request import SamplingParams
from chunkbench.engine.shape import StepShape
from chunkbench.engine.step_time import MIN_CHUNK_TOKENS, OnlineCorrection, StepTimer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chunkbench.errors import ConfigError
from tests.engine.test_equivalence import MAX_TOKENS, assert_same, prompts
from tests.engine.test_equivalence import run as run_reference


def linear_cost(step: StepShape) -> float:
    """1 ms per step plus 0.1 ms per token plus 1 us per 100 decode keys (seconds)."""
    return 0.001 + 0.0001 * step.num_tokens + 1e-8 * step.decode_keys


class CostExecutor:
    """Samples token 1; a step takes `truth(shape)` seconds of virtual time."""

    def __init__(self, num_blocks: int, truth=linear_cost) -> None:
        self.num_blocks = num_blocks
        self.truth = truth

    def execute(self, output: SchedulerOutput) -> StepResult:
        return StepResult(
            sampled={c.request_id: 1 for c in output.chunks if c.sample},
            seconds=self.truth(StepShape.from_output(output)),
        )


def engine_with(cost, truth=linear_cost, num_blocks=2000, **knobs) -> LLMEngine:
    config = EngineConfig.create("tiny", policy="chunked", num_blocks=num_blocks, **knobs)
    return LLMEngine(config, executor=CostExecutor(num_blocks, truth), clock=VirtualClock(), step_cost=cost)


# ---- identical tokens on the real model ----


@pytest.fixture(scope="module")
def reference():
    tokens, _, margins = run_reference(policy="continuous")
    return tokens, margins


@pytest.mark.parametrize("target_ms,online", [(20.0, False), (20.0, True)])
def test_time_budget_gives_identical_greedy_tokens(reference, target_ms, online):
    cost = OnlineCorrection(linear_cost) if online else linear_cost  # online: real measured times move it
    engine = LLMEngine(
        EngineConfig.create(
            "tiny", policy="chunked", num_blocks=1024, max_num_batched_tokens=512, step_time_target_ms=target_ms
        ),
        step_cost=cost,
    )
    requests = [engine.add_request(p, SamplingParams(max_tokens=MAX_TOKENS)) for p in prompts()]
    cut = 0
    while engine.has_unfinished():
        engine.step()
        output = engine.last_step[0]
        cut += sum(not c.is_decode and not c.sample for c in output.chunks)
    assert cut > 0, "the target never cut a prompt: this test checks nothing"
    assert_same([r.output_token_ids for r in requests], reference, f"target {target_ms} ms")


@pytest.mark.parametrize("num_chunks", [1, 3, 8])
def test_num_chunks_gives_identical_greedy_tokens(reference, num_chunks):
    tokens, _, _ = run_reference(policy="chunked", max_num_batched_tokens=512, num_chunks=num_chunks)
    assert_same(tokens, reference, f"num_chunks {num_chunks}")


# ---- the scheduler packs what the cost allows ----


def test_packs_exactly_the_tokens_the_cost_allows():
    # 3 decodes with 100-token contexts, then one long prompt: the step gets 1 + 0.1 * tokens ms.
    engine = engine_with(linear_cost, step_time_target_ms=20.0, max_num_batched_tokens=2000)
    for _ in range(3):
        engine.add_request([2] * 99, SamplingParams(max_tokens=50))
    while not all(r.is_decoding for r in engine.scheduler.running) or len(engine.scheduler.running) < 3:
        engine.step()
    engine.add_request([2] * 1500, SamplingParams(max_tokens=5))
    engine.step()
    output = engine.last_step[0]
    prefill = [c for c in output.chunks if not c.is_decode]
    decodes = [c for c in output.chunks if c.is_decode]
    assert len(decodes) == 3
    shape = StepShape.from_output(output)
    # Largest n with 0.001 + 0.0001 * (3 + n) + 1e-8 * decode keys <= 0.020
    expected = math.floor((0.020 - 0.001 - 1e-8 * shape.decode_keys) / 0.0001 + 1e-9) - 3
    assert prefill[0].num_tokens == expected
    assert linear_cost(shape) <= 0.020 + 1e-12


@given(
    target_ms=st.floats(0.5, 50),
    contexts=st.lists(st.integers(0, 4000), max_size=8),
    prefills=st.lists(st.tuples(st.integers(1, 500), st.integers(0, 2000)), max_size=3),
    n_max=st.integers(1, 4000),
    context=st.integers(0, 4000),
)
@settings(max_examples=200, deadline=None)
def test_fit_is_the_largest_chunk_within_the_target(target_ms, contexts, prefills, n_max, context):
    def cost(step):  # superlinear in the chunk: causal attention
        return 0.001 + 2e-5 * step.num_tokens + 1e-9 * step.prefill_attention_pairs + 1e-8 * step.decode_keys

    timer = StepTimer(cost, target_ms / 1000)
    for ctx in contexts:
        timer.add(1, ctx, True, True)
    for q, ctx in prefills:
        timer.add(q, ctx, False, False)
    n = timer.fit(n_max, context, remaining=10**6)
    floor = 0 if prefills else min(MIN_CHUNK_TOKENS, n_max)
    assert floor <= n <= n_max
    if n > floor:
        assert timer.predict(n, context) <= target_ms / 1000
    if n < n_max:
        assert timer.predict(n + 1, context) > target_ms / 1000


# ---- prefills never starve ----


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 600), st.integers(1, 30)), min_size=1, max_size=20),
    target_ms=st.sampled_from([0.01, 1.0, 2.0, 5.0, 40.0]),
    budget=st.sampled_from([16, 64, 512]),
    num_chunks=st.sampled_from([None, 1, 4]),
    tile=st.sampled_from([None, 8]),
)
def test_prefills_never_starve(requests, target_ms, budget, num_chunks, tile):
    """Even a target below the cost of the decodes alone leaves each step a minimum prompt chunk."""
    engine = engine_with(
        linear_cost,
        num_blocks=600,
        step_time_target_ms=target_ms,
        max_num_batched_tokens=budget,
        num_chunks=num_chunks,
        tile=tile,
        max_model_len=640,
    )
    pending = sorted(requests)
    total = sum(p + o for _, p, o in requests)
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= step:
            _, prompt, output = pending.pop(0)
            engine.add_request([2] * prompt, SamplingParams(max_tokens=output))
        engine.step()
        step += 1
        assert step < 2 * total + 100, "some request waits forever"
        if engine.last_step is None:
            continue
        output = engine.last_step[0]
        prefilling = [r for r in engine.scheduler.running if not r.is_decoding]
        if prefilling or engine.scheduler.waiting:
            assert output.num_prefill_tokens > 0 or not prefilling, "a step left every prompt out"
        assert output.num_tokens <= budget
        assert not output.paused_decodes  # the time budget never pauses a decode


def test_num_chunks_splits_each_prompt_in_n():
    engine = engine_with(None, max_num_batched_tokens=4096, num_chunks=4)
    request = engine.add_request([2] * 1001, SamplingParams(max_tokens=2))
    sizes = []
    while not request.is_decoding:
        engine.step()
        sizes += [c.num_tokens for c in engine.last_step[0].chunks]
    assert sizes == [251, 251, 251, 248]


def test_target_without_a_cost_model_is_refused():
    with pytest.raises(ConfigError, match="step-time-target needs a cost model"):
        engine_with(None, step_time_target_ms=10.0)


# ---- the online correction ----


def test_online_correction_converges_and_steps_then_hold_the_target():
    """The real steps take 2.5x (with 10% noise) what the profile says; after a few dozen prefill steps the
    correction has learnt the ratio and steps stay within the target."""
    rng = random.Random(0)

    def truth(step):
        return 2.5 * linear_cost(step) * rng.uniform(0.95, 1.05)

    cost = OnlineCorrection(linear_cost, alpha=0.1)
    engine = engine_with(cost, truth, step_time_target_ms=30.0, max_num_batched_tokens=4096, max_model_len=2048)
    for _ in range(40):
        engine.add_request([2] * 1500, SamplingParams(max_tokens=8))
    late = []
    while engine.has_unfinished():
        engine.step()
        if cost.observed > 60 and engine.last_step[0].num_prefill_tokens:
            late.append(engine.last_step[1].seconds)
    assert abs(cost.ratio - 2.5) < 0.1
    assert late and max(late) <= 0.030 * 1.06  # within the target, up to the noise


def test_online_correction_ignores_outliers_and_decode_only_steps():
    cost = OnlineCorrection(linear_cost, alpha=0.5)
    decode_only = StepShape((), (100, 200), 2)
    cost.observe(decode_only, 1.0)
    assert cost.ratio == 1.0 and cost.observed == 0
    cost.observe(StepShape(((100, 0),), (), 1), 1000.0)  # a 10^5x outlier counts as 8x
    assert cost.ratio == pytest.approx(4.5)


# ---- the tuner ----


def test_dynamic_space_searches_the_time_target_and_num_chunks():
    from chunkbench.tune.space import SearchSpace, engine_kwargs

    space = SearchSpace.load("dynamic")
    assert {"step_time_target_ms", "num_chunks"} <= set(space.values)
    kwargs = [engine_kwargs(p, 8192) for p in space.points()]
    assert {k["step_time_target_ms"] for k in kwargs} >= {None, 50}
    assert {k["num_chunks"] for k in kwargs} >= {None, 4}
    EngineConfig.create("llama-3-8b", **kwargs[-1])  # valid engine knobs


def test_server_configs_carry_the_best_fixed_budget_and_the_gain():
    import optuna

    from chunkbench.tune.report import server_trial

    study = optuna.create_study(direction="maximize")
    for value, knobs in [
        (30.0, {"max_num_batched_tokens": 8192, "step_time_target_ms": 45.0}),
        (24.0, {"max_num_batched_tokens": 1024, "step_time_target_ms": None}),
        (20.0, {"max_num_batched_tokens": 2048, "step_time_target_ms": None}),
    ]:
        study.add_trial(
            optuna.trial.create_trial(
                value=value, user_attrs={"knobs": {"policy": "chunked", **knobs}}, system_attrs={"constraints": [0.0]}
            )
        )
    trials = study.get_trials()

    class Spec:
        objective = "capacity"

    served, note = server_trial(Spec(), study, trials[0])
    assert served.number == 1
    assert "budget 1024" in note and "+25% capacity" in note
    assert server_trial(Spec(), study, trials[1]) == (trials[1], None)


# ---- defaults fitted to the device ----


class FakeCost:
    def predict(self, step):
        return linear_cost(step) * 100  # a slow device: 10 ms per token


class FakeBackend:
    real_engine = True

    def step_cost_model(self, config):
        return FakeCost(), "a fake profile"


def test_cpu_defaults_choose_a_step_target_and_a_request_count_and_say_why():
    from chunkbench.backends.device_defaults import TARGET_DECODE_MULTIPLE, fit_to_device
    from chunkbench.workloads.spec import WorkloadSpec, build_workload

    config = EngineConfig.create("tiny", device="cpu")
    requests = build_workload(WorkloadSpec(name="rag-mix", num_requests=100), 8192)  # only predicted, never run
    kept, knobs, notes = fit_to_device(FakeBackend(), config, {"num_requests": None}, 3, True, requests)
    decode8 = FakeCost().predict(StepShape((), (512,) * 8, 8))
    assert knobs["step_time_target_ms"] == round(TARGET_DECODE_MULTIPLE * decode8 * 1000) > decode8 * 1000
    assert 8 <= len(kept) < 100 and kept == requests[: len(kept)]
    assert any("--step-time-target" in n for n in notes) and any("--num-requests" in n for n in notes)
    # What the user sets stays: a budget means no target, a request count means all requests.
    kept, knobs, _ = fit_to_device(
        FakeBackend(), config, {"num_requests": 100, "max_num_batched_tokens": 512}, 3, True, requests
    )
    assert kept == requests and knobs == {}


def test_compare_says_a_default_step_target_only_when_a_chunked_policy_takes_it():
    """`compare static chunked:budget=96` on the CPU chose (and said) a step-time target that no policy took."""
    from chunkbench.bench.runs import config_for_policy, unsized_chunked

    assert unsized_chunked(["static", "chunked"]) and unsized_chunked(["chunked:budget=96", "chunked:seqs=8"])
    assert not unsized_chunked(["static", "continuous", "chunked:budget=96"])
    base, target = {"model": "tiny"}, {"step_time_target_ms": 100.0}
    assert config_for_policy(base, "chunked:budget=96", target).scheduler.step_time_target_ms is None
    assert config_for_policy(base, "chunked:seqs=8", target).scheduler.step_time_target_ms == 100.0
