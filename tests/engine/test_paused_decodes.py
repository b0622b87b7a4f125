"""Generation stalls counted from the scheduler's decisions: a paused decode is a running request in decode
that a step left out. The continuous policy runs a newcomer's prefill alone and pauses every decode; chunked
prefill puts the decodes first in every step and pauses none. A slow step (over 5x the median decode-only step)
is counted on its own: it delays every request in it, paused or not."""

import numpy as np
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


@pytest.fixture(scope="module")
def rag_mix():
    """compare continuous chunked on rag-mix, simulated on an H100, budget 2048."""
    workload = build_workload(WorkloadSpec(name="rag-mix", num_requests=40, rate=8.0, seed=1))
    return compare(
        dict(model="llama-3-8b"), ["continuous", "chunked:budget=2048"], workload, backend=H100, progress=False
    )


def test_continuous_pauses_decodes_on_a_mixed_workload_and_chunked_never_does(rag_mix):
    continuous, chunked = rag_mix
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


def slow_steps(run) -> list:
    """The run's steps longer than its slow-step threshold, 5x its median decode-only step."""
    decode_only = [s.seconds for s in run.result.steps if s.prefill_tokens == 0 and s.decode_tokens > 0]
    threshold = run.summary["slow_step_threshold_ms"] / 1000
    assert threshold == pytest.approx(5 * float(np.median(decode_only)))
    return [s for s in run.result.steps if s.seconds > threshold]


def test_a_slow_step_pauses_the_decodes_under_continuous_and_carries_them_under_chunked(rag_mix):
    """rag-mix's long prompts make slow steps under both policies: continuous runs each prompt whole and alone
    (every decode paused), chunked caps it at the budget and steps the decodes with it (a shorter step)."""
    continuous, chunked = rag_mix
    slow_c, slow_k = slow_steps(continuous), slow_steps(chunked)
    assert continuous.summary["num_slow_steps"] == len(slow_c) > 0
    assert chunked.summary["num_slow_steps"] == len(slow_k) > 0
    assert all(s.prefill_tokens > 0 and s.decode_tokens == 0 and s.num_paused_decodes > 0 for s in slow_c)
    assert all(0 < s.decode_tokens and s.prefill_tokens + s.decode_tokens <= 2048 for s in slow_k)
    assert all(s.num_paused_decodes == 0 for s in slow_k)
    assert max(s.seconds for s in slow_k) < max(s.seconds for s in slow_c)
