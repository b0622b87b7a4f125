"""The engine in a background thread, fed by asyncio callers: what `chunkbench serve` stands on.

Callers submit a request and read its tokens from an asyncio queue; the thread adds, aborts and steps.
Torch releases the GIL inside its kernels, so the event loop keeps serving HTTP while a step runs.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass

from chunkbench.engine.engine import LLMEngine
from chunkbench.engine.request import Request, SamplingParams


@dataclass
class TokenEvent:
    token_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue, int]] = {}
        self._wake = threading.Event()
        self._stop = False
        self.finished: dict[str, Request] = {}  # recent finished requests, for their server-side timings
        self.step_seconds: list[float] = []  # drained by the metrics endpoint
        self.thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self.thread.start()

    def submit(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
               arrival_time: float) -> asyncio.Queue:
        stream: asyncio.Queue = asyncio.Queue()
        self._commands.put(("add", request_id, prompt_token_ids, sampling, arrival_time,
                            asyncio.get_running_loop(), stream))
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))
        self._wake.set()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self.thread.join(timeout=10)

    def _emit(self, request_id: str, event: TokenEvent) -> None:
        loop, stream, _ = self._streams[request_id]
        loop.call_soon_threadsafe(stream.put_nowait, event)

    def _loop(self) -> None:
        while not self._stop:
            while True:
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                if command[0] == "add":
                    _, request_id, prompt, sampling, arrival, loop, stream = command
                    self._streams[request_id] = (loop, stream, 0)
                    request = self.engine.add_request(prompt, sampling, request_id=request_id, arrival_time=arrival)
                    if request.error:  # the next step() hands it back too, with no stream to feed
                        self._emit(request_id, TokenEvent([], True, "rejected", request.error))
                        del self._streams[request_id]
                else:
                    aborted = self.engine.abort(command[1])
                    self._streams.pop(command[1], None)
                    if aborted is not None:
                        self._remember(aborted)
            if not self.engine.has_unfinished():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            for request in self.engine.step():
                entry = self._streams.get(request.request_id)
                if entry is None:
                    continue
                loop, stream, sent = entry
                new = request.output_token_ids[sent:]
                self._streams[request.request_id] = (loop, stream, sent + len(new))
                self._emit(request.request_id, TokenEvent(new, request.is_finished, request.finish_reason))
                if request.is_finished:
                    del self._streams[request.request_id]
                    self._remember(request)
            if self.engine.last_step is not None:
                self.step_seconds.append(self.engine.last_step[1].seconds)
            else:  # nothing schedulable right now (e.g. only rejections handed back): do not spin
                self._wake.wait(timeout=0.01)
                self._wake.clear()

    def _remember(self, request: Request) -> None:
        self.finished[request.request_id] = request
        while len(self.finished) > 10000:
            self.finished.pop(next(iter(self.finished)))


def now() -> float:
    return time.perf_counter()
