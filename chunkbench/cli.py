"""The `chunkbench` command line. Commands are thin: parse, build configs, call one function."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.exceptions import TyperException
from rich.console import Console
from rich.table import Table

from chunkbench.engine.config import ConfigError, EngineConfig
from chunkbench.engine.request import SamplingParams
from chunkbench.llm import LLM
from chunkbench.errors import UserError
from chunkbench.options import (AttentionBackend, BlockSize, Budget, ChunkSchedule, ChunkSize, Device, Dtype,
                                GpuMemoryUtilization, MaxModelLen, MaxNumSeqs, MaxPartialPrefills, Model,
                                NumBlocks, Policy, PrefixCaching, Seed, Tile)

app = typer.Typer(
    name="chunkbench", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Measure and tune chunked prefill for LLM serving: token budgets, chunk caps, progressive chunk "
         "schedules and batching policies, against TTFT / inter-token-latency SLAs.")
console = Console()


def parse_int_list(flag: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{flag} must be comma-separated integers, got '{text}'") from None
    if not values or min(values) < 1:
        raise UserError(f"{flag} must list integers >= 1, got '{text}'")
    return values


@app.command()
def generate(
    model: Model = "tiny",
    prompt_lens: Annotated[str, typer.Option(help="Prompt lengths, comma-separated (tokens); the prompts "
                                             "are random token ids drawn from --seed.")] = "37,300",
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate per prompt (tokens).")] = 16,
    temperature: Annotated[float, typer.Option(help="Sampling temperature; 0 is greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass (0-1].")] = 1.0,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the prompts and outputs here.")] = None,
    policy: Policy = "chunked",
    max_num_batched_tokens: Budget = None,
    max_num_seqs: MaxNumSeqs = 256,
    max_model_len: MaxModelLen = None,
    chunk_size: ChunkSize = None,
    chunk_schedule: ChunkSchedule = None,
    tile: Tile = None,
    max_partial_prefills: MaxPartialPrefills = None,
    block_size: BlockSize = 16,
    num_blocks: NumBlocks = None,
    gpu_memory_utilization: GpuMemoryUtilization = 0.9,
    enable_prefix_caching: PrefixCaching = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
    attention_backend: AttentionBackend = "auto",
    seed: Seed = 0,
) -> None:
    """Generate from random prompts with the built-in engine (greedy by default) and print the tokens."""
    lens = parse_int_list("--prompt-lens", prompt_lens)
    config = EngineConfig.create(
        model, policy=policy, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len, chunk_size=chunk_size, chunk_schedule=chunk_schedule, tile=tile,
        max_partial_prefills=max_partial_prefills, block_size=block_size, num_blocks=num_blocks,
        gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=enable_prefix_caching,
        device=device, dtype=dtype, attention_backend=attention_backend, seed=seed)
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)
    rng = random.Random(seed)
    prompts = [[rng.randrange(config.model.vocab_size) for _ in range(n)] for n in lens]
    requests = LLM.from_config(config).generate_requests(prompts, sampling)
    table = Table("request", "prompt tokens", "output tokens", "finish", "first output ids")
    for r in requests:
        table.add_row(r.request_id, str(r.num_prompt_tokens), str(r.num_output_tokens), r.finish_reason or "",
                      r.error or " ".join(map(str, r.output_token_ids[:12])))
    console.print(table)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps([
            {"prompt_token_ids": r.prompt_token_ids, "output_token_ids": r.output_token_ids,
             "finish_reason": r.finish_reason, "error": r.error} for r in requests], indent=1))
    rejected = [r for r in requests if r.error]
    for r in rejected:
        print(f"chunkbench: error: request {r.request_id} rejected: {r.error}", file=sys.stderr)
    if rejected:
        raise typer.Exit(2)


@app.callback()
def _root() -> None:
    """Measure and tune chunked prefill for LLM serving."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one line on stderr and exit code 2, never a traceback."""
    try:
        code = app(args=argv, standalone_mode=False)  # returns the code of a typer.Exit
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("chunkbench: interrupted", file=sys.stderr)
        sys.exit(130)
    except TyperException as exc:  # usage errors: unknown flag, bad value type
        print(f"chunkbench: error: {exc.format_message()}", file=sys.stderr)
        sys.exit(2)
    except ConfigError as exc:
        print(f"chunkbench: error: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
