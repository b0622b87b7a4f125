"""Launched work spread over a node's slots (`tune --backend launch --slots N`): one thread per slot, each
with the slot's own backend (its port, GPUs or cores), taking jobs from one queue, so that at most one server
runs in a slot at a time and every slot stays busy while work is left.

Threads, not processes: a slot's work is waiting, on a server to come up and on its HTTP responses. The main
thread only waits; on SIGINT or SIGTERM (chunkbench/cli.py stops every server this process launched) it marks
the run as interrupted, gives the slots a few seconds to record their trials as interrupted, and raises.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from chunkbench.bench.backend import Backend
from chunkbench.launch.process import check_not_stopping, stop_all_servers

T = TypeVar("T")
JOIN_S = 5.0  # after an interrupt: how long the slots get to record their trials as interrupted


def slot_backends(backend: Backend) -> list[Backend]:
    """One backend per slot: a LaunchBackend's slots (`slots`), else the backend alone."""
    return list(getattr(backend, "slots", None) or [backend])


class SlotRun:
    """One run of jobs over slots. `stopping`: start no new job (a job failed the study, or an interrupt);
    `interrupted`: the servers were stopped under the jobs in flight, whose figures do not count."""

    def __init__(self, backends: Sequence[Backend]) -> None:
        self.backends = list(backends)
        self.stopping = threading.Event()
        self.interrupted = threading.Event()

    def map(self, jobs: Sequence[Callable[[Backend], T]], slots: Sequence[int] | None = None) -> list[T]:
        """Run each job on the first free slot's backend, or on slot `slots[i]` when given; results in the jobs'
        order. One slot: in this thread. The first exception a job raises stops the others from starting and
        is raised here."""
        if len(self.backends) == 1 or (len(jobs) <= 1 and not slots):
            return [job(self.backends[slots[i] if slots else 0]) for i, job in enumerate(jobs)]
        shared: queue.Queue = queue.Queue()
        own = [queue.Queue() for _ in self.backends]
        for index, job in enumerate(jobs):
            (own[slots[index]] if slots else shared).put((index, job))
        results: dict[int, T] = {}
        errors: list[BaseException] = []

        def slot(number: int, backend: Backend) -> None:
            while not self.stopping.is_set():
                try:
                    index, job = (own[number] if slots else shared).get_nowait()
                except queue.Empty:
                    return
                try:
                    results[index] = job(backend)
                except BaseException as exc:  # noqa: BLE001 -- handed to the main thread, which raises it
                    errors.append(exc)
                    self.stopping.set()
                    return

        threads = [
            threading.Thread(target=slot, args=(i, b), daemon=True, name=f"slot-{i}")
            for i, b in enumerate(self.backends[: len(jobs)] if not slots else self.backends)
        ]
        for thread in threads:
            thread.start()
        try:
            while any(t.is_alive() for t in threads):
                for thread in threads:
                    thread.join(timeout=0.2)
                check_not_stopping()  # SIGINT/SIGTERM stopped the servers (launch.process.stop_everything)
        except KeyboardInterrupt:
            self.interrupted.set()
            self.stopping.set()
            stop_all_servers()
            for thread in threads:
                thread.join(timeout=JOIN_S / len(threads))
            raise
        if errors:
            raise errors[0]
        return [results[i] for i in range(len(jobs))]
