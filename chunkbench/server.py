"""`chunkbench serve`: the built-in engine behind an OpenAI-compatible HTTP API (FastAPI).

/v1/completions and /v1/chat/completions, streaming (SSE) or not; /v1/models; /health; /metrics in the
Prometheus text format under vLLM's metric names. It takes what vLLM's and OpenAI's clients send
(openai_models.py): unknown fields are ignored and logged once, as vLLM does. A bad request (wrong type,
out-of-range number, invalid Unicode, too big, a feature not implemented) gets an HTTP 4xx with an
OpenAI-style error body naming the field, and the server goes on; the OpenAPI document lists those answers and
the limits. A client that disconnects, streaming or not, aborts its request, which frees its KV blocks. A
request the engine fails gets an HTTP 500 (or a stream error event); /health is 503 once the engine cannot go on.

Text (server_text.py): with a Hugging Face model directory holding a tokenizer, that tokenizer and its chat
template; otherwise (dummy weights) a byte-level stand-in. Tokenizing runs in a worker thread, after a length
check, so a big prompt does not stall the event loop.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' body types, built in create_app.
import asyncio
import contextlib
import itertools
import json
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from chunkbench.async_engine import AsyncEngine, TokenEvent, now
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.engine import LLMEngine
from chunkbench.engine.request import SamplingError, SamplingParams
from chunkbench.gc_pause import frozen_heap
from chunkbench.openai_models import UnknownFields, request_models
from chunkbench.server_docs import POST_RESPONSES, TEXT_RESPONSES, document_errors
from chunkbench.server_limits import BodyLimit, ServerLimits
from chunkbench.server_text import ChatTemplateError, TextStream, chat_prompt_ids, load_tokenizer

BRANCH_TAGS = {"str", "int", "float", "bool", "list", "dict"}


def error_body(message: str, status: int = 400, param: str | None = None) -> dict:
    message = message.encode("utf-8", "backslashreplace").decode()  # it may quote a lone surrogate
    return {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                      "param": param, "code": None}}


def error(message: str, status: int = 400, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(message, status, param), headers=headers)


def create_app(config: EngineConfig, served_name: str | None = None, limits: ServerLimits | None = None) -> FastAPI:
    limits = limits or ServerLimits()
    name = served_name or config.model.name
    max_model_len, vocab_size = config.scheduler.max_model_len, config.model.vocab_size
    engine = AsyncEngine(LLMEngine(config), name)
    tokenizer = load_tokenizer(config.model.hf_dir)
    max_prompt_chars = limits.prompt_chars(max_model_len)
    CompletionBody, ChatBody = request_models(vocab_size, max_model_len, max_prompt_chars)
    unknown = UnknownFields()
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
    document_errors(app)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if errors and errors[0].get("type") == "json_invalid":  # its location is a character offset, not a field
            offset = errors[0].get("loc", (None, None))[-1]
            return error(f"the body is not valid JSON (at character {offset}): "
                         f"{errors[0].get('ctx', {}).get('error', 'invalid JSON')}")
        # For a union (prompt: text or token ids) the deepest error is the one about what was sent; its
        # location has the union's branch tags ("list[int]", "function-after[...]") that name no field.
        first = max(errors, key=lambda e: len(e.get("loc", ())), default={})
        where = ".".join(str(p) for p in first.get("loc", ())[1:]
                         if isinstance(p, int) or (p.isidentifier() and p not in BRANCH_TAGS)) or None
        message = first.get("msg", "invalid request").removeprefix("Value error, ")
        return error(f"{where or 'body'}: {message}", param=where)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return error(str(exc.detail), status=exc.status_code, headers=getattr(exc, "headers", None))  # 405: Allow

    @app.get("/health", response_class=PlainTextResponse, responses=TEXT_RESPONSES)
    async def health() -> PlainTextResponse:
        if not engine.healthy:
            return PlainTextResponse(f"engine stopped: {engine.dead}", status_code=503)
        return PlainTextResponse("ok")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "chunkbench",
                                            "max_model_len": max_model_len, "vocab_size": vocab_size}]}

    @app.get("/metrics", response_class=PlainTextResponse, responses={200: TEXT_RESPONSES[200]})
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

    def sampling_for(body, prompt: list[int], chat: bool) -> SamplingParams | JSONResponse:
        """The request's sampling, or the 400 that refuses it: as vLLM, a prompt must leave room for one token,
        and max_tokens may not ask for more than the room left (null: all of it)."""
        max_tokens, field = body.max_tokens, "max_tokens"
        if chat and body.max_completion_tokens is not None:
            max_tokens, field = body.max_completion_tokens, "max_completion_tokens"
        room = max_model_len - len(prompt)
        if room < 1:
            return error(f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
                         f"contains {len(prompt)} input tokens, which leaves no room for an output token.",
                         param="messages" if chat else "prompt")
        if max_tokens is None:
            max_tokens = room if chat else 16
        if max_tokens > room:
            return error(f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                         f"{field}={max_tokens} output tokens and your prompt contains {len(prompt)} input tokens, "
                         f"for a total of {max_tokens + len(prompt)} tokens: at most {room} output tokens fit.",
                         param=field)
        bad = [t for t in body.stop_token_ids or () if t >= vocab_size]
        if bad:
            return error(f"stop_token_ids must be in [0, {vocab_size}), got {bad[0]}", param="stop_token_ids")
        try:
            return SamplingParams(max_tokens=max_tokens, **body.sampling_kwargs())
        except SamplingError as exc:
            param = field if exc.param == "max_tokens" else exc.param
            return error(str(exc).replace(exc.param, param, 1), param=param)

    async def generate(http: Request, body, prompt: list[int], chat: bool, echo: str = ""):
        unknown.report(body)
        sampling = sampling_for(body, prompt, chat)
        if isinstance(sampling, JSONResponse):
            return sampling
        if not engine.healthy:
            return error(f"the engine is not running: {engine.dead}", status=503)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{next(ids)}"
        stream = engine.submit(request_id, prompt, sampling, now())
        text = TextStream(tokenizer, prompt, body.stop_strings, body.include_stop_str_in_output,
                          body.skip_special_tokens)
        created, kind = int(time.time()), "chat.completion" if chat else "text_completion"
        options = body.stream_options
        include_usage = bool(options and options.include_usage)
        continuous = include_usage and bool(options.continuous_usage_stats)
        count = 0  # output tokens the response stands for (a stop string ends them)

        def usage() -> dict:
            return {"prompt_tokens": len(prompt), "completion_tokens": count, "total_tokens": len(prompt) + count}

        def consume(event: TokenEvent) -> bool:
            """Detokenize the event's tokens; True once the text is done (a stop string, or the engine finished)."""
            nonlocal count
            for token in event.token_ids:
                count += 1
                if text.push(token):
                    engine.abort(request_id, keep_tokens=count)  # the engine ends it as stopped, at this token
                    return True
            return event.finished and (text.finish() or True)

        def finish(event: TokenEvent) -> tuple[str, str | int | None]:
            if text.stop_reason is not None:
                return "stop", text.stop_reason
            return event.finish_reason, event.stop_reason

        def choice(content: str, done: tuple | None, first: bool) -> dict:
            reason, stop_reason = done or (None, None)
            if chat:
                delta = {"role": "assistant", "content": content} if first else {"content": content}
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason,
                        "stop_reason": stop_reason}
            return {"index": 0, "text": content, "logprobs": None, "finish_reason": reason, "stop_reason": stop_reason}

        def chunk(choices: list, with_usage: bool) -> str:
            data = {"id": request_id, "object": kind + (".chunk" if chat else ""), "created": created, "model": name,
                    "choices": choices}
            if with_usage:
                data["usage"] = usage()
            return f"data: {json.dumps(data)}\n\n"

        try:
            first = await next_event(http, stream)
            if first is None:
                engine.abort(request_id)
                return error("the client disconnected", status=499)
            if first.error:
                return engine_error(first)
            if not body.stream:
                event = first
                while not consume(event):
                    event = await next_event(http, stream)
                    if event is None:  # the client went away: stop generating for it
                        engine.abort(request_id)
                        return error("the client disconnected", status=499)
                    if event.error:
                        return engine_error(event)
                reason, stop_reason = finish(event)
                content = echo + text.take(final=True)
                out = ({"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": None,
                        "finish_reason": reason, "stop_reason": stop_reason} if chat else
                       {"index": 0, "text": content, "logprobs": None, "finish_reason": reason,
                        "stop_reason": stop_reason})
                return {"id": request_id, "object": kind, "created": created, "model": name, "choices": [out],
                        "usage": usage()}
        except BaseException:  # cancelled with the client gone: free its blocks
            engine.abort(request_id)
            raise

        async def events():
            event, is_first = first, True
            try:
                while True:
                    if event.error:  # the engine failed it mid-stream
                        yield f"data: {json.dumps(error_body(event.error, 500))}\n\n"
                        break
                    done = consume(event)
                    if event.token_ids or done:
                        content = (echo if is_first else "") + text.take(final=done)
                        yield chunk([choice(content, finish(event) if done else None, is_first)], continuous)
                        is_first = False
                    if done:
                        break
                    event = await next_event(http, stream)
                    if event is None:
                        engine.abort(request_id)
                        return
                if include_usage and not event.error:
                    yield chunk([], True)
                yield "data: [DONE]\n\n"
            except BaseException:  # the client went away (cancelled): free its blocks
                engine.abort(request_id)
                raise

        return StreamingResponse(events(), media_type="text/event-stream")

    def too_long(length: int) -> JSONResponse:
        return error(f"prompt has {length} characters, more than this server takes ({max_prompt_chars}); "
                     f"max_model_len is {max_model_len} tokens", param="prompt")

    @app.post("/v1/completions", responses=POST_RESPONSES)
    async def completions(http: Request, body: CompletionBody):
        if isinstance(body.prompt, list):
            prompt = body.prompt
            if len(prompt) >= max_model_len:
                return error(f"prompt has {len(prompt)} tokens, more than max_model_len - 1 ({max_model_len - 1}): "
                             "no room for an output token", param="prompt")
            if any(not 0 <= t < vocab_size for t in prompt):
                return error(f"prompt token ids must be in [0, {vocab_size})", param="prompt")
            echo = tokenizer.decode(prompt) if body.echo else ""
        elif len(body.prompt) > max_prompt_chars:
            return too_long(len(body.prompt))
        else:
            prompt = await run_in_threadpool(tokenizer.encode, body.prompt)
            echo = body.prompt if body.echo else ""
        return await generate(http, body, prompt, chat=False, echo=echo)

    @app.post("/v1/chat/completions", responses=POST_RESPONSES)
    async def chat_completions(http: Request, body: ChatBody):
        messages = [m.template_dict() for m in body.messages]
        length = sum(len(m["role"]) + len(m["content"]) for m in messages)
        if length > max_prompt_chars:
            return too_long(length)
        try:
            prompt = await run_in_threadpool(chat_prompt_ids, tokenizer, messages, body.add_generation_prompt)
        except ChatTemplateError as exc:
            return error(str(exc), param="messages")
        return await generate(http, body, prompt, chat=True)

    return app
