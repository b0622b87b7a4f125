"""Python's cyclic garbage collector paused while a simulated run and its summary build millions of objects,
and the heap a real-time client or server inherits kept out of its collections.

A full collection walks every live container, and a simulated trace keeps hundreds of thousands alive; none of
this code builds reference cycles, so the collector is only put off until the block ends (paused_gc). Real-engine
runs keep it on (a model's objects are not ours to reason about). A real-time client cannot pause it (hours of
streaming do build cycles), but frozen_heap() leaves what it inherited out of every collection, so a collection
inside a timed request walks only what the run allocated; `chunkbench serve` freezes its heap once the engine is
built, as vLLM does after its warm-up. What the collections cost: docs/measurements/simulator-speed.md and
docs/measurements/client.md ("Python's collector").
"""

from __future__ import annotations

import contextlib
import functools
import gc


@contextlib.contextmanager
def paused_gc(pause: bool = True):
    """Collector off inside the block (when `pause`), back to its previous state after."""
    was_enabled = gc.isenabled()
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def gc_paused(function):
    """`function` runs with the collector paused."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with paused_gc():
            return function(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def frozen_heap():
    """Everything alive at the start of the block left out of collections inside it (gc.freeze).

    CPython unfreezes everything at once, so blocks nest last in, first out: inside a block that froze first
    (an in-process server's, in tests) nothing is unfrozen at the end, and what this block froze stays frozen
    until the outer block ends."""
    was_frozen = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not was_frozen:
            gc.unfreeze()
