"""Fast-forward through decode-only stretches: the simulator's shortcut through steps it can predict.

Most steps of a simulated run are alike: every running request decodes one token, nothing arrives, nothing
finishes, no prompt is mid-prefill. `fast_forward` runs such a stretch without the scheduler's per-step
bookkeeping, and leaves every object exactly as the step-by-step path (`LLMEngine.step`) would:

- each step's seconds come from the same `cost_model.predict(StepShape)` call on the same shape (or, for the
  roofline, `decode_step_cost(batch)(keys)`, the same arithmetic without building the shape), and the
  virtual clock adds them one by one in step order, so the floating-point sums are the same;
- KV blocks are taken (`BlockManager.append_block`, the one-block case of `append`) and full blocks cached
  (`BlockManager.computed`) by the real methods in the scheduler's order: step by step, in running order,
  taking blocks before the step and caching after it, so block ids, evictions and prefix-cache hits are the same;
- every other update (one more computed token, one more output token and its time) is plain, so between
  those events a request's computed count, output tokens and token times are brought up to date in
  bulk (`catch_up`), always before the block manager reads them.

A stretch ends with the step that finishes a request (its update goes through `Scheduler.advance`, as do
those of decodes that fill a block when the prefix cache is on), before a step that would find too few free
blocks (the scheduler preempts), and after the step that reaches the next arrival. The harness calls
it before every ordinary step; it returns 0 when the next step is not a pure decode step.
tests/sim/test_fast_forward.py checks that outputs are identical with it on and off. Off: CHUNKBENCH_FAST_FORWARD=0
(or SimBackend(fast_forward=False)).
"""

from __future__ import annotations

import os

from chunkbench.metrics import StepRecord
from chunkbench.sim.shape import StepShape

MAX_STRETCH = 512  # steps per call: bounds the event lists built up front when an arrival cuts a stretch short


def enabled_by_default() -> bool:
    return os.environ.get("CHUNKBENCH_FAST_FORWARD", "1") != "0"


def fast_forward(engine, start: float, next_arrival: float, steps: list[StepRecord]) -> int:
    """Run the decode-only steps ahead, appending their records to `steps`; return how many ran. `start` is
    the run's clock origin and `next_arrival` the next request's arrival (relative to it), as in
    harness.run_workload."""
    executor, scheduler = engine.executor, engine.scheduler
    if not getattr(executor, "fast_forward", False) or executor.cold or not engine.clock.virtual:
        # a cold step is scaled: ordinary path; the loop below moves a VirtualClock's time itself
        return 0
    running = scheduler.decode_only_batch()
    if running is None:
        return 0
    batch = list(running)  # requests that finish leave scheduler.running; indices into `batch` stay valid
    sampled = executor.SAMPLED_TOKEN
    max_len = scheduler.config.max_model_len
    bm = engine.block_manager
    bs, tables, caching = bm.block_size, bm.block_tables, bm.enable_caching
    # A decode takes a block every bs steps and fills one every bs steps, so events are kept by phase (step
    # mod bs), in running order: the setup costs O(running) however soon an arrival ends the stretch. One
    # pass over the batch, attributes read once (Request's properties inlined: this runs ~50,000 times a trace).
    takes: list[list[int]] = [[] for _ in range(bs)]  # phase -> requests (batch index) taking a block before it
    first_take = []  # the first step at which each request takes one
    fills: list[list[int]] = [[] for _ in range(bs)]  # phase -> requests whose step fills a block (to cache it)
    contexts = []  # each decode's keys in the first step (its context length); +1 per step
    lefts = []  # steps until each request finishes (its last step may be this stretch's last)
    for i, r in enumerate(batch):
        computed, outputs = r.num_computed_tokens, len(r.output_token_ids)
        # step j computes token computed + j: from `gap` steps ahead it is past the table's end, needs a block
        gap = len(tables.get(r.request_id, ())) * bs - computed
        if gap < 0:
            return 0  # never happens: a table always covers the computed tokens
        contexts.append(computed + 1)
        first_take.append(gap)
        takes[gap % bs].append(i)
        if caching:
            fills[-(computed + 1) % bs].append(i)  # computed + j + 1 becomes a multiple of bs
        sampling = r.sampling
        lefts.append(1 if not sampling.ignore_eos and r.eos_token_id == sampled  # its next token stops it
                     else min(sampling.max_tokens - outputs, max_len - len(r.prompt_token_ids) - outputs))
    horizon = min(MAX_STRETCH, *lefts)  # the last step may finish requests: the stretch ends with it
    finishers = {i for i, left in enumerate(lefts) if left == horizon}

    times: list[float] = []  # each step's end: the time of the tokens it samples
    done = [0] * len(batch)  # steps applied to each request so far

    def catch_up(i: int, upto: int) -> None:
        """Apply steps done[i] .. upto-1 to batch[i], as Scheduler.advance would have one by one."""
        k = upto - done[i]
        if k:
            r = batch[i]
            r.num_computed_tokens += k
            r.output_token_ids.extend([sampled] * k)
            r.token_times.extend(times[done[i]:upto])
            done[i] = upto

    clock, predict, activation = engine.clock, executor.cost_model.predict, executor.activation
    num_blocks = bm.num_blocks
    n, num_waiting = len(batch), len(scheduler.waiting)
    # A cost model whose decode-only step depends on the batch and the keys read only (the roofline) says so
    # with decode_step_cost, bit for bit equal to predict(): then no shape is built per step.
    decode_step_cost = getattr(executor.cost_model, "decode_step_cost", None)
    step_cost = None  # seconds of a step of this batch as a function of its keys, when the cost model has one
    if decode_step_cost is not None and activation == getattr(executor.cost_model, "activation_bytes", None):
        step_cost = decode_step_cost(n)
        step_activation = executor.cost_model.rows_activation_bytes(n, n)
        keys = sum(contexts)  # the first step's; every decode reads one key more each step
    ids = [r.request_id for r in batch]
    used = num_blocks - bm.num_free  # BlockManager.num_used_blocks, kept up to date below
    now = clock.time  # VirtualClock.now() and advance(), inlined (the clock is set after the loop)
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
            done[i] = j + 1
        if next_arrival <= now - start:
            break  # the harness adds the request before the next step
    clock.time = now
    for i in range(n):
        catch_up(i, len(times))
    return len(times)
