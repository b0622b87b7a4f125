"""What one client may cost `chunkbench serve`: body size, prompt length, and how long it may take to send.

`ServerLimits` holds them. The app applies the body and prompt limits itself (`BodyLimit` and the prompt checks
below); the connection-level ones are uvicorn's, plus a request-head timeout that uvicorn lacks: pass
`ServerLimits.uvicorn_kwargs()` to `uvicorn.run`/`uvicorn.Config`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass

from starlette.exceptions import HTTPException

from chunkbench.engine.limits import longest_prompt
from chunkbench.serving.responses import RequestError, error_body


@dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = 4 * 2**20  # a max_model_len=128k prompt as token ids is about 1 MB of JSON
    max_prompt_chars: int | None = None  # None: 32 characters per token of max_model_len
    body_timeout_s: float = 30.0  # the whole body must arrive within this after the request head
    disconnect_poll_s: float = 0.5  # how often a waiting non-streaming request checks its client is there
    header_timeout_s: float = 10.0  # a request head must arrive within this of connecting / the last response
    keep_alive_s: int = 5  # an idle keep-alive connection is closed after this
    max_connections: int | None = 1000  # beyond this many connections and tasks, uvicorn answers 503
    max_header_bytes: int = 64 * 2**10  # request line and headers
    graceful_shutdown_s: int = 10  # on SIGTERM, in-flight requests get this long before the process exits

    def prompt_chars(self, max_model_len: int) -> int:
        # A prompt with more characters than this cannot fit in max_model_len tokens with any tokenizer we
        # serve, so it is refused before tokenizing; the exact token count is checked after.
        return self.max_prompt_chars if self.max_prompt_chars is not None else 32 * longest_prompt(max_model_len)

    def check_prompt_chars(self, length: int, max_model_len: int) -> None:
        """Refuse a prompt of more characters than prompt_chars(), before tokenizing it."""
        most = self.prompt_chars(max_model_len)
        if length > most:
            raise RequestError(
                f"prompt has {length} characters, more than this server takes ({most}); "
                f"max_model_len is {max_model_len} tokens",
                param="prompt",
            )

    def uvicorn_kwargs(self) -> dict:
        return {
            "timeout_keep_alive": self.keep_alive_s,
            "limit_concurrency": self.max_connections,
            "h11_max_incomplete_event_size": self.max_header_bytes,
            "timeout_graceful_shutdown": self.graceful_shutdown_s,
            "http": h11_with_header_timeout(self.header_timeout_s),
        }


def check_prompt_ids(prompt: list[int], max_model_len: int, vocab_size: int) -> None:
    """Refuse a prompt sent as token ids that is over the OpenAPI document's maxItems (room for one output token
    under max_model_len, named in the message) or has an id outside the vocabulary."""
    longest = longest_prompt(max_model_len, max_tokens=1)
    if len(prompt) > longest:
        raise RequestError(
            f"prompt has {len(prompt)} tokens, more than max_model_len - 1 ({longest}): no room for an output token",
            param="prompt",
        )
    if any(not 0 <= t < vocab_size for t in prompt):
        raise RequestError(f"prompt token ids must be in [0, {vocab_size})", param="prompt")


async def _json(send, status: int, message: str) -> None:
    body = json.dumps(error_body(message, status)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: a body over `max_bytes` gets 413 (from its Content-Length, or counted as it arrives,
    before FastAPI buffers and parses it); a body slower than `timeout_s` gets 408."""

    def __init__(self, app, max_bytes: int, timeout_s: float) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._discard(receive)
            return await _json(send, 413, f"the request body is over {self.max_bytes} bytes")
        received, done = 0, False

        async def limited_receive():
            nonlocal received, done
            if done:  # the body is in: what comes now is the disconnect, however long that takes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except TimeoutError:
                raise HTTPException(408, f"the request body took over {self.timeout_s} s to arrive") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                done = not message.get("more_body", False)
                if received > self.max_bytes:
                    raise HTTPException(413, f"the request body is over {self.max_bytes} bytes")
            return message

        await self.app(scope, limited_receive, send)

    async def _discard(self, receive) -> None:
        """Read and drop a refused body (up to 16x the limit, within the body timeout), so the client, still
        sending, reads our 413 instead of a reset connection."""

        async def drain() -> None:
            dropped = 0
            while dropped <= 16 * self.max_bytes:
                message = await receive()
                dropped += len(message.get("body", b""))
                if message["type"] != "http.request" or not message.get("more_body", False):
                    return

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(drain(), self.timeout_s)


def h11_with_header_timeout(seconds: float) -> type:
    """uvicorn's h11 protocol, closing a connection whose request head has not arrived within `seconds` of
    connecting or of its last response (uvicorn's keep-alive timer stops at the first byte, so a client
    trickling a head in holds the connection for ever)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadTimeoutH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(seconds, self._head_timeout)

        def _head_timeout(self) -> None:
            waiting_for_head = self.cycle is None or self.cycle.response_complete
            if waiting_for_head and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

    return HeadTimeoutH11Protocol
