"""A fake SGLang 0.5.23 server, for launching "SGLang" where there is no GPU:

    python tests/tune/fake_sglang.py --model-path MODEL [SGLang flags] --port PORT [--fake-... timing]

so `python tests/tune/fake_sglang.py --model-path {model} {sglang_flags} --port {port} --enable-metrics` works as a
`tune --backend launch --launch` template. Without --enable-metrics there is no /metrics (404), as in SGLang.

Its command line has SGLang's names, types, defaults and choices for the flags chunkbench emits and the usual
launch ones (tests/vllm/test_sglang_args.py holds them against SGLang's own parser); any other flag exits 2
("unrecognized arguments") as in SGLang, and a prefix is read as argparse reads it (`--tp 2`: --tp-size 2). Its
own flags: --fake-load-s (the port stays closed that long: weights loading), --fake-step-ms and --fake-token-us
(a forward pass's cost).

Its HTTP surface is SGLang's (sglang/srt/entrypoints/http_server.py and openai/serving_*.py):
- The port opens after loading; /health and /health_generate answer 503 until the warm-up request (8 tokens,
  1 s after the port opened; none with --skip-server-warmup) has run, then 200 after a one-token generation
  and a 1 s wait (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0: /health at once). /ready: 200 once up.
- /model_info and /get_model_info; /server_info and /get_server_info: the flags it runs with (chunked_prefill_size
  resolved to 8192 when unset, as SGLang does on an 80 GB GPU), launch_command, max_total_num_tokens,
  internal_states, version. /v1/models: one card with max_model_len (--context-length, else the model
  directory's config.json, else 8192).
- /v1/completions and /v1/chat/completions: the response starts with the first token; completions chunks
  carry text and finish_reason on the last; chat sends a role chunk with the first token, content chunks, a
  finish chunk, then (stream_options.include_usage) a usage chunk with empty choices, then [DONE]. Prompts:
  token ids, or one token per word; no EOS, so finish_reason is always "length".
- /metrics: Prometheus text under SGLang's names and labels (fake_sglang_engine.Metrics).

Timing (fake_sglang_engine.Engine): SGLang's scheduler in small, so a tune over chunk sizes sees them differ.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

if __package__:  # imported by a test
    from tests.tune.fake_sglang_engine import DEFAULT_CHUNK, Engine, Metrics, Req
else:  # run as a script: its directory is on the path
    from fake_sglang_engine import DEFAULT_CHUNK, Engine, Metrics, Req

VERSION = "0.5.23"
KV_CACHE_DTYPES = ["auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"]
DTYPES = ["auto", "half", "float16", "bfloat16", "float", "float32"]
SCHEDULE_POLICIES = "lpm random fcfs dfs-weight lof priority routing-key hrrn shortest-prefill-first".split()


def build_parser() -> argparse.ArgumentParser:
    """SGLang 0.5.23's flags that chunkbench emits or a launch template commonly holds, as its ServerArgs
    declares them (arg_groups/fields/), then this fake's own --fake-* flags."""
    p = argparse.ArgumentParser(prog="sglang serve")
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--max-prefill-tokens", type=int, default=16384)
    p.add_argument("--schedule-policy", choices=SCHEDULE_POLICIES, default="fcfs")
    p.add_argument("--page-size", type=int, default=None)
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--log-level", default="info")
    for flag in ("--enable-mixed-chunk", "--disable-radix-cache", "--enable-metrics", "--skip-server-warmup"):
        p.add_argument(flag, action="store_true")
    for flag in ("--trust-remote-code", "--disable-overlap-schedule", "--enable-cache-report"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--fake-load-s", type=float, default=0.0, help="seconds before the port opens")
    p.add_argument("--fake-step-ms", type=float, default=2.0, help="a forward pass's fixed cost")
    p.add_argument("--fake-token-us", type=float, default=20.0, help="its cost per token it computes")
    return p


def model_config(path: str) -> dict:
    """The model directory's config.json, {} for a name (nothing is downloaded)."""
    with contextlib.suppress(OSError, ValueError):
        return json.loads((Path(path) / "config.json").read_text())
    return {}


class Server:
    """The server's state: its flags, engine, metrics, and whether it is up (SGLang's ServerStatus)."""

    def __init__(self, args, argv: list[str]):
        self.args, self.argv = args, argv
        self.config = model_config(args.model_path)
        self.context_len = args.context_length or self.config.get("max_position_embeddings") or 8192
        self.served = args.served_model_name or args.model_path
        self.metrics = Metrics(self.served, args.max_total_tokens or 500_000, self.context_len)
        self.engine = Engine(args, self.metrics)
        self.up, self.started = False, time.time()  # SGLang's ServerStatus: Starting until the warm-up ran
        self.aborts: set[asyncio.Task] = set()

    async def warm_up(self) -> None:
        """SGLang's _wait_and_warmup: 1 s, then an 8-token request ("The capital city of France is"), then up."""
        if not self.args.skip_server_warmup:
            await asyncio.sleep(1.0)
            req = self.engine.submit(Req(prompt=6, max_new=8, stream=False))
            while not (await req.outputs.get())[1]:
                pass
        self.up = True
        print("The server is fired up and ready to roll!", flush=True)

    def abort_later(self, req: Req) -> None:
        self.aborts.add(task := asyncio.get_running_loop().create_task(self.engine.abort(req)))
        task.add_done_callback(self.aborts.discard)

    def model_info(self) -> dict:
        return {
            "model_path": self.args.model_path,
            "served_model_name": self.served,
            "tokenizer_path": self.args.tokenizer_path or self.args.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": self.config.get("model_type"),
            "architectures": self.config.get("architectures"),
        }

    def server_info(self) -> dict:
        fields = {k: v for k, v in vars(self.args).items() if not k.startswith("fake_")}
        fields |= {"chunked_prefill_size": self.args.chunked_prefill_size or DEFAULT_CHUNK}
        fields |= {"served_model_name": self.served, "tokenizer_path": self.args.tokenizer_path or self.args.model_path}
        state = fields | {
            "effective_max_running_requests_per_dp": self.engine.max_running,
            "last_gen_throughput": 0.0,
            "world_size": self.args.tp_size,
        }
        return fields | {
            "launch_command": " ".join(self.argv),
            "status": "ready",
            "max_total_num_tokens": self.metrics.max_total_tokens,
            "max_req_input_len": self.context_len - 5,
            "startup_time": self.started,
            "internal_states": [state],
            "version": VERSION,
            "frontend": "python",
        }

    def model_card(self) -> dict:
        card = {"id": self.served, "object": "model", "created": int(time.time()), "owned_by": "sglang"}
        return card | {"root": self.served, "parent": None, "max_model_len": self.context_len}


def error(message: str, status: int = 400):
    """SGLang's ErrorResponse."""
    body = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": status}
    return JSONResponse(body, status_code=status)


def prompt_tokens(body: dict, chat: bool) -> int:
    """Token ids count one each; text one per word (this fake's tokenizer)."""
    if chat:
        return sum(len(str(m.get("content") or "").split()) for m in body.get("messages") or [])
    prompt = body.get("prompt", "")
    return len(prompt) if isinstance(prompt, list) else len(str(prompt).split())


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def stream_events(head: dict, chat: bool, n: int, done: bool, first: bool) -> list[str]:
    """The chunks of one engine output of `n` tokens, as serving_chat / serving_completions write them."""
    text, rest = " x" * n, {"logprobs": None, "finish_reason": None, "matched_stop": None}
    if not chat:
        choice = {"index": 0, "text": text} | rest | {"finish_reason": "length" if done else None}
        return [sse(head | {"choices": [choice], "usage": None})]
    deltas = [({"role": "assistant", "content": ""}, None)] if first else []  # the role chunk goes first
    deltas += [({"content": text}, None)] + ([({}, "length")] if done else [])  # then the finish chunk
    return [
        sse(
            head
            | {"choices": [{"index": 0, "delta": {"reasoning_content": None} | delta} | rest | {"finish_reason": end}]}
        )
        for delta, end in deltas
    ]


def usage(req: Req, chat: bool) -> dict:
    counts = {"prompt_tokens": req.prompt, "total_tokens": req.prompt + req.generated}
    counts |= {"completion_tokens": req.generated}
    if chat:  # pydantic's model_dump_json keeps the nulls; completions' final chunk drops them
        return counts | {"prompt_tokens_details": None, "reasoning_tokens": 0, "completion_tokens_details": None}
    return counts | {"reasoning_tokens": 0}


async def generate(server: Server, request, chat: bool):
    """POST /v1/completions or /v1/chat/completions: SGLang's OpenAI adapter over the fake engine."""
    try:
        body = await request.json()
    except ValueError as exc:
        return error(f"invalid JSON: {exc}")
    prompt = prompt_tokens(body, chat)
    limit = body.get("max_completion_tokens") or body.get("max_tokens") if chat else body.get("max_tokens", 16)
    max_new = server.context_len - prompt if limit is None else int(limit)  # no EOS: to the context's end
    if prompt >= server.context_len:
        return error(
            f"The input ({prompt} tokens) is longer than the model's context length ({server.context_len} tokens)."
        )
    if prompt + max_new > server.context_len:
        return error(
            f"Requested token count exceeds the model's maximum context length of {server.context_len} "
            f"tokens. You requested a total of {prompt + max_new} tokens: {prompt} tokens from the input "
            f"messages and {max_new} tokens for the completion. Please reduce the number of tokens in the "
            f"input messages or the completion to fit within the limit."
        )
    stream = bool(body.get("stream"))
    req = server.engine.submit(Req(prompt=prompt, max_new=max(1, max_new), stream=stream))
    kind = "chat.completion.chunk" if chat else "text_completion"
    head = {"id": uuid.uuid4().hex, "object": kind, "created": int(time.time()), "model": body.get("model", "default")}
    try:
        first = await req.outputs.get()  # SGLang starts the response with its first chunk
    except asyncio.CancelledError:
        server.abort_later(req)
        raise
    if not stream:
        done = first[1]
        while not done:
            done = (await req.outputs.get())[1]
        text = " x" * req.generated
        result = {"index": 0} | ({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        result |= {"logprobs": None, "finish_reason": "length", "matched_stop": None}
        kind = "chat.completion" if chat else "text_completion"
        return JSONResponse(head | {"object": kind, "choices": [result], "usage": usage(req, chat)})
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    async def events():
        n, done = first
        try:
            for event in stream_events(head, chat, n, done, first=True):
                yield event
            while not done:
                n, done = await req.outputs.get()
                for event in stream_events(head, chat, n, done, first=False):
                    yield event
            if include_usage:
                yield sse(head | {"choices": [], "usage": usage(req, chat)})
            yield "data: [DONE]\n\n"
        finally:
            if not done:  # the client went away
                server.abort_later(req)

    return StreamingResponse(events(), media_type="text/event-stream")


def create_app(server: Server) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        tasks = [asyncio.create_task(server.engine.run()), asyncio.create_task(server.warm_up())]
        yield
        for task in tasks:
            task.cancel()

    app = FastAPI(lifespan=lifespan)
    health_generates = os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "1").lower() not in ("0", "false")

    @app.get("/health")
    @app.get("/health_generate")
    async def health(request: Request):
        if not server.up:
            return Response(status_code=503)
        if request.url.path == "/health_generate" or health_generates:  # one token, uncounted, and 1 s
            server.engine.submit(Req(prompt=1, max_new=1, stream=False, counted=False))
            await asyncio.sleep(1.0)
        return Response(status_code=200)

    @app.get("/ready")
    async def ready():
        return Response(status_code=200 if server.up else 503)

    app.get("/model_info")(app.get("/get_model_info")(server.model_info))
    app.get("/server_info")(app.get("/get_server_info")(server.server_info))

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [server.model_card()]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(server, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(server, request, chat=True)

    if server.args.enable_metrics:  # SGLang mounts its Prometheus app only with --enable-metrics

        @app.get("/metrics")
        async def metrics():
            return Response(server.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    print(f"fake_sglang {VERSION}: pid {os.getpid()} server_args {vars(args)}", flush=True)
    time.sleep(args.fake_load_s)
    app = create_app(Server(args, argv))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
