"""A running OpenAI-compatible server as a backend, measured over HTTP as the server's own vLLM release's client
measures it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from chunkbench.bench.backend import Backend, Serve
from chunkbench.bench.harness import RunResult
from chunkbench.engine.config import EngineConfig
from chunkbench.errors import UserError


@dataclass
class EndpointBackend(Backend):
    """A running OpenAI-compatible server (chunkbench serve, vLLM, SGLang), measured over HTTP. The server's
    own settings decide everything; the client needs only the vocabulary its random prompt ids are drawn from."""

    endpoint: str
    model: str | None = None  # the name to send; None: the server's
    vocab_size: int | None = None  # None: the config's, else 32000 (connect() always resolves it)
    client_options: dict = field(default_factory=dict)  # passed to client.bench_endpoint (concurrency, ...)
    max_model_len: int | None = None  # what the server reports, if it does

    @classmethod
    def connect(
        cls,
        endpoint: str,
        model: str | None = None,
        vocab_size: int | None = None,
        tokenizer: str | None = None,
        **client_options,
    ) -> EndpointBackend:
        """Read the server's model card (/v1/models): the model name to send and the context length when the
        server reports it (chunkbench serve and vLLM do). The vocabulary (vocab.resolve_vocab_size) is needed
        for token-id prompts only: chat prompts are text."""
        import httpx

        from chunkbench import web
        from chunkbench.workloads.vocab import resolve_vocab_size

        try:
            card = web.get(endpoint.rstrip("/") + "/models", timeout=10).json()["data"][0]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise UserError(f"--endpoint: no model list at {endpoint}/models: {exc}") from None
        name = model or card.get("id")
        if client_options.get("api", "completions") == "chat":
            vocab = vocab_size or card.get("vocab_size") or 32000  # only picks the words of a text prompt
        else:
            vocab = resolve_vocab_size(endpoint, name, card, vocab_size, tokenizer)
        return cls(endpoint, name, vocab, client_options, card.get("max_model_len"))

    @contextlib.contextmanager
    def session(self, config: EngineConfig, log: Path | None = None) -> Iterator[Serve]:
        import asyncio

        from chunkbench.bench.client import bench_endpoint
        from chunkbench.bench.client_rules import choose_timing
        from chunkbench.bench.metrics import probe_figures
        from chunkbench.bench.server_metrics import scrape_metrics, server_figures

        # measured as the client of the server's own vLLM release measures it (the newest: not vLLM)
        timing = choose_timing(self.endpoint, None)

        def serve(workload, *, seed=0, warmup_steps=0, progress=False, label="run") -> RunResult:
            vocab = self.vocab_size or (config.model.vocab_size if config else 32000)
            before = scrape_metrics(self.endpoint)
            options = {"rules": timing.rules} | self.client_options
            result = asyncio.run(bench_endpoint(self.endpoint, workload, vocab, self.model, seed=seed, **options))
            ttfts = [r.ttft for r in result.records if r.ok]
            server = server_figures(before, scrape_metrics(self.endpoint), ttfts) | timing.record()
            if self.client_options.get("probe_rate"):
                server |= probe_figures(result.probes)
            return RunResult(result.records, [], result.duration, 0, server=server)

        yield serve

    def __str__(self) -> str:
        return f"server at {self.endpoint}"
