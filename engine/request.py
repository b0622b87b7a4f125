"""Request state as the scheduler sees it: tokens, how many are computed, and when things happened.

There is no prefill phase and no decode phase: a request is a token list whose `num_computed_tokens`
is catching up with its length. No torch here.
"""

from __future__ import annotations

import enum
import math
import numbers
from dataclasses import dataclass, field

from chunkbench.errors import ConfigError


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "finished_stopped"  # sampled EOS
    FINISHED_LENGTH = "finished_length"  # reached max_tokens
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_REJECTED = "finished_rejected"  # could never be served; see Request.error


FINISHED = frozenset(s for s in RequestStatus if s.value.startswith("finished"))


# As vLLM's SamplingParams: a temperature in (0, MIN_TEMPERATURE) is raised to it, since logits divided by
# a tiny temperature overflow to inf and the softmax turns to NaN; above MAX_TEMPERATURE (OpenAI's bound).
MIN_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 2.0


class SamplingError(ConfigError):
    """A bad sampling parameter; `param` names it (the API reports it as the error's `param`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param} {message}")
        self.param = param


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """Checked where every request enters (API, CLI, LLM), so the engine thread never sees a bad one."""

    max_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    top_k: int = 0  # 0 (or -1, as vLLM): every token; k: only the k most likely
    min_tokens: int = 0  # until this many outputs, EOS and stop_token_ids are masked out (vLLM's semantics)
    stop_token_ids: tuple[int, ...] = ()  # sampling one of these ends the request (finish "stop"), even with ignore_eos

    def __post_init__(self) -> None:
        if not _is_int(self.max_tokens):
            raise SamplingError("max_tokens", f"must be an integer, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            raise SamplingError("max_tokens", f"must be >= 1, got {self.max_tokens}")
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value):
                raise SamplingError(name, f"must be a finite number, got {value!r}")
        if not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise SamplingError("temperature", f"must be in [0, {MAX_TEMPERATURE}], got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            object.__setattr__(self, "temperature", MIN_TEMPERATURE)
        if not 0 < self.top_p <= 1:
            raise SamplingError("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not _is_int(self.seed):
            raise SamplingError("seed", f"must be an integer or null, got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise SamplingError("ignore_eos", f"must be true or false, got {self.ignore_eos!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise SamplingError("top_k", f"must be an integer >= -1 (-1 and 0: no limit), got {self.top_k!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise SamplingError(
                "min_tokens", f"must be an integer from 0 to max_tokens ({self.max_tokens}), got {self.min_tokens!r}"
            )
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise SamplingError("stop_token_ids", f"must be token ids (integers >= 0), got {self.stop_token_ids!r}")

    def masked_token_ids(self, eos_token_id: int | None) -> tuple[int, ...]:
        """The ids min_tokens keeps from being sampled: the stop ids, and EOS unless it is ignored."""
        eos = () if self.ignore_eos or eos_token_id is None else (eos_token_id,)
        return self.stop_token_ids + eos


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    eos_token_id: int | None = None
    arrival_time: float = 0.0

    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_chunks: int = 0  # prompt chunks computed since (re)admission; indexes the chunk schedule
    status: RequestStatus = RequestStatus.WAITING
    error: str | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # wall/virtual time each output token appeared
    block_hashes: list[int] = field(default_factory=list)  # prefix-cache hashes of its full blocks, filled lazily
    sample_seed: int = 0  # seed of its sampling stream, set when the scheduler takes it
    stop_reason: int | None = None  # the stop_token_ids entry that ended it (None: EOS, length, ...)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """Tokens at positions [start, end) of prompt + output, without building the whole list."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - p]

    @property
    def is_decoding(self) -> bool:
        """One uncomputed token, the last sampled one: the request needs a single-token step."""
        outputs = len(self.output_token_ids)
        return outputs > 0 and self.num_computed_tokens == len(self.prompt_token_ids) + outputs - 1

    @property
    def num_tokens_to_compute(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        # Every status but these two is a finished one (FINISHED); identity tests skip the enum's slow hash.
        return self.status is not RequestStatus.RUNNING and self.status is not RequestStatus.WAITING

    @property
    def finish_reason(self) -> str | None:
        return {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
            RequestStatus.FINISHED_REJECTED: "rejected",
        }.get(self.status)

    def append_output(self, token_id: int, now: float) -> bool:
        """Append a sampled token at time `now`; True when it finished the request (its status says why)."""
        outputs = self.output_token_ids
        outputs.append(token_id)
        self.token_times.append(now)
        sampling = self.sampling
        if len(outputs) < sampling.min_tokens:  # too early to stop on any token
            pass
        elif not sampling.ignore_eos and self.eos_token_id is not None and token_id == self.eos_token_id:
            self.status = RequestStatus.FINISHED_STOPPED
            return True
        elif token_id in sampling.stop_token_ids:
            self.status, self.stop_reason = RequestStatus.FINISHED_STOPPED, token_id
            return True
        if len(outputs) >= sampling.max_tokens:
            self.status = RequestStatus.FINISHED_LENGTH
            return True
        return False
