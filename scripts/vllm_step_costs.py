"""Step times of vLLM's CPU engine, in one process, that the linear step cost (chunkbench/sim/linear_cost.py) is
built on: what a step at a token count new to the process costs, and where a step's time jumps near the token
budget. Runs under .venv-vllm's python, the model in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), fp32,
eager, prefix caching off; each step is one engine.step() carrying prompts of one output token, timed alone.

- new counts: for each of ~100, ~700 and ~1,400 tokens, 40 prompt lengths never run before, the same 40 again
  (each now run once, pushed out of vLLM's 32-entry primitive cache by the other 39), then 20 other new ones and
  the same 20 again; the median step of each pass.
- --scan: one prompt of each length in --sizes, three times each, the median (twice, after a pass that ran each).

    VLLM_CPU_KVCACHE_SPACE=1 VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python scripts/vllm_step_costs.py
    .venv-vllm/tiny-llama
    LD_PRELOAD=libtcmalloc_minimal.so.4 ... (as the vLLM tier serves it: tests/vllm/env.py vllm_env)
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a Hugging Face directory (the tier's: .venv-vllm/tiny-llama)")
    parser.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens (tokens)")
    parser.add_argument("--scan", action="store_true", help="time one-prompt steps of --sizes instead")
    parser.add_argument("--sizes", default="256,512,1024,1536,1792,2016,2040", help="prompt lengths (tokens)")
    args = parser.parse_args()

    from vllm import EngineArgs, LLMEngine, SamplingParams
    from vllm.inputs import TokensPrompt

    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=args.model,
            enforce_eager=True,
            dtype="float32",
            max_model_len=2048,
            block_size=32,
            max_num_batched_tokens=args.budget,
            enable_prefix_caching=False,
        )
    )
    rng, sent = random.Random(0), [0]

    def step_ms(prompt_len: int) -> float:
        sent[0] += 1
        engine.add_request(
            f"r{sent[0]}",
            TokensPrompt(prompt_token_ids=[rng.randrange(10, 600) for _ in range(prompt_len)]),
            SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0),
        )
        start = time.perf_counter()
        engine.step()
        seconds = time.perf_counter() - start
        while engine.has_unfinished_requests():
            engine.step()
        return 1e3 * seconds

    def median_ms(lengths: list[int]) -> float:
        return round(statistics.median([step_ms(n) for n in lengths]), 1)

    for _ in range(3):
        step_ms(512)
    if args.scan:
        sizes = [int(s) for s in args.sizes.split(",")]
        for n in sizes:
            step_ms(n)
        for _ in range(2):
            print("ms per step:", [(n, median_ms([n] * 3)) for n in sizes])
        return
    for base in (100, 700, 1400):
        forty, twenty = [base + i for i in range(40)], [base + 100 + i for i in range(20)]
        print(
            f"~{base} tokens, median ms: 40 new {median_ms(forty)}, the same again {median_ms(forty)}; "
            f"20 new {median_ms(twenty)}, the same again {median_ms(twenty)}"
        )


if __name__ == "__main__":
    main()
