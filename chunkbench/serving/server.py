"""`chunkbench serve`: the built-in engine behind an OpenAI-compatible HTTP API (FastAPI).

/v1/completions and /v1/chat/completions, streaming (SSE) or not; /v1/models; /health; /metrics in the
Prometheus text format under vLLM's metric names. It takes what vLLM's and OpenAI's clients send
(chunkbench/serving/openai_models.py): unknown fields are ignored and logged once, as vLLM does. Here: the app,
its routes and the checks a request passes before the engine sees it (create_app says what each answer is). One
request's run, whole or streamed, is chunkbench/serving/generation.py's; the response shapes are
chunkbench/serving/responses.py's; text (a Hugging Face tokenizer and chat template, or a byte-level stand-in
with dummy weights) is chunkbench/serving/text.py's.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' body types, built in add_generation_routes.
import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from chunkbench.bench.gc_pause import frozen_heap
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.engine import LLMEngine
from chunkbench.engine.limits import prompt_fits
from chunkbench.engine.request import SamplingError, SamplingParams
from chunkbench.serving.engine_thread import AsyncEngine, now
from chunkbench.serving.generation import Generation
from chunkbench.serving.limits import BodyLimit, ServerLimits, check_prompt_ids
from chunkbench.serving.openai_models import UnknownFields, request_models
from chunkbench.serving.openapi import POST_RESPONSES, TEXT_RESPONSES, document_errors
from chunkbench.serving.responses import Reply, RequestError, error
from chunkbench.serving.text import ChatTemplateError, TextStream, chat_prompt_ids, load_tokenizer

BRANCH_TAGS = {"str", "int", "float", "bool", "list", "dict"}


@dataclass
class Served:
    """What the routes share: the engine, the tokenizer, the name and limits it is served under."""

    engine: AsyncEngine
    tokenizer: Any
    name: str
    max_model_len: int
    vocab_size: int
    limits: ServerLimits
    unknown: UnknownFields = field(default_factory=UnknownFields)
    ids: Iterator[int] = field(default_factory=itertools.count)  # request ids' numbers


def create_app(config: EngineConfig, served_name: str | None = None, limits: ServerLimits | None = None) -> FastAPI:
    """The app serving `config`'s engine as `served_name` (default: the model's name); its engine thread runs
    from now until the app's lifespan ends.

    A bad request (wrong type, out-of-range number, invalid Unicode, too big, a feature not implemented) gets an
    HTTP 4xx with an OpenAI-style error body naming the field, and the server goes on; the OpenAPI document
    lists those answers and the limits. A client that disconnects, streaming or not, aborts its request, which
    frees its KV blocks. A request the engine fails gets an HTTP 500 (or a stream error event); /health is 503
    once the engine cannot go on. Tokenizing runs in a worker thread, after a length check, so a big prompt
    does not stall the event loop."""
    limits = limits or ServerLimits()
    name = served_name or config.model.name
    served = Served(
        AsyncEngine(LLMEngine(config), name),
        load_tokenizer(config.model.hf_dir),
        name,
        config.scheduler.max_model_len,
        config.model.vocab_size,
        limits,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        try:
            with (
                frozen_heap()
            ):  # the model and the imports out of the collector's walks while serving (chunkbench/bench/gc_pause.py)
                yield
        finally:
            served.engine.shutdown()

    app = FastAPI(title="chunkbench serve", lifespan=lifespan)
    app.state.engine, app.state.tokenizer = served.engine, served.tokenizer
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s)
    document_errors(app)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestError, refused)
    add_info_routes(app, served)
    add_generation_routes(app, served)
    return app


async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    """A body that is not JSON, or not the request model: a 400 naming the field at fault."""
    errors = exc.errors()
    if errors and errors[0].get("type") == "json_invalid":  # its location is a character offset, not a field
        offset = errors[0].get("loc", (None, None))[-1]
        return error(
            f"the body is not valid JSON (at character {offset}): "
            f"{errors[0].get('ctx', {}).get('error', 'invalid JSON')}"
        )
    # For a union (prompt: text or token ids) the deepest error is the one about what was sent; its
    # location has the union's branch tags ("list[int]", "function-after[...]") that name no field.
    first = max(errors, key=lambda e: len(e.get("loc", ())), default={})
    where = (
        ".".join(
            str(p)
            for p in first.get("loc", ())[1:]
            if isinstance(p, int) or (p.isidentifier() and p not in BRANCH_TAGS)
        )
        or None
    )
    message = first.get("msg", "invalid request").removeprefix("Value error, ")
    return error(f"{where or 'body'}: {message}", param=where)


async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
    return error(str(exc.detail), status=exc.status_code, headers=getattr(exc, "headers", None))  # 405: Allow


async def refused(_: Request, exc: RequestError) -> JSONResponse:
    return exc.response()


def add_info_routes(app: FastAPI, served: Served) -> None:
    engine = served.engine

    @app.get("/health", response_class=PlainTextResponse, responses=TEXT_RESPONSES)
    async def health() -> PlainTextResponse:
        if not engine.healthy:
            return PlainTextResponse(f"engine stopped: {engine.dead}", status_code=503)
        return PlainTextResponse("ok")

    @app.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": served.name,
                    "object": "model",
                    "owned_by": "chunkbench",
                    "max_model_len": served.max_model_len,
                    "vocab_size": served.vocab_size,
                }
            ],
        }

    @app.get("/metrics", response_class=PlainTextResponse, responses={200: TEXT_RESPONSES[200]})
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(engine.stats.render(engine.engine).decode(), media_type="text/plain; version=0.0.4")


def add_generation_routes(app: FastAPI, served: Served) -> None:
    max_prompt_chars = served.limits.prompt_chars(served.max_model_len)
    CompletionBody, ChatBody = request_models(served.vocab_size, served.max_model_len, max_prompt_chars)

    @app.post("/v1/completions", responses=POST_RESPONSES)
    async def completions(http: Request, body: CompletionBody):
        prompt, echo = await completion_prompt(served, body)
        return await generate(served, http, body, prompt, chat=False, echo=echo)

    @app.post("/v1/chat/completions", responses=POST_RESPONSES)
    async def chat_completions(http: Request, body: ChatBody):
        return await generate(served, http, body, await chat_prompt(served, body), chat=True)


async def completion_prompt(served: Served, body) -> tuple[list[int], str]:
    """The completion's prompt token ids, and the text echo puts before the completion."""
    if isinstance(body.prompt, list):
        check_prompt_ids(body.prompt, served.max_model_len, served.vocab_size)
        return body.prompt, served.tokenizer.decode(body.prompt) if body.echo else ""
    served.limits.check_prompt_chars(len(body.prompt), served.max_model_len)
    prompt = await run_in_threadpool(served.tokenizer.encode, body.prompt)
    return prompt, body.prompt if body.echo else ""


async def chat_prompt(served: Served, body) -> list[int]:
    """The chat's prompt token ids, rendered by the model's chat template."""
    messages = [m.template_dict() for m in body.messages]
    served.limits.check_prompt_chars(sum(len(m["role"]) + len(m["content"]) for m in messages), served.max_model_len)
    try:
        return await run_in_threadpool(chat_prompt_ids, served.tokenizer, messages, body.add_generation_prompt)
    except ChatTemplateError as exc:
        raise RequestError(str(exc), param="messages") from None


async def generate(served: Served, http: Request, body, prompt: list[int], chat: bool, echo: str = ""):
    """Submit the request to the engine and answer it, whole or streamed."""
    served.unknown.report(body)
    sampling = sampling_for(served, body, len(prompt), chat)
    engine = served.engine
    if not engine.healthy:
        raise RequestError(f"the engine is not running: {engine.dead}", status=503)
    reply = Reply(f"{'chatcmpl' if chat else 'cmpl'}-{next(served.ids)}", chat, served.name, int(time.time()))
    events = engine.submit(reply.id, prompt, sampling, now())
    text = TextStream(
        served.tokenizer, prompt, body.stop_strings, body.include_stop_str_in_output, body.skip_special_tokens
    )
    options = body.stream_options
    include_usage = bool(options and options.include_usage)
    generation = Generation(
        engine,
        http,
        reply,
        len(prompt),
        events,
        text,
        echo,
        include_usage,
        include_usage and bool(options.continuous_usage_stats),
        served.limits.disconnect_poll_s,
    )
    return await generation.answer(stream=bool(body.stream))


def sampling_for(served: Served, body, prompt_len: int, chat: bool) -> SamplingParams:
    """The request's sampling, or the RequestError that refuses it: as vLLM, a prompt must leave room for one
    token, and max_tokens may not ask for more than the room left (null: all of it for a chat, 16 for a
    completion)."""
    max_tokens, name = body.max_tokens, "max_tokens"
    if chat and body.max_completion_tokens is not None:
        max_tokens, name = body.max_completion_tokens, "max_completion_tokens"
    no_room = prompt_fits(prompt_len, served.max_model_len, max_tokens=1)
    if no_room:
        raise RequestError(no_room, param="messages" if chat else "prompt")
    if max_tokens is None:
        max_tokens = served.max_model_len - prompt_len if chat else 16
    too_many = prompt_fits(prompt_len, served.max_model_len, max_tokens, field=name)
    if too_many:
        raise RequestError(too_many, param=name)
    bad = [t for t in body.stop_token_ids or () if t >= served.vocab_size]
    if bad:
        raise RequestError(f"stop_token_ids must be in [0, {served.vocab_size}), got {bad[0]}", param="stop_token_ids")
    try:
        return SamplingParams(max_tokens=max_tokens, **body.sampling_kwargs())
    except SamplingError as exc:
        param = name if exc.param == "max_tokens" else exc.param
        raise RequestError(str(exc).replace(exc.param, param, 1), param=param) from None
