"""steps.parquet records what each step computed, request by request (request_ids, request_tokens), so a run
compares step by step with another engine's log (tests/vllm/test_scheduler_oracle.py does so with vLLM's)."""

from collections import Counter

import pandas as pd
from chunkbench.engine.config import EngineConfig

from chunkbench.backends.sim import SimBackend
from chunkbench.bench.runs import run_benchmark, save_run
from chunkbench.workloads.spec import WorkloadRequest


def test_each_step_lists_its_requests_and_their_tokens(tmp_path):
    # Three requests at once, budget 64, chunk cap 40: the first steps are known by hand.
    workload = [WorkloadRequest(arrival_time=0.0, prompt_len=p, output_len=o) for p, o in [(100, 3), (30, 2), (10, 4)]]
    config = EngineConfig.create(
        "tiny",
        policy="chunked",
        max_num_batched_tokens=64,
        chunk_size=40,
        max_num_seqs=4,
        num_blocks=64,
        max_model_len=512,
    )
    run = run_benchmark(config, workload, backend=SimBackend("h100-sxm"), progress=False)
    save_run(run, tmp_path)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    rows = [list(zip(ids, tokens)) for ids, tokens in zip(steps["request_ids"], steps["request_tokens"])]
    assert rows[0] == [(0, 40), (1, 24)]  # r0's cap, then what is left of the budget
    assert rows[1] == [(0, 40), (1, 6), (2, 10)]  # running order: r0, r1's rest, r2 admitted whole
    assert rows[2] == [(0, 20), (1, 1), (2, 1)]  # r0's last 20 tokens; r1 and r2 decode
    computed = Counter()
    for row, prefill, decode in zip(rows, steps["prefill_tokens"], steps["decode_tokens"]):
        assert sum(n for _, n in row) == prefill + decode <= 64
        computed.update(dict(row))
    # every prompt token and every output token but the last, each computed once (no cache, no preemption)
    assert computed == {i: w.prompt_len + w.output_len - 1 for i, w in enumerate(workload)}
