"""What `vllm bench serve` accepts and refuses of its rate, ramp-up, burstiness, prompt-count, probe and seed
flags, found by running vLLM's own code (run it with vLLM's Python: .venv-vllm/bin/python). Each case is a
list of flags; each verdict is where vLLM stops it, or "accepted":

- "argparse": add_cli_args's parser refuses the value (a type or a choice);
- "main_async": main_async's checks before any request (--max-concurrency, "Validate ramp-up arguments");
- "get_request": get_request's asserts when it draws the send times (burstiness > 0, at least one request,
  every request's rate > 0), which vLLM runs after its one-prompt test run; the requests are the case's
  --num-prompts placeholders, as many as the random dataset would draw (none for a count below 1).

Usage: vllm_rate_rules.py '[["--request-rate", "0"], ...]' prints one JSON list of verdicts.
"""

import asyncio
import contextlib
import io
import json
import sys

import numpy as np
from vllm.benchmarks import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser


class Validated(Exception):
    """main_async got past its checks (it asks for the tokenizer next)."""


def verdict(flags: list[str]) -> str:
    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = parser.parse_args([*flags, "--model", "m"])
    except SystemExit:
        return "argparse"

    def stop(*_, **__):
        raise Validated

    serve.get_tokenizer = stop
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            asyncio.run(serve.main_async(args))
    except Validated:
        pass
    except ValueError:
        return "main_async"
    try:
        np.random.seed(args.seed)
        asyncio.run(_send_times(args))
    except AssertionError:
        return "get_request"
    return "accepted"


async def _send_times(args) -> None:
    async def no_wait(_seconds):
        return None

    serve.asyncio.sleep = no_wait  # the send times are drawn; nothing is waited for
    requests = list(range(max(args.num_prompts, 0)))
    ramp = (args.ramp_up_strategy, args.ramp_up_start_rps, args.ramp_up_end_rps)
    async for _ in serve.get_request(requests, args.request_rate, args.burstiness, *ramp):
        pass


if __name__ == "__main__":
    print(json.dumps([verdict(flags) for flags in json.loads(sys.argv[1])]))
