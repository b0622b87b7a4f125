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

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm.engine = LLMEngine(config)
        return llm

    def generate_requests(
        self, prompt_token_ids: list[list[int]], sampling: SamplingParams | None = None, **sampling_kwargs
    ) -> list[Request]:
        """Run the prompts to completion; return their finished requests (rejected ones carry `error`).

        Sampling is `sampling`, or SamplingParams(**sampling_kwargs): max_tokens, temperature, top_p,
        seed, ignore_eos.
        """
        sampling = sampling or SamplingParams(**sampling_kwargs)
        requests = [self.engine.add_request(p, sampling) for p in prompt_token_ids]
        while self.engine.has_unfinished():
            self.engine.step()
        return requests

    def generate(self, prompt_token_ids: list[list[int]], **sampling) -> list[list[int]]:
        """Generated token ids per prompt, in input order; a rejected prompt gets an empty list."""
        return [r.output_token_ids for r in self.generate_requests(prompt_token_ids, **sampling)]
