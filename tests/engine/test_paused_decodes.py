"""Generation stalls counted from the scheduler's decisions: a paused decode is a running request in decode
that a step left out. The continuous policy runs a newcomer's prefill alone and pauses every decode; chunked
prefill puts the decodes first in every step and pauses none."""

import pytest
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.request import SamplingParams

from chunkbench.backends.sim import SimBackend
from chunkbench.bench.runs import compare
from chunkbench.sim.executor import sim_engine
from chunkbench.workloads.spec import WorkloadSpec, build_workload

H100 = SimBackend("h100-sxm")


@pytest.mark.parametrize("policy, paused", [("continuous", ["a"]), ("chunked", []), ("orca", [])])
def test_a_newcomer_prefill_pauses_the_running_decode_only_under_continuous(policy, paused):
    config = EngineConfig.create("llama-3-8b", policy=policy, max_num_batched_tokens=2048, max_model_len=2048)
    cost = H100.cost(config)
    engine = sim_engine(config, cost, cost.kv_blocks(config))
    a = engine.add_request(list(range(100)), SamplingParams(max_tokens=8, ignore_eos=True), request_id="a")
    engine.step()  # a's prefill samples its first token: a is decoding
    assert len(a.token_times) == 1 and engine.last_step[0].paused_decodes == []
    engine.add_request(list(range(200)), SamplingParams(max_tokens=8, ignore_eos=True), request_id="b")
    engine.step()
    assert engine.last_step[0].paused_decodes == paused
    assert len(a.token_times) == 1 + (not paused)


def test_continuous_pauses_decodes_on_a_mixed_workload_and_chunked_never_does():
    """Issue acceptance: compare continuous chunked on rag-mix, simulated on an H100, budget 2048."""
    workload = build_workload(WorkloadSpec(name="rag-mix", num_requests=40, rate=8.0, seed=1))
    continuous, chunked = compare(
        dict(model="llama-3-8b"), ["continuous", "chunked:budget=2048"], workload, backend=H100, progress=False
    )
    c, k = continuous.summary, chunked.summary
    assert c["num_paused_decodes"] > 0 and c["num_stalls"] > 0 and c["longest_stall_ms"] > 0
    assert k["num_paused_decodes"] == k["num_stalls"] == 0 and k["longest_stall_ms"] == 0
    # The per-step counts and the per-request counts are the same decisions.
    assert (
        c["num_paused_decodes"]
        == sum(s.num_paused_decodes for s in continuous.result.steps)
        == sum(r.num_paused_decodes for r in continuous.result.requests)
    )
    # A stall is a gap of its request: no longer than the run's longest gap.
    assert c["longest_stall_ms"] <= 1000 * max(g for r in continuous.result.requests for g in r.itls)
    assert "slow_step_threshold_ms" in c and c["num_slow_steps"] >= 0
