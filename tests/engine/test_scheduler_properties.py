"""Scheduler invariants under random traffic, budgets and tiny KV pools (no model: an echo executor)."""

from chunkbench.engine.config import EngineConfig
from chunkbench.engine.engine import LLMEngine, VirtualClock
from chunkbench.engine.outputs import SchedulerOutput, StepResult
from chunkbench.engine.request import SamplingParams
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


class EchoExecutor:
    """Samples token 1 for every request; each step takes 1 ms of virtual time."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks

    def execute(self, output: SchedulerOutput) -> StepResult:
        return StepResult(sampled={c.request_id: 1 for c in output.chunks if c.sample}, seconds=0.001)


requests_strategy = st.lists(
    st.tuples(
        st.integers(0, 40),  # arrival step
        st.integers(1, 300),  # prompt tokens
        st.integers(1, 40),
    ),  # output tokens
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=requests_strategy,
    policy=st.sampled_from(["static", "continuous", "orca", "chunked"]),
    budget=st.sampled_from([1, 7, 16, 64, 512]),
    max_num_seqs=st.integers(1, 8),
    num_blocks=st.integers(22, 80),
    chunk_schedule=st.sampled_from([None, "64,16", "5"]),
    tile=st.sampled_from([None, 8]),
    max_partial_prefills=st.sampled_from([None, 1, 2]),
)
def test_every_request_finishes_within_budget_and_seats(
    requests, policy, budget, max_num_seqs, num_blocks, chunk_schedule, tile, max_partial_prefills
):
    max_model_len = 340  # 22 blocks of 16 hold the longest request, so every request is servable
    if policy != "chunked":
        budget = max(budget, max_model_len)
    tile = tile if tile is None or tile <= budget else None
    config = EngineConfig.create(
        "tiny",
        policy=policy,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        chunk_schedule=chunk_schedule,
        tile=tile,
        max_partial_prefills=max_partial_prefills,
        num_blocks=num_blocks,
    )
    engine = LLMEngine(config, executor=EchoExecutor(num_blocks), clock=VirtualClock())
    pending = sorted(requests)
    added = []
    total_tokens = sum(p + o for _, p, o in requests)
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= step:
            _, prompt, output = pending.pop(0)
            added.append(engine.add_request([2] * prompt, SamplingParams(max_tokens=output)))
        engine.step()
        step += 1
        assert step < 20 * total_tokens + 100, "some request waits forever"
        if engine.last_step is None:  # an empty step: only while nothing has arrived (the harness's check)
            assert not engine.scheduler.has_unfinished(), "work left, nothing scheduled"
            continue
        out, _ = engine.last_step
        ids = [c.request_id for c in out.chunks]
        assert len(ids) == len(set(ids))
        assert out.num_tokens <= budget
        assert len(out.chunks) <= max_num_seqs
        assert engine.block_manager.num_used_blocks <= num_blocks
        if policy in ("static", "continuous"):
            assert out.num_prefill_tokens == 0 or out.num_decode_tokens == 0, "prefill steps pause decodes"
        if policy != "chunked":
            for c in out.chunks:  # whole prompts only
                assert c.is_decode or c.sample
    for request, (_, _, output) in zip(added, sorted(requests)):
        assert request.error is None
        assert request.num_output_tokens == output
    assert engine.block_manager.num_used_blocks == 0
    assert sorted(engine.block_manager.free_list()) == list(range(num_blocks))


def test_static_admits_only_when_the_batch_is_done():
    config = EngineConfig.create("tiny", policy="static", max_num_seqs=2, num_blocks=64)
    engine = LLMEngine(config, executor=EchoExecutor(64), clock=VirtualClock())
    a, b, c = (engine.add_request([2] * 10, SamplingParams(max_tokens=n)) for n in (2, 5, 1))
    batches = []
    while engine.has_unfinished():
        engine.step()
        batches.append(sorted(ch.request_id for ch in engine.last_step[0].chunks))
    # a and b prefill together, decode together; c waits for b although a finished early.
    assert batches == [["0", "1"], ["0", "1"], ["1"], ["1"], ["1"], ["2"]]


def test_a_static_prompt_that_preempts_itself_lets_the_batch_decode():
    """Static admits its batch holding no blocks; here the second prompt's blocks are not free while the first
    decodes, so it preempts itself: that step decodes the first (it used to come back empty, and the run
    stopped with 'scheduled nothing')."""
    config = EngineConfig.create("tiny", policy="static", max_model_len=64, max_num_batched_tokens=64, num_blocks=3)
    engine = LLMEngine(config, executor=EchoExecutor(3), clock=VirtualClock())
    for _ in range(2):
        engine.add_request([2] * 40, SamplingParams(max_tokens=4))  # 44 tokens: all 3 blocks
    batches = []
    while engine.has_unfinished():
        engine.step()
        assert engine.last_step is not None, "an empty step with work left"
        batches.append([ch.request_id for ch in engine.last_step[0].chunks])
    assert batches == [["0"]] * 4 + [["1"]] * 4 and engine.scheduler.num_preemptions == 1


def test_continuous_pauses_decodes_for_a_new_prompt_and_chunked_does_not():
    def steps(policy, budget):
        config = EngineConfig.create("tiny", policy=policy, max_num_batched_tokens=budget, num_blocks=128)
        engine = LLMEngine(config, executor=EchoExecutor(128), clock=VirtualClock())
        engine.add_request([2] * 10, SamplingParams(max_tokens=6))
        engine.step()
        engine.step()
        engine.add_request([2] * 600, SamplingParams(max_tokens=2))
        shapes = []
        while engine.has_unfinished():
            engine.step()
            out = engine.last_step[0]
            shapes.append((out.num_prefill_tokens, out.num_decode_tokens))
        return shapes

    assert steps("continuous", 2048)[:2] == [(600, 0), (0, 2)]  # the decode stalls for the whole prompt
    assert steps("chunked", 256)[:3] == [(255, 1), (255, 1), (90, 1)]  # decode first, the prompt in chunks
    assert steps("orca", 2048)[0] == (600, 1)  # rides along, but the whole prompt in one step
