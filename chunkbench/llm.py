"""A small offline API in the shape of vLLM's `LLM`: prompts in, token ids out, in input order."""

from __future__ import annotations

from chunkbench.engine.config import EngineConfig
from chunkbench.engine.engine import LLMEngine
from chunkbench.engine.request import Request, SamplingParams


class LLM:
    """`LLM(model="tiny", policy="chunked", max_num_batched_tokens=64).generate(prompts, max_tokens=32)`.

    Keyword arguments are those of `EngineConfig.create`.
    """

    def __init__(self, model: str = "tiny", **engine_kwargs) -> None:
        self.engine = LLMEngine(EngineConfig.create(model, **engine_kwargs))

    def generate_requests(self, prompt_token_ids: list[list[int]], max_tokens: int = 16,
                          temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                          ignore_eos: bool = False) -> list[Request]:
        """Run the prompts to completion; return their finished requests (rejected ones carry `error`)."""
        sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                                  ignore_eos=ignore_eos)
        requests = [self.engine.add_request(p, sampling) for p in prompt_token_ids]
        while self.engine.has_unfinished():
            self.engine.step()
        return requests

    def generate(self, prompt_token_ids: list[list[int]], **sampling) -> list[list[int]]:
        """Generated token ids per prompt, in input order; a rejected prompt gets an empty list."""
        return [r.output_token_ids for r in self.generate_requests(prompt_token_ids, **sampling)]
