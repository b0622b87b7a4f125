"""`chunkbench generate`: random prompts through the built-in engine."""

from __future__ import annotations

import random
import sys
from typing import Annotated

import typer
from rich.table import Table

from chunkbench.commands.common import console, parse_int_list, save_json
from chunkbench.commands.options import ENGINE_OPTIONS, JsonOut, Model, with_options
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.request import SamplingParams
from chunkbench.llm import LLM


@with_options(ENGINE_OPTIONS)
def generate(
    model: Model = "tiny",
    prompt_lens: Annotated[
        str,
        typer.Option(
            help="Prompt lengths, comma-separated (tokens); the prompts are random token ids drawn from --seed."
        ),
    ] = "37,300",
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate per prompt (tokens).")] = 16,
    temperature: Annotated[float, typer.Option(help="Sampling temperature; 0 is greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass (0-1].")] = 1.0,
    json_out: JsonOut = None,
    **engine,
) -> None:
    """Generate from random prompts with the built-in engine (greedy by default) and print the tokens."""
    lens = parse_int_list("--prompt-lens", prompt_lens)
    config = EngineConfig.create(model, **engine)
    seed = engine["seed"]
    rng = random.Random(seed)
    prompts = [[rng.randrange(config.model.vocab_size) for _ in range(n)] for n in lens]
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)
    requests = LLM.from_config(config).generate_requests(prompts, sampling)
    table = Table("request", "prompt tokens", "output tokens", "finish", "first output ids")
    for r in requests:
        table.add_row(
            r.request_id,
            str(r.num_prompt_tokens),
            str(r.num_output_tokens),
            r.finish_reason or "",
            r.error or " ".join(map(str, r.output_token_ids[:12])),
        )
    console.print(table)
    save_json(
        json_out,
        [
            {
                "prompt_token_ids": r.prompt_token_ids,
                "output_token_ids": r.output_token_ids,
                "finish_reason": r.finish_reason,
                "error": r.error,
            }
            for r in requests
        ],
    )
    rejected = [r for r in requests if r.error]
    for r in rejected:
        print(f"chunkbench: error: request {r.request_id} rejected: {r.error}", file=sys.stderr)
    if rejected:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.command()(generate)
