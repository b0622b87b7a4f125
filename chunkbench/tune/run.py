"""The `tune` command's work: open the study, run trials with a progress bar, verify, write the outputs."""

from __future__ import annotations

import math
import multiprocessing
import re
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from chunkbench.backends.engine import EngineBackend
from chunkbench.errors import StudyFailed, show_warning
from chunkbench.files import write_json
from chunkbench.launch.process import check_not_stopping, stopping_wins
from chunkbench.tune.objectives import evaluate, get
from chunkbench.tune.report import add_runs_to_csv, outputs, write_outputs
from chunkbench.tune.report_text import results_table
from chunkbench.tune.settle import (
    confirm_winner,
    confirmation_section,
    print_settled,
    settle_top,
    settled_section,
)
from chunkbench.tune.spec import TuneSpec
from chunkbench.tune.study import create_study, feasible_trials, open_storage, run_study
from chunkbench.tune.verify import VERIFY_REPEATS, State, best_distinct, verify_top
from chunkbench.tune.verify_report import add_to_report, print_remeasured, verified_section
from chunkbench.workloads.spec import build_workload

console = Console()
VERIFIED_FILE = "verified.json"  # --backend launch: the re-measured configurations (resume)


@dataclass
class Remeasured:
    """What a tune measured again after its search."""

    by_trial: dict[int, dict] = field(default_factory=dict)  # figures by trial: the results table's column
    rows: list[dict] = field(default_factory=list)  # the re-measured configurations, best first
    settled: list[dict] = field(default_factory=list)  # those settled on long runs (a simulated capacity)
    against: str = "one run"  # what the rows are compared with in the report: "one run" or "simulated"


def study_folder(name: str) -> Path:
    """results/tune/<study>, with anything but letters, digits, '.', '_' and '-' replaced: a study name is
    text, never a path (`../../x` stays inside results/tune)."""
    return Path("results/tune") / (re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "study")


def no_trial_completed(study: optuna.Study) -> None:
    """A study that ended with failed trials and none complete has nothing to recommend: StudyFailed (exit 1)
    with the last failure, never an empty table read as an SLA miss."""
    trials = study.get_trials(deepcopy=False)
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    if failed and not any(t.state == optuna.trial.TrialState.COMPLETE for t in trials):
        raise StudyFailed(
            f"no trial completed ({len(failed)} failed); the last, trial {failed[-1].number}: "
            f"{failed[-1].user_attrs.get('error', 'no error recorded')}"
        )


def _worker(spec: TuneSpec, name: str, url: str, worker: int, out: Path) -> None:
    """One more process on the study (--jobs): trials until the study holds n_trials, counted over all."""
    warnings.showwarning = show_warning  # a spawned process starts with Python's format
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(url)
    run_study(spec, create_study(spec, name, storage, worker), storage, url, out=out)


def confirm_best(spec: TuneSpec, study: optuna.Study, remeasured: list[dict], progress: bool, deadline: float):
    """The winner's capacity confirmed on a longer run (tune/settle.py), or None (also past --timeout, said)."""
    if remeasured:
        row = remeasured[0] if remeasured[0]["feasible"] else None
        chosen = None if row is None else (row["trial"], study.trials[row["trial"]].user_attrs["knobs"], row["metrics"])
    else:
        best = feasible_trials(study)
        chosen = (best[0].number, best[0].user_attrs["knobs"], best[0].user_attrs["metrics"]) if best else None
    if chosen is None:
        return None
    if time.monotonic() > deadline:
        if hasattr(get(spec.objective), "confirm"):
            console.print("[yellow]--timeout reached: the winner's capacity was not confirmed on a longer run[/]")
        return None
    if progress:
        console.print(f"confirming trial {chosen[0]}'s capacity on a longer run ...")
    return confirm_winner(spec, *chosen)


@stopping_wins()
def tune_and_report(
    spec: TuneSpec,
    name: str,
    storage_url: str | None,
    out: Path | None,
    verify: int,
    progress: bool = True,
    command: str = "chunkbench tune",
    jobs: int = 1,
    backend_note: str | None = None,
    repeats: int = VERIFY_REPEATS,
) -> Path:
    """Run the study; then re-measure its best: on the real engine (`verify` trials, a simulated search), or
    relaunched `repeats` times each (`verify` distinct configurations, --backend launch, where the winner is
    then picked on those measurements; not for pareto, whose front has no one winner). SIGINT/SIGTERM in any
    phase raises Interrupted before anything is written (stopping_wins); finished trials and re-measurements
    are kept for the resumed tune."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    deadline = time.monotonic() + spec.timeout_s if spec.timeout_s else math.inf  # --timeout bounds the end too
    out = out or study_folder(name)
    if storage_url is None:
        out.mkdir(parents=True, exist_ok=True)
        storage_url = f"sqlite:///{out / 'study.db'}"
    storage = open_storage(storage_url)  # an unreachable server fails here, before anything is written
    study = create_study(spec, name, storage)
    out.mkdir(parents=True, exist_ok=True)
    done_before = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    if done_before:
        console.print(f"resuming study '{name}': {done_before} complete trials kept")
    bar = Progress(
        TextColumn("[bold]tuning"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[best]}"),
        TimeElapsedColumn(),
        disable=not progress,
        console=console,
    )
    with bar:
        task = bar.add_task("tune", total=spec.n_trials, completed=done_before, best="")

        def on_trial(s: optuna.Study) -> None:
            complete = len(s.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
            best = feasible_trials(s)
            label = f"best feasible: trial {best[0].number}, {best[0].values[0]:.3f}" if best else "none feasible yet"
            bar.update(task, completed=complete, best=label)

        # --jobs: more processes on the same storage; study_lock keeps the trial count exact. spawn, not fork:
        # this process already holds database connections and threads.
        context = multiprocessing.get_context("spawn")
        workers = [
            context.Process(target=_worker, args=(spec, name, storage_url, w, out), daemon=True) for w in range(1, jobs)
        ]
        for process in workers:
            process.start()
        run_study(spec, study, storage, storage_url, on_trial=on_trial, out=out)
        for process in workers:
            process.join()
            if process.exitcode:
                console.print(f"[yellow]a --jobs worker process exited with code {process.exitcode}[/]")
    no_trial_completed(study)
    again = remeasure(spec, study, out, verify, repeats, progress, deadline)
    check_not_stopping()  # an interrupted re-measurement recommends nothing: the resumed tune finishes it
    confirmed = confirm_best(spec, study, again.rows, progress, deadline)
    check_not_stopping()
    finish(spec, study, out, again, confirmed, command, backend_note)
    check_not_stopping()  # a signal while the outputs were written: they are whole, and the exit says it came
    return out


def finish(
    spec: TuneSpec,
    study: optuna.Study,
    out: Path,
    again: Remeasured,
    confirmed,
    command: str,
    backend_note: str | None = None,
    section: Callable[[], None] | None = None,
    notes: Sequence[str] = (),
) -> None:
    """Every tune's end, a plain search's and a presearch's: write the outputs; then the results table, what was
    re-measured or settled, the winner and `notes` on the terminal. `section` writes the report's section of the
    re-measured rows in place of the plain one (a presearch's, with its calibration)."""
    winner, lines = write_outputs(
        spec,
        study,
        out,
        again.by_trial,
        command,
        backend_note,
        measured=again.rows[0] if again.rows else None,
        confirmed=confirmed.lines() if confirmed else [],
    )
    if confirmed:
        add_to_report(out, confirmation_section(confirmed))
        write_json(confirmed.payload(), out / "capacity.json")
    if again.settled:
        add_to_report(out, settled_section(again.settled))
    elif section is not None:
        section()
    elif again.rows:
        add_to_report(out, verified_section(again.rows, again.against))
    if again.rows and not again.settled:
        add_runs_to_csv(out, again.rows)
    console.print(results_table(spec, study, again.by_trial))
    if again.settled:
        print_settled(again.settled)
    elif again.rows:
        print_remeasured(again.rows, again.against)
    for line in [*lines, *notes]:
        console.print(line, soft_wrap=True)
    written = [name for name in outputs() if (out / name).exists()]
    console.print(f"wrote {out}/: {', '.join(written)}")


def remeasure(
    spec: TuneSpec, study: optuna.Study, out: Path, verify: int, repeats: int, progress: bool, deadline: float
) -> Remeasured:
    """The study's best measured again: relaunched (--backend launch, tune/verify.py), settled on long runs
    (a simulated capacity, tune/settle.py), or on the real engine (`verify` trials of a simulated search)."""
    verified: dict[int, dict] = {}
    remeasured: list[dict] = []
    settled: list[dict] = []
    if verify and spec.backend.relaunched:  # the winner's curse: tune/verify.py
        if get(spec.objective).one_winner:  # a front has no one winner to pick
            remeasured = verify_top(
                spec, study, spec.backend, State(out / VERIFIED_FILE), best_distinct(spec, study, verify), repeats
            )
            verified = {r["trial"]: r["metrics"] for r in remeasured}
    elif settled := settle_top(spec, study, deadline=deadline):  # a simulated capacity: the best few, long
        remeasured = settled
    if verify and not spec.backend.relaunched:
        workload = build_workload(spec.workload, spec.base_config().scheduler.max_model_len)
        for trial in feasible_trials(study)[:verify]:
            console.print(f"verifying trial {trial.number} on the real engine ...")
            verified[trial.number] = evaluate(
                spec, trial.user_attrs["knobs"], workload, backend=EngineBackend(), progress=progress
            ).metrics
    return Remeasured(verified, remeasured, settled)
