"""The Optuna study behind `chunkbench tune`: TPE (or NSGA-II for pareto) over the search space, SLAs as
constraints, on RDB storage (SQLite beside the outputs, or PostgreSQL shared by several machines).

Several processes may work on one study (`--storage postgresql://...`): a lock held from "how many trials
are done or running?" until the new trial exists keeps the total exactly `n_trials`. Trials record
heartbeats, so one left RUNNING by a killed process is failed after a grace period and replaced; so is one
whose process died between creating it and its first heartbeat (Optuna never sees those as stale).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import math
import os
import socket
import threading
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import sqlalchemy
from optuna.trial import TrialState

from chunkbench.bench.slo import SLO
from chunkbench.errors import ConfigError, Interrupted, StudyFailed, UserError
from chunkbench.launch.process import STOPPING, LaunchError, check_not_stopping
from chunkbench.launch.slots import SlotRun, slot_backends
from chunkbench.tune.objectives import OBJECTIVES, Objective, evaluate, get
from chunkbench.tune.space import engine_kwargs
from chunkbench.tune.spec import TuneSpec
from chunkbench.workloads.spec import build_workload

HEARTBEAT_S, GRACE_S = 2, 8
LAUNCH_FAILURES_IN_A_ROW = 3
# What fails one configuration, not the study: a config the engine refuses, out of memory, a server that
# does not come up.
TRIAL_FAILURES = (ConfigError, RuntimeError, MemoryError, ValueError)

# Processes opening a new database at once race to create Optuna's tables; the losers see these. Retry.
SCHEMA_RACE = ("already exists", "database is locked", "duplicate key", "UNIQUE constraint failed")


def open_storage(url: str, attempts: int = 5) -> optuna.storages.RDBStorage:
    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeat_interval
                return optuna.storages.RDBStorage(
                    url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S, engine_kwargs={"pool_pre_ping": True}
                )
        except Exception as exc:  # sqlalchemy raises many kinds for a bad or unreachable URL
            if attempt + 1 < attempts and any(s in str(exc) for s in SCHEMA_RACE):
                time.sleep(0.2 * (attempt + 1))
                continue
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"--storage: cannot open {url.split('@')[-1]}: {first}") from None


def is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    return max(trial.constraints.values(), default=0.0) <= 0


def create_study(spec: TuneSpec, name: str, storage: optuna.storages.RDBStorage, worker: int = 0) -> optuna.Study:
    # Distinct processes on one study (`worker`: --jobs) sample differently, else they would ask the same points.
    seed = spec.seed + zlib.crc32(name.encode()) + 1_000_003 * worker
    objective = get(spec.objective)
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        sampler=objective.sampler(spec, seed),
        directions=list(objective.directions),
        load_if_exists=True,
    )
    stored = study.user_attrs.get("objective")
    if stored and stored != spec.objective:
        raise UserError(f"--study {name}: it was created with --objective {stored}, not {spec.objective}")
    study.set_user_attr("objective", spec.objective)
    study.set_user_attr("model", spec.model)
    study.set_user_attr("slos", [str(s) for s in spec.slos])
    study.set_user_attr("slo_limits", {s.name: s.limit_ms for s in spec.slos})
    return study


@contextlib.contextmanager
def study_lock(url: str, name: str):
    """Serialise 'count trials, create one' across processes: a file lock beside a SQLite database, a
    PostgreSQL advisory lock for a server. Other databases are not locked (the total may overshoot by one
    per extra process)."""
    if url.startswith("sqlite:///"):
        with open(url.removeprefix("sqlite:///") + ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
    elif url.startswith("postgresql"):
        engine = sqlalchemy.create_engine(url)
        key = zlib.crc32(f"chunkbench/{name}".encode())
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
            try:
                yield
            finally:
                connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        engine.dispose()
    else:
        yield


class _Heartbeat(threading.Thread):
    def __init__(self, storage: optuna.storages.RDBStorage, trial_id: int) -> None:
        super().__init__(daemon=True)
        self.storage, self.trial_id, self.stopped = storage, trial_id, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            self.storage.record_heartbeat(self.trial_id)


def run_study(
    spec: TuneSpec,
    study: optuna.Study,
    storage: optuna.storages.RDBStorage,
    url: str,
    on_trial=None,
    out: Path | None = None,
) -> None:
    """Run trials until the study holds `n_trials` complete ones (counting all processes), or the timeout,
    one trial loop per launch slot (launch/slots.py). A launched server's output is kept in
    out/trials/<n>/launch.log. LAUNCH_FAILURES_IN_A_ROW launches in a row that never come up end the study
    (StudyFailed): a broken --launch template, or a port held by another server, fails every trial alike."""
    workload_max_len = spec.base_config().scheduler.max_model_len
    loop = _TrialLoop(
        spec,
        study,
        storage,
        url,
        build_workload(spec.workload, workload_max_len),
        workload_max_len,
        time.monotonic() + spec.timeout_s if spec.timeout_s else None,
        on_trial,
        out,
        SlotRun(slot_backends(spec.backend)),
    )
    with warnings.catch_warnings():
        # We drive trials with ask/tell and record heartbeats ourselves (see _Heartbeat), which Optuna flags.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        loop.slots.map([loop.run] * len(loop.slots.backends))


def fail_orphaned_trials(study: optuna.Study, storage: optuna.storages.RDBStorage) -> None:
    """Fail RUNNING trials no process will finish: Optuna's stale-heartbeat check, plus trials older than the
    grace period that never recorded a heartbeat (their process was killed right after `ask`). Without the
    second, such a trial counts as running forever and the study never reaches `n_trials`."""
    optuna.storages.fail_stale_trials(study)
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if not running:
        return
    query = sqlalchemy.text("SELECT trial_id FROM trial_heartbeats WHERE trial_id IN :ids").bindparams(
        sqlalchemy.bindparam("ids", expanding=True)
    )
    with storage.engine.connect() as connection:
        beating = {row[0] for row in connection.execute(query, {"ids": [t._trial_id for t in running]})}
    now = datetime.datetime.now()
    for trial in running:
        if trial._trial_id not in beating and (now - trial.datetime_start).total_seconds() > GRACE_S:
            storage.set_trial_user_attr(trial._trial_id, "error", "its process died before its first heartbeat")
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)


@dataclass
class _TrialLoop:
    """Trials drawn from the study, one at a time per slot, until it holds enough."""

    spec: TuneSpec
    study: optuna.Study
    storage: optuna.storages.RDBStorage
    url: str
    workload: list
    workload_max_len: int
    deadline: float | None
    on_trial: Callable[[optuna.Study], None] | None
    out: Path | None
    slots: SlotRun
    failed_launches: int = 0  # in a row, over this process's slots
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_trial(self) -> optuna.Trial | None | bool:
        """A new trial; None while the rest run elsewhere; False when the study is done."""
        with study_lock(self.url, self.study.study_name):
            fail_orphaned_trials(self.study, self.storage)
            states = [t.state for t in self.study.get_trials(deepcopy=False)]
            complete, running = states.count(TrialState.COMPLETE), states.count(TrialState.RUNNING)
            if complete >= self.spec.n_trials or len(states) >= 3 * self.spec.n_trials:  # done, or crashes
                return False
            trial = self.study.ask() if complete + running < self.spec.n_trials else None
            if trial is not None:  # a trial with no heartbeat is never seen as stale if this process dies
                self.storage.record_heartbeat(trial._trial_id)
            return trial

    def run(self, backend) -> None:
        while not self.slots.stopping.is_set() and (self.deadline is None or time.monotonic() < self.deadline):
            check_not_stopping()
            trial = self.next_trial()
            if trial is False:
                return
            if trial is None:  # the rest are running elsewhere: wait for them to finish or go stale
                time.sleep(1.0)
                continue
            self.run_trial(trial, backend)

    def run_trial(self, trial: optuna.Trial, backend) -> None:
        spec, out = self.spec, self.out
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        slot = getattr(backend, "slot", None)
        if slot is not None:
            trial.set_user_attr("slot", str(slot))
        heartbeat = _Heartbeat(self.storage, trial._trial_id)
        heartbeat.start()
        log = out / "trials" / str(trial.number) / "launch.log" if out and spec.backend.relaunched else None
        if log:
            trial.set_user_attr("launch_log", str(log))
        try:
            point = spec.space.params(trial.suggest_categorical)
            outcome = evaluate(
                spec,
                engine_kwargs(point, self.workload_max_len),
                self.workload,
                backend=backend,
                capacity_hint=_best_capacity(self.study.get_trials(deepcopy=False)),
                log=log,
            )
            if self.slots.interrupted.is_set():
                raise Interrupted()
            check_not_stopping()  # a run that ended as the signal came: its figures are not counted either
        except KeyboardInterrupt:  # its server was stopped under it: not a result
            trial.set_user_attr("error", "interrupted (SIGINT or SIGTERM): not counted")
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        except TRIAL_FAILURES as exc:
            interrupted = self.slots.interrupted.is_set() or STOPPING.is_set()
            trial.set_user_attr(
                "error",
                "interrupted (SIGINT or SIGTERM): not counted"
                if interrupted
                else f"{type(exc).__name__}: {exc}"[:1000],
            )
            self.study.tell(trial, state=TrialState.FAIL)
            with self.lock:
                self.failed_launches = self.failed_launches + 1 if isinstance(exc, LaunchError) else 0
                failed = self.failed_launches
            if failed >= LAUNCH_FAILURES_IN_A_ROW and not interrupted:
                raise StudyFailed(
                    f"{failed} launched servers in a row never became healthy or could not be "
                    f"trusted, so the study stops (fix --launch and run again to resume); the "
                    f"last, trial {trial.number}: {exc}"
                ) from None
            return
        finally:
            heartbeat.stopped.set()
        with self.lock:
            self.failed_launches = 0
        for name, value in outcome.constraints.items():  # the samplers read these (Optuna's constraints)
            trial.set_constraint(name, value)
        trial.set_user_attr("metrics", outcome.metrics)
        trial.set_user_attr("knobs", {k: list(v) if isinstance(v, tuple) else v for k, v in outcome.knobs.items()})
        self.study.tell(trial, outcome.values if len(outcome.values) > 1 else outcome.values[0])
        if self.on_trial:
            self.on_trial(self.study)


def _best_capacity(trials: list[optuna.trial.FrozenTrial]) -> float | None:
    """The highest capacity a complete trial has found: where the next capacity search starts (the search's
    steps are finest near it, and the best configurations are the ones worth resolving)."""
    found = [
        t.user_attrs["metrics"]["capacity_rps"]
        for t in trials
        if t.state == TrialState.COMPLETE and t.user_attrs.get("metrics", {}).get("capacity_rps")
    ]
    return max(found, default=None)


def feasible_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Complete trials meeting every SLO, best first (pareto: the feasible front, by its headline, throughput)."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if is_feasible(t)]
    objective = study_objective(study)
    if objective is not None and objective.multi:
        front = {t.number for t in study.best_trials}
        done = [t for t in done if t.number in front] or done
        return sorted(done, key=lambda t: -t.values[objective.headline])
    # Equal goodput is common once every request meets the SLAs: prefer the most headroom.
    limits = study.user_attrs.get("slo_limits", {})
    return sorted(done, key=lambda t: (-round(t.values[0], 9), headroom(t.constraints, limits), t.number))


def study_objective(study: optuna.Study) -> Objective | None:
    """The objective a study was created with (the name create_study stored); None for a study it did not
    create (one value, best first)."""
    name = study.user_attrs.get("objective")
    return get(name) if name in OBJECTIVES else None


def headroom(constraints: dict[str, float], limits: dict[str, float]) -> float:
    """The worst-case ratio of an SLA metric to its limit (constraints are metric minus limit): lower is more."""
    return max(((v + limits[k]) / limits[k] for k, v in constraints.items() if k in limits), default=0.0)


def closest_trials(study: optuna.Study, slos: list[SLO]) -> list[optuna.trial.FrozenTrial]:
    """The complete trials by their worst SLO miss (relative to its limit), smallest first; equal misses by the
    objective (a single one: goodput or capacity, higher first)."""
    limits = {s.name: s.limit_ms for s in slos}

    def key(t: optuna.trial.FrozenTrial) -> tuple[float, float]:
        v = t.values[0] if len(t.values) == 1 else None
        return headroom(t.constraints, limits), -v if v is not None and not math.isnan(v) else math.inf

    return sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=key)


def closest_trial(study: optuna.Study, slos: list[SLO]) -> optuna.trial.FrozenTrial | None:
    """When nothing is feasible: the complete trial whose worst SLO miss is smallest."""
    return next(iter(closest_trials(study, slos)), None)
