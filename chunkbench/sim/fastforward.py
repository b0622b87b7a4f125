"""Fast-forward through decode-only stretches: the simulator's shortcut through steps it can predict.

Most steps of a simulated run are alike: every running request decodes one token, nothing arrives, nothing
finishes, no prompt is mid-prefill. `fast_forward` runs such a stretch without the scheduler's per-step
bookkeeping, and leaves every object exactly as the step-by-step path (`LLMEngine.step`) would: the same step
costs summed in the same order, KV blocks taken and cached by the block manager's own methods in the scheduler's
order, and every other update brought up to date in bulk (run_stretch says how). The harness calls it before
every ordinary step; tests/sim/test_fast_forward.py checks that outputs are identical with it on and off. Off:
CHUNKBENCH_FAST_FORWARD=0 (or SimBackend(fast_forward=False)).
"""

from __future__ import annotations

import os
from typing import NamedTuple

from chunkbench.engine.outputs import StepRecord
from chunkbench.sim.cost_model import StepShape

MAX_STRETCH = 512  # steps per call: bounds the event lists built up front when an arrival cuts a stretch short


def enabled_by_default() -> bool:
    return os.environ.get("CHUNKBENCH_FAST_FORWARD", "1") != "0"


def fast_forward(engine, start: float, next_arrival: float, steps: list[StepRecord]) -> int:
    """Run the decode-only steps ahead, appending their records to `steps`; return how many ran (0 when the
    next step is not a pure decode step). `start` is the run's clock origin and `next_arrival` the next
    request's arrival (relative to it), as in harness.run_workload.

    A stretch ends with the step that finishes a request (its update goes through `Scheduler.advance`, as do
    those of decodes that fill a block when the prefix cache is on), before a step that would find too few free
    blocks (the scheduler preempts), and after the step that reaches the next arrival."""
    executor, scheduler = engine.executor, engine.scheduler
    if not getattr(executor, "fast_forward", False) or executor.cold or not engine.clock.virtual:
        # a cold step is scaled: ordinary path; run_stretch moves a VirtualClock's time itself
        return 0
    running = scheduler.decode_only_batch()
    if running is None:
        return 0
    batch = list(running)  # requests that finish leave scheduler.running; indices into `batch` stay valid
    plan = plan_stretch(batch, engine.block_manager, executor.SAMPLED_TOKEN, scheduler.config.max_model_len)
    if plan is None:
        return 0
    stretch = Stretch(batch, executor.SAMPLED_TOKEN)
    engine.clock.time = run_stretch(engine, plan, stretch, start, next_arrival, steps)
    for i in range(len(batch)):
        stretch.catch_up(i, len(stretch.times))
    return len(stretch.times)


class StretchPlan(NamedTuple):
    """A stretch's block events by phase (step mod block size) and each decode's first context and step count."""

    takes: list[list[int]]  # phase -> requests (batch index) taking a block before it
    first_take: list[int]  # the first step at which each request takes one
    fills: list[list[int]]  # phase -> requests whose step fills a block (to cache it)
    contexts: list[int]  # each decode's keys in the first step (its context length); +1 per step
    horizon: int  # steps at most: the last may finish requests, and the stretch ends with it
    finishers: set[int]  # requests the horizon's step finishes


def plan_stretch(batch: list, bm, sampled: int, max_len: int) -> StretchPlan | None:
    """The events of a stretch of decodes of `batch`, in one pass over it; None where a block table does not
    cover its computed tokens (never happens). Events are kept by phase because a decode takes a block every
    bs steps and fills one every bs steps: the setup costs O(running) however soon an arrival ends the
    stretch. Request's properties are inlined: this runs ~50,000 times a trace."""
    bs, tables, caching = bm.block_size, bm.block_tables, bm.enable_caching
    takes: list[list[int]] = [[] for _ in range(bs)]
    first_take = []
    fills: list[list[int]] = [[] for _ in range(bs)]
    contexts = []
    lefts = []  # steps until each request finishes (its last step may be this stretch's last)
    for i, r in enumerate(batch):
        computed, outputs = r.num_computed_tokens, len(r.output_token_ids)
        # step j computes token computed + j: from `gap` steps ahead it is past the table's end, needs a block
        gap = len(tables.get(r.request_id, ())) * bs - computed
        if gap < 0:
            return None  # never happens: a table always covers the computed tokens
        contexts.append(computed + 1)
        first_take.append(gap)
        takes[gap % bs].append(i)
        if caching:
            fills[-(computed + 1) % bs].append(i)  # computed + j + 1 becomes a multiple of bs
        sampling = r.sampling
        lefts.append(
            1
            if not sampling.ignore_eos and r.eos_token_id == sampled  # its next token stops it
            else min(sampling.max_tokens - outputs, max_len - len(r.prompt_token_ids) - outputs)
        )
    horizon = min(MAX_STRETCH, *lefts)  # the last step may finish requests: the stretch ends with it
    finishers = {i for i, left in enumerate(lefts) if left == horizon}
    return StretchPlan(takes, first_take, fills, contexts, horizon, finishers)


class Stretch:
    """The requests of a stretch and the steps applied to each so far: between block events their plain
    updates are applied in bulk (`catch_up`), always before the block manager reads them."""

    def __init__(self, batch: list, sampled: int):
        self.batch, self.sampled = batch, sampled
        self.times: list[float] = []  # each step's end: the time of the tokens it samples
        self.done = [0] * len(batch)  # steps applied to each request so far

    def catch_up(self, i: int, upto: int) -> None:
        """Apply steps done[i] .. upto-1 to batch[i], as Scheduler.advance would have one by one."""
        done = self.done
        k = upto - done[i]
        if k:
            r = self.batch[i]
            r.num_computed_tokens += k
            r.output_token_ids.extend([self.sampled] * k)
            r.token_times.extend(self.times[done[i] : upto])
            done[i] = upto


def decode_cost(cost_model, activation, n: int, contexts: list[int]):
    """(step_cost, activation bytes, first step's keys) when the cost model's decode-only step depends on the
    batch and the keys read only (the roofline's decode_step_cost, bit for bit equal to predict()): then no
    shape is built per step. (None, None, None) otherwise."""
    decode_step_cost = getattr(cost_model, "decode_step_cost", None)
    if decode_step_cost is not None and activation == getattr(cost_model, "activation_bytes", None):
        # the first step's keys: every decode reads one key more each step
        return decode_step_cost(n), cost_model.rows_activation_bytes(n, n), sum(contexts)
    return None, None, None


def run_stretch(
    engine, plan: StretchPlan, stretch: Stretch, start: float, next_arrival: float, steps: list[StepRecord]
) -> float:
    """Run the stretch's steps on a VirtualClock's time, taking and caching blocks by the real methods in the
    scheduler's order; return the time after the last (the caller sets the clock). What keeps it equal to the
    step-by-step path:

    - each step's seconds come from the same `cost_model.predict(StepShape)` call on the same shape (or, for the
      roofline, `decode_step_cost(batch)(keys)`, the same arithmetic without building the shape), and the
      virtual clock adds them one by one in step order, so the floating-point sums are the same;
    - KV blocks are taken (`BlockManager.append_block`, the one-block case of `append`) and full blocks cached
      (`Scheduler.advance`) step by step, in running order, taking blocks before the step and caching after
      it, so block ids, evictions and prefix-cache hits are the same;
    - every other update (one more computed token, one more output token and its time) is plain, so between
      those events a request's computed count, output tokens and token times are brought up to date in bulk
      (`catch_up`), always before the block manager reads them."""
    executor, scheduler, bm = engine.executor, engine.scheduler, engine.block_manager
    batch, times, sampled, catch_up = stretch.batch, stretch.times, stretch.sampled, stretch.catch_up
    takes, first_take, fills, contexts, horizon, finishers = plan
    bs = bm.block_size
    predict, activation = executor.cost_model.predict, executor.activation
    num_blocks = bm.num_blocks
    n, num_waiting = len(batch), len(scheduler.waiting)
    step_cost, step_activation, keys = decode_cost(executor.cost_model, activation, n, contexts)
    ids = [r.request_id for r in batch]
    used = num_blocks - bm.num_free  # BlockManager.num_used_blocks, kept up to date below
    now = engine.clock.time  # VirtualClock.now() and advance(), inlined (the clock is set after the loop)
    for j in range(horizon):
        phase = j % bs
        if takes[phase]:
            need = [i for i in takes[phase] if first_take[i] <= j]
            if len(need) > bm.num_free:
                break  # the scheduler would preempt in this step: let it
            for i in need:  # Scheduler._reserve (BlockManager.append of one token), in running order
                bm.append_block(ids[i])
            used = num_blocks - bm.num_free
        if step_cost is not None:
            seconds = step_cost(keys + n * j)
        else:
            shape = StepShape((), tuple([c + j for c in contexts]), n)
            seconds, step_activation = predict(shape), activation(shape)
        step_start = now
        now += seconds
        times.append(now)
        # StepRecord's fields in order: start, seconds, prefill and decode tokens, running, waiting, KV blocks
        # used, preempted, cached tokens, paused decodes, activation peak (positional: this runs every step)
        steps.append(StepRecord(step_start - start, seconds, 0, n, n, num_waiting, used, 0, 0, 0, step_activation))
        last = j == horizon - 1
        for i in sorted(finishers.union(fills[phase])) if last else fills[phase]:
            catch_up(i, j)  # Scheduler.update for a request whose token fills a block or finishes it
            scheduler.advance(batch[i], 1, True, sampled, now)
            stretch.done[i] = j + 1
        if next_arrival <= now - start:
            break  # the harness adds the request before the next step
    return now
