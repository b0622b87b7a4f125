"""The engine in a background thread, fed by asyncio callers: what `chunkbench serve` stands on.

Callers submit a request and read its events from an asyncio queue. What callers ask of the engine goes to its
thread as commands (AddRequest, Abort), run between steps. Torch releases the GIL inside its kernels, so the
event loop keeps serving HTTP while a step runs.

The loop is supervised: a step that raises after it was scheduled is a StepFailed, which fails the requests it
carried (their queues get an error event) and frees their KV blocks, and the loop goes on. If the loop itself
cannot go on (the scheduler raised, or steps keep failing), every waiting caller gets an error, `dead` says why,
and later submissions fail at once, so nothing hangs on a queue no one will feed.

Prometheus metrics are recorded from the engine thread (chunkbench/serving/engine_stats.py).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass

from chunkbench.engine.engine import LLMEngine
from chunkbench.engine.outputs import StepFailed
from chunkbench.engine.request import Request, RequestStatus, SamplingParams
from chunkbench.serving.engine_stats import EngineStats


@dataclass
class TokenEvent:
    token_ids: list[int]
    finished: bool
    finish_reason: str | None = None  # "rejected": a bad request; "error": the engine failed it
    error: str | None = None
    stop_reason: int | None = None  # the stop_token_ids entry that ended it


@dataclass
class Caller:
    """Where a request's events go: an asyncio queue, filled on the event loop that reads it."""

    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    sent: int = 0  # output tokens handed over so far

    def send(self, event: TokenEvent) -> bool:
        """Hand the event over; False when the caller's event loop is closed (no one is listening)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:
            return False
        return True


@dataclass(frozen=True)
class AddRequest:
    """A command to the engine thread: add this request, its events to `caller`."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival_time: float
    caller: Caller


@dataclass(frozen=True)
class Abort:
    """A command to the engine thread: stop this request. With `keep_tokens`, the server ended it (a stop string
    in that many tokens): it finishes as stopped with those tokens, as vLLM counts it, not as aborted."""

    request_id: str
    keep_tokens: int | None = None


class AsyncEngine:
    MAX_CONSECUTIVE_FAILURES = 8  # failed steps in a row before the loop gives up (a broken device)

    def __init__(self, engine: LLMEngine, model_name: str | None = None) -> None:
        self.engine = engine
        self.stats = EngineStats(model_name or engine.config.model.name, engine.config.scheduler.max_model_len)
        self._commands: queue.Queue[AddRequest | Abort] = queue.Queue()
        self._callers: dict[str, Caller] = {}
        self._wake = threading.Event()
        self._stop = False
        self._failures = 0
        self.dead: str | None = None  # why the loop stopped for good
        self.finished: dict[str, Request] = {}  # recent finished requests, for their server-side timings
        self.thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self.thread.start()

    @property
    def healthy(self) -> bool:
        return self.dead is None and self.thread.is_alive()

    def submit(
        self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams, arrival_time: float
    ) -> asyncio.Queue:
        """Queue the request; its TokenEvents arrive on the returned queue, the last one `finished`."""
        events: asyncio.Queue = asyncio.Queue()
        if not self.healthy:
            events.put_nowait(TokenEvent([], True, "error", f"the engine is not running: {self.dead}"))
            return events
        self._send(
            AddRequest(request_id, prompt_token_ids, sampling, arrival_time, Caller(asyncio.get_running_loop(), events))
        )
        if not self.healthy:  # it died while we queued: its last act may have missed our command
            self._fail_queued_commands()
        return events

    def abort(self, request_id: str, keep_tokens: int | None = None) -> None:
        """Stop the request (see Abort for `keep_tokens`)."""
        self._send(Abort(request_id, keep_tokens))

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self.thread.join(timeout=10)

    def _send(self, command: AddRequest | Abort) -> None:
        self._commands.put(command)
        self._wake.set()

    def _emit(self, request_id: str, event: TokenEvent) -> None:
        """Hand an event to the request's caller; the last one (finished) also drops the caller."""
        caller = self._callers.pop(request_id) if event.finished else self._callers[request_id]
        if not caller.send(event):
            self._callers.pop(request_id, None)

    def _fail(self, request_id: str, message: str) -> None:
        if request_id in self._callers:
            self._emit(request_id, TokenEvent([], True, "error", message))

    # ---- the engine thread ----

    def _loop(self) -> None:
        try:
            while not self._stop:
                self._run_commands()
                if not self.engine.has_unfinished():
                    self._idle(0.5)
                    continue
                try:
                    updated = self._step()
                except StepFailed as failure:
                    self._step_failed(failure)
                    continue
                self._failures = 0
                self._publish(updated)
        except BaseException as exc:  # noqa: BLE001 - anything that stops the loop must fail its callers
            self.dead = f"{type(exc).__name__}: {exc}"
            self._fail_everything(f"the engine stopped: {self.dead}")

    def _idle(self, seconds: float) -> None:
        """Wait up to `seconds` for a command."""
        self._wake.wait(timeout=seconds)
        self._wake.clear()

    def _drain(self):
        """The queued commands, taken one at a time until none is left."""
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def _run_commands(self) -> None:
        for command in self._drain():
            if isinstance(command, AddRequest):
                self._add(command)
            else:
                self._abort(command)

    def _add(self, command: AddRequest) -> None:
        self._callers[command.request_id] = command.caller
        try:
            request = self.engine.add_request(
                command.prompt_token_ids,
                command.sampling,
                request_id=command.request_id,
                arrival_time=command.arrival_time,
            )
        except Exception as exc:  # noqa: BLE001 - this request fails, not the loop
            self._fail(command.request_id, f"could not add the request: {type(exc).__name__}: {exc}")
            return
        if request.error:  # the next step() hands it back too, with no caller to feed
            self._emit(command.request_id, TokenEvent([], True, "rejected", request.error))

    def _abort(self, command: Abort) -> None:
        aborted = self.engine.abort(command.request_id)
        self._callers.pop(command.request_id, None)
        if aborted is None:
            return
        if command.keep_tokens is not None:
            aborted.status = RequestStatus.FINISHED_STOPPED
            del aborted.output_token_ids[command.keep_tokens :], aborted.token_times[command.keep_tokens :]
        self._remember(aborted)

    def _step(self) -> list[Request]:
        """One engine step: the requests it updated. A step that raised after it was scheduled is a StepFailed
        (engine/outputs.py); anything else it raises (the scheduler failed) stops the loop."""
        return self.engine.step()

    def _publish(self, updated: list[Request]) -> None:
        """Hand each updated request's new tokens to its caller, and record the step."""
        for request in updated:
            caller = self._callers.get(request.request_id)
            if caller is None or request.error:
                continue
            new = request.output_token_ids[caller.sent :]
            if caller.sent == 0 and new:
                self.stats.prompt_tokens.inc(request.num_prompt_tokens)
            self.stats.generation_tokens.inc(len(new))
            caller.sent += len(new)
            if request.is_finished:  # before its caller hears of it: a reply may be read as soon as it is sent
                self._remember(request)
            self._emit(
                request.request_id,
                TokenEvent(new, request.is_finished, request.finish_reason, stop_reason=request.stop_reason),
            )
        if self.engine.last_step is not None:
            self.stats.record_step(*self.engine.last_step)
        else:  # nothing schedulable right now (e.g. only rejections handed back): do not spin
            self._idle(0.01)

    def _step_failed(self, failure: StepFailed) -> None:
        """Fail the requests the step carried; aborting them frees their KV blocks. Steps failing
        MAX_CONSECUTIVE_FAILURES times in a row stop the loop, with the last one's cause."""
        self._failures += 1
        if self._failures >= self.MAX_CONSECUTIVE_FAILURES:
            raise failure.cause
        self.stats.step_failures.inc()
        for chunk in failure.output.chunks:
            request = self.engine.abort(chunk.request_id)
            if request is not None:
                self._remember(request, record=False)  # not a success, so not in vllm:request_success
            self._fail(chunk.request_id, str(failure))

    def _fail_everything(self, message: str) -> None:
        for request_id in list(self.engine.scheduler.requests):
            try:
                self.engine.abort(request_id)
            except Exception:  # noqa: BLE001 - free what can be freed; the callers hear of it below
                pass
        for request_id in list(self._callers):
            self._fail(request_id, message)
        self._fail_queued_commands()

    def _fail_queued_commands(self) -> None:
        for command in self._drain():
            if isinstance(command, AddRequest):
                command.caller.send(TokenEvent([], True, "error", f"the engine is not running: {self.dead}"))

    def _remember(self, request: Request, record: bool = True) -> None:
        if record:
            self.stats.record_finished(request, self.engine.clock.now())
        self.finished[request.request_id] = request
        while len(self.finished) > 10000:
            self.finished.pop(next(iter(self.finished)))


def now() -> float:
    return time.perf_counter()
