"""The seams between scheduler and executor (`SchedulerOutput` goes down, `StepResult` comes back) and the
record of a step (`StepRecord`) the harness keeps.

An executor sees nothing of the scheduler but a SchedulerOutput. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from .request import SamplingParams


class StepFailed(Exception):
    """A step raised after it was scheduled (its executor, or recording its result): the requests in `output`
    fail with it, and the engine can go on."""

    def __init__(self, output: SchedulerOutput, cause: Exception) -> None:
        super().__init__(f"the engine step failed: {type(cause).__name__}: {cause}")
        self.output, self.cause = output, cause


@dataclass(slots=True)  # one per request per step: built in the simulator's hot loop, so not frozen
class ScheduledChunk:
    """Tokens of one request computed in this step: positions [start_pos, start_pos + len(token_ids))."""

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]  # the request's live table: valid while this step executes
    sample: bool  # the chunk reaches the end of the request's tokens: sample the next one
    is_decode: bool
    sampling: SamplingParams
    sample_index: int  # index of the output token that will be sampled (for per-token seeding)
    sample_seed: int  # seed of this request's sampling stream

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        """Keys this chunk's last query attends to: cached context plus the chunk itself."""
        return self.start_pos + len(self.token_ids)


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens of requests admitted this step that the prefix cache held
    num_running: int = 0  # after scheduling
    num_waiting: int = 0
    num_used_blocks: int = 0
    # Running requests in decode that this step left out (a paused decode: a generation stall). Preempted
    # requests are not running, so they are counted in `preempted`, not here.
    paused_decodes: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum([len(c.token_ids) for c in self.chunks])  # a list, not a generator: every step, every chunk

    @property
    def num_decode_tokens(self) -> int:
        return sum([c.is_decode for c in self.chunks])

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_tokens

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@dataclass(frozen=True)
class StepResult:
    sampled: dict[str, int]  # request id -> token id, for every chunk with sample=True
    seconds: float  # the step's duration: measured (device-synchronized) or predicted
    activation_bytes: int = 0  # peak activation memory of the step (engine/activation.py; measured on CUDA)


class Executor(Protocol):
    """Runs steps: the real model (engine/executor.py) or the simulator (chunkbench/sim/executor.py)."""

    num_blocks: int  # KV blocks this executor holds; the block manager hands out exactly these

    def execute(self, output: SchedulerOutput) -> StepResult: ...

    def idle(self, seconds: float) -> None:
        """The engine sat idle this long before the next step (the simulator runs that step cold)."""


class StepRecord(NamedTuple):
    """One engine step. A tuple: hundreds of thousands per simulated trace, turned into one numpy table
    (step_table) by a single C-level pass."""

    start: float
    seconds: float
    prefill_tokens: int
    decode_tokens: int
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    num_preempted: int = 0
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied to requests admitted in this step
    num_paused_decodes: int = 0  # running requests in decode this step left out
    peak_activation_bytes: int = 0  # the step's activation peak (engine/activation.py; measured on CUDA)
