"""`chunkbench serve`: the built-in engine behind an OpenAI-compatible HTTP API (FastAPI).

/v1/completions and /v1/chat/completions, streaming (SSE) or not; /v1/models; /health; /metrics in the
Prometheus text format under vLLM's metric names. A bad request (wrong type, out-of-range number, invalid
Unicode, too big) gets an HTTP 4xx with an OpenAI-style error body naming the field, and the server goes
on. A client that disconnects, streaming or not, aborts its request, which frees its KV blocks. A request
the engine fails gets an HTTP 500 (or a stream error event); /health is 503 once the engine cannot go on.

Text: with a Hugging Face model directory holding a tokenizer, that tokenizer; otherwise (dummy weights)
a byte-level stand-in: each UTF-8 byte is one token, and a token decodes to the byte `id % 256`.
Tokenizing runs in a worker thread, after a length check, so a big prompt does not stall the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from typing import Annotated

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from chunkbench.async_engine import AsyncEngine, TokenEvent, now
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.engine import LLMEngine
from chunkbench.engine.request import SamplingError, SamplingParams
from chunkbench.gc_pause import frozen_heap
from chunkbench.server_limits import BodyLimit, ServerLimits


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


def _valid_unicode(text: str) -> str:
    """JSON's "\\ud800" parses to a lone surrogate, which no tokenizer (nor UTF-8) can take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"contains a lone surrogate at character {exc.start}: not valid Unicode") from None
    return text


Text = Annotated[str, AfterValidator(_valid_unicode)]
TokenIds = list[Annotated[int, Field(strict=True)]]
BRANCH_TAGS = {"str", "int", "float", "bool", "list", "dict"}


class _Strict(BaseModel):  # no coercion: "yes" is not a bool, true is not 1, 2.0 is not a token id
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Body(_Strict):
    model: Text | None = None
    max_tokens: int | None = 16  # null: up to max_model_len
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=1)] = 1
    user: Text | None = None


class CompletionBody(_Body):
    prompt: Text | TokenIds


class ChatMessage(_Strict):
    role: Text
    content: Text


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


def error_body(message: str, status: int = 400, param: str | None = None) -> dict:
    message = message.encode("utf-8", "backslashreplace").decode()  # it may quote a lone surrogate
    return {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                      "param": param, "code": None}}


def error(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(message, status, param))


def create_app(config: EngineConfig, served_name: str | None = None, limits: ServerLimits | None = None) -> FastAPI:
    limits = limits or ServerLimits()
    name = served_name or config.model.name
    engine = AsyncEngine(LLMEngine(config), name)
    tokenizer = load_tokenizer(config)
    max_prompt_chars = limits.prompt_chars(config.scheduler.max_model_len)
    ids = itertools.count()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        try:
            with frozen_heap():  # the model and the imports out of the collector's walks while serving (gc_pause.py)
                yield
        finally:
            engine.shutdown()

    app = FastAPI(title="chunkbench serve", lifespan=lifespan)
    app.state.engine, app.state.tokenizer = engine, tokenizer
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # For a union (prompt: text or token ids) the deepest error is the one about what was sent; its
        # location has the union's branch tags ("list[int]", "function-after[...]") that name no field.
        first = max(exc.errors(), key=lambda e: len(e.get("loc", ())), default={})
        where = ".".join(str(p) for p in first.get("loc", ())[1:]
                         if isinstance(p, int) or (p.isidentifier() and p not in BRANCH_TAGS)) or None
        return error(f"{where or 'body'}: {first.get('msg', 'invalid request')}", param=where)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return error(str(exc.detail), status=exc.status_code)

    @app.get("/health")
    async def health() -> PlainTextResponse:
        if not engine.healthy:
            return PlainTextResponse(f"engine stopped: {engine.dead}", status_code=503)
        return PlainTextResponse("ok")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "chunkbench",
                                            "max_model_len": config.scheduler.max_model_len,
                                            "vocab_size": config.model.vocab_size}]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(engine.stats.render(engine.engine).decode(),
                                 media_type="text/plain; version=0.0.4")

    async def next_event(http: Request, stream: asyncio.Queue) -> TokenEvent | None:
        """The request's next event, or None once its client has gone (checked before each event, and every
        `disconnect_poll_s` while none comes)."""
        while not await http.is_disconnected():
            try:
                return await asyncio.wait_for(stream.get(), limits.disconnect_poll_s)
            except asyncio.TimeoutError:
                pass
        return None

    def engine_error(event: TokenEvent) -> JSONResponse:
        if event.finish_reason == "rejected":
            return error(event.error, param="prompt" if "prompt" in event.error else None)
        return error(event.error, status=500 if engine.healthy else 503)

    async def generate(http: Request, body: _Body, prompt: list[int], chat: bool):
        max_tokens, field = body.max_tokens, "max_tokens"
        if getattr(body, "max_completion_tokens", None) is not None:
            max_tokens, field = body.max_completion_tokens, "max_completion_tokens"
        if max_tokens is None:
            max_tokens = max(1, config.scheduler.max_model_len - len(prompt))
        try:
            sampling = SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                                      seed=body.seed, ignore_eos=body.ignore_eos)
        except SamplingError as exc:
            param = field if exc.param == "max_tokens" else exc.param
            return error(str(exc).replace(exc.param, param, 1), param=param)
        if not engine.healthy:
            return error(f"the engine is not running: {engine.dead}", status=503)
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

        try:
            first = await next_event(http, stream)
            if first is None:
                engine.abort(request_id)
                return error("the client disconnected", status=499)
            if first.error:
                return engine_error(first)
            if not body.stream:
                tokens, event = list(first.token_ids), first
                while not event.finished:
                    event = await next_event(http, stream)
                    if event is None:  # the client went away: stop generating for it
                        engine.abort(request_id)
                        return error("the client disconnected", status=499)
                    if event.error:
                        return engine_error(event)
                    tokens += event.token_ids
                text = tokenizer.decode(tokens)
                choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                           "finish_reason": event.finish_reason} if chat else
                          {"index": 0, "text": text, "finish_reason": event.finish_reason, "logprobs": None})
                return {"id": request_id, "object": kind, "created": created, "model": name, "choices": [choice],
                        "usage": usage(len(tokens))}
        except BaseException:  # cancelled with the client gone: free its blocks
            engine.abort(request_id)
            raise

        async def events():
            event, count = first, 0
            try:
                while True:
                    if event.error:  # the engine failed it mid-stream
                        yield f"data: {json.dumps(error_body(event.error, 500))}\n\n"
                        break
                    count += len(event.token_ids)
                    if event.token_ids:
                        finish = event.finish_reason if event.finished else None
                        yield f"data: {json.dumps(chunk(tokenizer.decode(event.token_ids), finish))}\n\n"
                    if event.finished:
                        break
                    event = await next_event(http, stream)
                    if event is None:
                        engine.abort(request_id)
                        return
                if body.stream_options and body.stream_options.include_usage and not event.error:
                    yield f"data: {json.dumps({**chunk('', None), 'choices': [], 'usage': usage(count)})}\n\n"
                yield "data: [DONE]\n\n"
            except BaseException:  # the client went away (cancelled): free its blocks
                engine.abort(request_id)
                raise

        return StreamingResponse(events(), media_type="text/event-stream")

    def too_long(length: int) -> JSONResponse:
        return error(f"prompt has {length} characters, more than this server takes ({max_prompt_chars}); "
                     f"max_model_len is {config.scheduler.max_model_len} tokens", param="prompt")

    @app.post("/v1/completions")
    async def completions(http: Request, body: CompletionBody):
        if isinstance(body.prompt, list):
            prompt = body.prompt
            if len(prompt) > config.scheduler.max_model_len:
                return error(f"prompt has {len(prompt)} tokens, more than max_model_len "
                             f"({config.scheduler.max_model_len})", param="prompt")
            if any(not 0 <= t < config.model.vocab_size for t in prompt):
                return error(f"prompt token ids must be in [0, {config.model.vocab_size})", param="prompt")
        elif len(body.prompt) > max_prompt_chars:
            return too_long(len(body.prompt))
        else:
            prompt = await run_in_threadpool(tokenizer.encode, body.prompt)
        return await generate(http, body, prompt, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: Request, body: ChatBody):
        length = sum(len(m.role) + len(m.content) for m in body.messages)
        if length > max_prompt_chars:
            return too_long(length)
        if hasattr(tokenizer, "apply_chat_template") and getattr(tokenizer, "chat_template", None):
            prompt = await run_in_threadpool(tokenizer.apply_chat_template, [m.model_dump() for m in body.messages],
                                             tokenize=True, add_generation_prompt=True)
        else:
            text = "".join(f"{m.role}: {m.content}\n" for m in body.messages) + "assistant: "
            prompt = await run_in_threadpool(tokenizer.encode, text)
        return await generate(http, body, prompt, chat=True)

    return app
