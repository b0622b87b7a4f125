"""Record vLLM's scheduling decisions on given request streams: the oracle of tests/vllm/test_scheduler_oracle.py.

Runs under vLLM's own venv (`.venv-vllm/bin/python tests/vllm/vllm_oracle.py IN.json OUT.json`), never imported by
chunkbench's: vLLM and its torch live there only. For each stream it builds vLLM's LLMEngine in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0, so the engine core and its scheduler are objects here), adds every request
before the first step (arrival times cannot change a decision), wraps `Scheduler.schedule()` and records each
step's `num_scheduled_tokens` (from vLLM's SchedulerOutput), counts `_preempt_request` calls, and keeps each request's
`num_cached_tokens` (the prefix-cache hit of its first admission, as vLLM reports it). The model runs for real
(the tiny Llama), so the scheduler sees what `vllm serve` would give it.

IN.json:  {"model": DIR, "streams": [{"name", "engine": {EngineArgs keywords}, "requests": [{"id",
           "prompt": [token ids], "max_tokens"}]}]}
OUT.json: {"vllm_version", "streams": {name: {"scheduler", "steps": [[[id, tokens], ...], ...],
           "preemptions", "cached": {id: tokens}, "seconds"}}}
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # before vllm is imported: the core in-process


def record(model: str, stream: dict) -> dict:
    from vllm import EngineArgs, LLMEngine, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    args = dict(model=model, enforce_eager=True, dtype="float32", max_model_len=2048) | stream["engine"]
    engine = LLMEngine.from_engine_args(EngineArgs(**args))
    scheduler = engine.engine_core.engine_core.scheduler
    steps: list[list[list]] = []
    preemptions = [0]
    schedule, preempt = scheduler.schedule, scheduler._preempt_request

    def base(request_id: str) -> str:  # vLLM appends "-<8 hex>" to the id it was given
        return request_id.rsplit("-", 1)[0]

    def recording_schedule(*a, **k):
        out = schedule(*a, **k)
        if out.num_scheduled_tokens:
            steps.append([[base(r), n] for r, n in out.num_scheduled_tokens.items()])
        return out

    def counting_preempt(*a, **k):
        preemptions[0] += 1
        return preempt(*a, **k)

    scheduler.schedule, scheduler._preempt_request = recording_schedule, counting_preempt
    for r in stream["requests"]:
        engine.add_request(
            r["id"],
            TokensPrompt(prompt_token_ids=r["prompt"]),
            SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True, temperature=0.0),
        )
    cached = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                cached[base(out.request_id)] = out.num_cached_tokens or 0
    result = dict(
        scheduler=type(scheduler).__module__ + "." + type(scheduler).__qualname__,
        steps=steps,
        preemptions=preemptions[0],
        cached=cached,
        seconds=time.perf_counter() - start,
    )
    del engine
    return result


def main(src: str, dst: str, record=record) -> None:
    """Each stream of IN.json through `record` (this engine's, or vllm_scheduler_oracle.py's), as OUT.json."""
    import vllm

    spec = json.loads(open(src).read())
    out = {"vllm_version": vllm.__version__, "streams": {s["name"]: record(spec["model"], s) for s in spec["streams"]}}
    with open(dst, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
