"""One request of `chunkbench serve` in the engine, answered whole or streamed.

Its token events are detokenized as they come (chunkbench/serving/text.py's TextStream: a stop string ends the request
at that token) and built into OpenAI's shapes (chunkbench/serving/responses.py). A client that disconnects, streaming or
not, aborts its request, which frees its KV blocks; a request the engine fails gets an HTTP 500 (503 once the engine is
down), or mid-stream an error event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from chunkbench.serving.engine_thread import AsyncEngine, TokenEvent
from chunkbench.serving.responses import DONE, GOING_ON, Finish, Reply, choice, error, error_body, sse, usage
from chunkbench.serving.text import TextStream


@dataclass
class Generation:
    """One submitted request: reads its events, counts and detokenizes its tokens, and answers."""

    engine: AsyncEngine
    http: Request
    reply: Reply
    prompt_tokens: int
    events: asyncio.Queue  # the engine's TokenEvents for this request
    text: TextStream
    echo: str = ""  # text put before the completion (the prompt's, with echo)
    include_usage: bool = False  # streamed: a last chunk with the usage
    continuous_usage: bool = False  # streamed: the usage so far in every chunk
    poll_s: float = 0.5  # how often a request waiting for its next event checks its client is there
    count: int = 0  # output tokens the response stands for (a stop string ends them)

    async def answer(self, stream: bool) -> dict | JSONResponse | StreamingResponse:
        """The response, once the first event is in (a rejection or a failure is an error response)."""
        try:
            first = await self.next_event()
            if first is None:
                return self.disconnected()
            if first.error:
                return self.failed(first)
            if not stream:
                return await self.whole(first)
        except BaseException:  # cancelled with the client gone: free its blocks
            self.abort()
            raise
        return StreamingResponse(self.chunks(first), media_type="text/event-stream")

    async def whole(self, event: TokenEvent) -> dict | JSONResponse:
        while not self.consume(event):
            event = await self.next_event()
            if event is None:  # the client went away: stop generating for it
                return self.disconnected()
            if event.error:
                return self.failed(event)
        content = self.echo + self.text.take(final=True)
        return self.reply.body([choice(self.reply.chat, content, self.finish(event))], self.usage())

    async def chunks(self, event: TokenEvent) -> AsyncIterator[str]:
        """The server-sent events: a chunk per event that brought text, the usage chunk if asked for, [DONE]."""
        first = True
        try:
            while True:
                if event.error:  # the engine failed it mid-stream
                    yield sse(error_body(event.error, 500))
                    break
                done = self.consume(event)
                if event.token_ids or done:
                    content = (self.echo if first else "") + self.text.take(final=done)
                    said = choice(
                        self.reply.chat, content, self.finish(event) if done else GOING_ON, streamed=True, first=first
                    )
                    yield sse(self.reply.body([said], self.usage() if self.continuous_usage else None, streamed=True))
                    first = False
                if done:
                    break
                event = await self.next_event()
                if event is None:
                    self.abort()
                    return
            if self.include_usage and not event.error:
                yield sse(self.reply.body([], self.usage(), streamed=True))
            yield DONE
        except BaseException:  # the client went away (cancelled): free its blocks
            self.abort()
            raise

    async def next_event(self) -> TokenEvent | None:
        """The request's next event, or None once its client has gone (checked before each event, and every
        `poll_s` while none comes)."""
        while not await self.http.is_disconnected():
            try:
                return await asyncio.wait_for(self.events.get(), self.poll_s)
            except TimeoutError:
                pass
        return None

    def consume(self, event: TokenEvent) -> bool:
        """Detokenize the event's tokens; True once the text is done (a stop string, or the engine finished)."""
        for token in event.token_ids:
            self.count += 1
            if self.text.push(token):
                self.engine.abort(self.reply.id, keep_tokens=self.count)  # the engine ends it as stopped, here
                return True
        return event.finished and (self.text.finish() or True)

    def finish(self, event: TokenEvent) -> Finish:
        if self.text.stop_reason is not None:
            return "stop", self.text.stop_reason
        return event.finish_reason, event.stop_reason

    def usage(self) -> dict:
        return usage(self.prompt_tokens, self.count)

    def abort(self) -> None:
        self.engine.abort(self.reply.id)

    def disconnected(self) -> JSONResponse:
        self.abort()
        return error("the client disconnected", status=499)

    def failed(self, event: TokenEvent) -> JSONResponse:
        """The error response of a request the engine rejected (a 400) or failed (a 500; 503 once it is down)."""
        if event.finish_reason == "rejected":
            return error(event.error, param="prompt" if "prompt" in event.error else None)
        return error(event.error, status=500 if self.engine.healthy else 503)
