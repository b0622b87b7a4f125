"""`chunkbench serve`: the built-in engine behind an OpenAI-compatible HTTP API (FastAPI).

/v1/completions and /v1/chat/completions, streaming (SSE) or not; /v1/models; /health; /metrics in the
Prometheus text format. Bad requests get HTTP 400 with an OpenAI-style error body and the server goes on.
A client that disconnects mid-stream aborts its request, which frees its KV blocks.

Text: with a Hugging Face model directory holding a tokenizer, that tokenizer; otherwise (dummy weights)
a byte-level stand-in: each UTF-8 byte is one token, and a token decodes to the byte `id % 256`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from chunkbench.async_engine import AsyncEngine, now
from chunkbench.engine.config import ConfigError, EngineConfig
from chunkbench.engine.engine import LLMEngine
from chunkbench.engine.request import SamplingParams


class ByteTokenizer:
    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i % 256 for i in ids).decode("utf-8", errors="replace")


def load_tokenizer(config: EngineConfig):
    if config.model.hf_dir:
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(config.model.hf_dir, local_files_only=True)
        except (OSError, ValueError):
            pass
    return ByteTokenizer()


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    max_tokens: int | None = Field(default=16)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: dict | None = None
    n: Literal[1] = 1
    user: str | None = None


class CompletionBody(_Body):
    prompt: str | list[int]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str
    content: str


class ChatBody(_Body):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None


def error(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {
        "message": message, "type": "invalid_request_error" if status == 400 else "server_error",
        "param": param, "code": None}})


def create_app(config: EngineConfig, served_name: str | None = None) -> FastAPI:
    engine = AsyncEngine(LLMEngine(config))
    tokenizer = load_tokenizer(config)
    name = served_name or config.model.name
    ids = itertools.count()
    registry = CollectorRegistry()
    running = Gauge("chunkbench_num_requests_running", "Requests running", registry=registry)
    waiting = Gauge("chunkbench_num_requests_waiting", "Requests waiting", registry=registry)
    kv_usage = Gauge("chunkbench_kv_cache_usage_ratio", "KV cache blocks in use / total", registry=registry)
    step_time = Histogram("chunkbench_step_seconds", "Engine step duration", registry=registry,
                          buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
    prompt_tokens = Histogram("chunkbench_prompt_tokens", "Prompt tokens per request", registry=registry,
                              buckets=(16, 64, 256, 1024, 4096, 16384, 65536))
    output_tokens = Histogram("chunkbench_generation_tokens", "Output tokens per request", registry=registry,
                              buckets=(1, 16, 64, 256, 1024, 4096))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        engine.shutdown()

    app = FastAPI(title="chunkbench serve", lifespan=lifespan)
    app.state.engine = engine

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error(f"{where or 'body'}: {first.get('msg', 'invalid request')}", param=where)

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "chunkbench",
                                            "max_model_len": config.scheduler.max_model_len,
                                            "vocab_size": config.model.vocab_size}]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        scheduler, blocks = engine.engine.scheduler, engine.engine.block_manager
        running.set(len(scheduler.running))
        waiting.set(len(scheduler.waiting))
        kv_usage.set(blocks.num_used_blocks / blocks.num_blocks)
        while engine.step_seconds:
            step_time.observe(engine.step_seconds.pop(0))
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    async def generate(http: Request, body: _Body, prompt: list[int], chat: bool):
        max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens
        if max_tokens is None or max_tokens < 1:
            return error(f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
        try:
            sampling = SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                                      seed=body.seed, ignore_eos=body.ignore_eos)
        except ConfigError as exc:
            return error(str(exc))
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{next(ids)}"
        stream = engine.submit(request_id, prompt, sampling, now())
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        def chunk(text: str, finish: str | None) -> dict:
            choice = ({"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish} if chat
                      else {"index": 0, "text": text, "finish_reason": finish, "logprobs": None})
            return {"id": request_id, "object": kind + (".chunk" if chat else ""), "created": created,
                    "model": name, "choices": [choice]}

        def usage(n: int) -> dict:
            return {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}

        first = await stream.get()
        if first.error:
            return error(first.error, param="prompt" if "prompt" in first.error else None)
        prompt_tokens.observe(len(prompt))
        if not body.stream:
            tokens, event = list(first.token_ids), first
            while not event.finished:
                event = await stream.get()
                tokens += event.token_ids
            output_tokens.observe(len(tokens))
            text = tokenizer.decode(tokens)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": event.finish_reason} if chat else
                      {"index": 0, "text": text, "finish_reason": event.finish_reason, "logprobs": None})
            return {"id": request_id, "object": kind, "created": created, "model": name, "choices": [choice],
                    "usage": usage(len(tokens))}

        async def events():
            event, count = first, 0
            try:
                while True:
                    count += len(event.token_ids)
                    if event.token_ids:
                        finish = event.finish_reason if event.finished else None
                        yield f"data: {json.dumps(chunk(tokenizer.decode(event.token_ids), finish))}\n\n"
                    if event.finished:
                        break
                    if await http.is_disconnected():
                        engine.abort(request_id)
                        return
                    event = await stream.get()
                output_tokens.observe(count)
                if (body.stream_options or {}).get("include_usage"):
                    yield f"data: {json.dumps({**chunk('', None), 'choices': [], 'usage': usage(count)})}\n\n"
                yield "data: [DONE]\n\n"
            except BaseException:  # the client went away (cancelled): free its blocks
                engine.abort(request_id)
                raise

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(http: Request, body: CompletionBody):
        prompt = body.prompt if isinstance(body.prompt, list) else tokenizer.encode(body.prompt)
        if any(not 0 <= t < config.model.vocab_size for t in prompt):
            return error(f"prompt token ids must be in [0, {config.model.vocab_size})", param="prompt")
        return await generate(http, body, prompt, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: Request, body: ChatBody):
        if hasattr(tokenizer, "apply_chat_template") and getattr(tokenizer, "chat_template", None):
            prompt = tokenizer.apply_chat_template([m.model_dump() for m in body.messages], tokenize=True,
                                                   add_generation_prompt=True)
        else:
            prompt = tokenizer.encode("".join(f"{m.role}: {m.content}\n" for m in body.messages) + "assistant: ")
        return await generate(http, body, prompt, chat=True)

    return app
