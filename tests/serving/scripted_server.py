"""A raw asyncio HTTP/1.1 streaming server for client tests, whose every send time is known.

Each request plays a script chosen by its max tokens (`max_tokens`, or `max_completion_tokens` for chat):
a float sleeps that many seconds, a dict is sent as a `data:` event, a str is sent as a raw SSE line,
DROP aborts the connection, and a first item ("status", code, text) answers with that HTTP status instead.
The body is chunked (Transfer-Encoding), so a drop mid-stream is a protocol error to the client, and a
script that ends without DONE is a complete body without [DONE].

The server runs its own event loop in a thread of the test process and timestamps with time.perf_counter(),
the clock the client uses, right after each write is flushed to the socket.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

DONE = "data: [DONE]"
DROP = "DROP"


def tok(text: str = "x") -> dict:
    return {"id": "cmpl-1", "choices": [{"index": 0, "text": text, "finish_reason": None}]}


def chat_tok(text: str | None = "x", role: str | None = None) -> dict:
    delta = {"content": text} | ({"role": role} if role else {})
    return {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def chat_finish(reason: str = "length") -> dict:
    """vLLM's chat chunk that only ends the choice: an empty delta and the finish reason."""
    return {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


def usage(completion_tokens: int, prompt_tokens: int | None = None, metrics: dict | None = None) -> dict:
    """The final usage chunk; `metrics`: what vLLM's server started with --enable-per-request-metrics adds
    (queue_time_ms, time_to_first_token_ms, ...)."""
    counts = {"completion_tokens": completion_tokens} | ({"prompt_tokens": prompt_tokens} if prompt_tokens else {})
    return {"id": "cmpl-1", "choices": [], "usage": counts} | ({"metrics": metrics} if metrics else {})


def is_choice(item) -> bool:
    return isinstance(item, dict) and bool(item.get("choices"))


@dataclass
class Served:
    """One request as the server saw it."""

    path: str
    headers: dict[str, str]
    body: dict
    received: float  # the whole request was read
    sent: list[tuple[float, object]] = field(default_factory=list)  # (flushed at, script item)
    ended: float | None = None  # the response was complete, or the connection dropped

    @property
    def key(self) -> int:
        return self.body.get("max_tokens") or self.body.get("max_completion_tokens")

    @property
    def choice_times(self) -> list[float]:
        return [t for t, item in self.sent if is_choice(item)]


class ScriptedServer:
    """Plays a script per request (keyed by its max_tokens). `card`: /v1/models answers it (else 404);
    `vocab_size`: /detokenize decodes as vLLM's does with a Hugging Face tokenizer: ids 0-3 (special) and ids
    past the vocabulary to "", the others to text (else 404); `version`: /version answers it as vLLM's server
    does, {"version": ...} at the root (else 404)."""

    def __init__(
        self,
        scripts: dict[int, list],
        card: dict | None = None,
        vocab_size: int | None = None,
        version: str | None = None,
    ):
        self.scripts = scripts
        self.card, self.vocab_size, self.version = card, vocab_size, version
        self.probes: list[str] = []  # the paths of requests that were not scripted completions
        self.served: list[Served] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop
        ).result(timeout=10)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"
        return self

    def __exit__(self, *exc) -> None:
        async def shutdown():
            self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def by_key(self) -> dict[int, Served]:
        """The last request served per script key (the warm-up, when it shares a key, comes first)."""
        return {s.key: s for s in self.served}

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: one connection may carry several requests
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode().split("\r\n")
                path = lines[0].split()[1]
                headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
                raw = await reader.readexactly(int(headers.get("content-length", 0)))
                if not path.endswith("completions"):
                    self.probes.append(path)
                    await self._answer(path, json.loads(raw) if raw else {}, writer)
                    continue
                body = json.loads(raw)
                served = Served(path, headers, body, time.perf_counter())
                self.served.append(served)
                try:
                    if not await self._play(served, self.scripts[served.key], writer):
                        return
                except ConnectionError:  # the client left (a hang-up) while the server wrote
                    served.ended = time.perf_counter()
                    return
        except asyncio.CancelledError:  # shut down mid-script (a client that timed out left it sleeping)
            return
        finally:
            writer.close()

    async def _answer(self, path: str, body: dict, writer: asyncio.StreamWriter) -> None:
        """The model card, vLLM's /detokenize or /version, or a 404."""
        code, answer = 404, {"detail": "Not Found"}
        if path.endswith("/models") and self.card is not None:
            code, answer = 200, {"object": "list", "data": [self.card]}
        elif path == "/version" and self.version is not None:
            code, answer = 200, {"version": self.version}
        elif path == "/detokenize" and self.vocab_size is not None:
            code, answer = 200, {"prompt": "".join("x" for t in body.get("tokens", []) if 4 <= t < self.vocab_size)}
        text = json.dumps(answer)
        writer.write(
            f"HTTP/1.1 {code} Scripted\r\ncontent-type: application/json\r\ncontent-length: "
            f"{len(text)}\r\n\r\n{text}".encode()
        )
        await writer.drain()

    async def _play(self, served: Served, script: list, writer: asyncio.StreamWriter) -> bool:
        """Play one response; False when the connection was dropped."""
        if isinstance(script[0], tuple):
            _, code, text = script[0]
            writer.write(
                f"HTTP/1.1 {code} Scripted\r\ncontent-type: text/plain\r\ncontent-length: "
                f"{len(text)}\r\n\r\n{text}".encode()
            )
            await writer.drain()
            served.ended = time.perf_counter()
            return True
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        for item in script:
            if isinstance(item, float):
                await asyncio.sleep(item)
                continue
            if item == DROP:
                writer.transport.abort()
                served.ended = time.perf_counter()
                return False
            data = (f"data: {json.dumps(item)}" if isinstance(item, dict) else item) + "\n\n"
            writer.write(f"{len(data.encode()):x}\r\n{data}\r\n".encode())
            await writer.drain()
            served.sent.append((time.perf_counter(), item))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        served.ended = time.perf_counter()
        return True
