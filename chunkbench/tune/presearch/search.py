"""`chunkbench tune --backend launch --presearch sim`: tune a real server in a few launches instead of one per
trial. Three phases, each resumable:

1. calibrate: launch the server for the designed runs of tune/presearch/server.py and fit the simulator to them
   (or load `--calibration FILE`, fitted before on the same deployment);
2. search: every trial of the study in simulation with that calibration (seconds each);
3. verify (tune/verify.py): launch the `--verify-top K` best distinct configurations for real; the winner is the
   best on the *measured* medians, and the report shows simulated against measured and whether the server
   still runs at the speed it was calibrated at (check_drift).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from pathlib import Path

import optuna
from rich.console import Console
from rich.markup import escape

from chunkbench.backends.launched import LaunchError
from chunkbench.backends.sim import SimBackend
from chunkbench.bench.backend import Backend
from chunkbench.errors import StudyFailed, UserError
from chunkbench.launch.process import check_not_stopping, stopping_wins
from chunkbench.launch.slots import SlotRun, slot_backends
from chunkbench.sim.server_calibration import FIT_TOLERANCE_PCT, ServerCalibration
from chunkbench.tune.objectives import get, one_winner_names
from chunkbench.tune.presearch import server as cal
from chunkbench.tune.presearch.report import drift_text, write_presearch_outputs
from chunkbench.tune.run import Remeasured, finish, tune_and_report
from chunkbench.tune.spec import TuneSpec
from chunkbench.tune.study import create_study, open_storage, run_study
from chunkbench.tune.verify import VERIFY_REPEATS, State, spread_over_ties, verify_top
from chunkbench.tune.verify_report import compared

console = Console()
STATE_FILE = "presearch.json"


def calibration_for(
    spec: TuneSpec, launch: Backend, out: Path, state: State, path: Path | None, device: str
) -> ServerCalibration:
    """A given --calibration file, the study folder's (a resumed tune), or a new fit from launches."""
    for saved, flag in ((path, "--calibration"), (out / "calibration.json", "--out")):
        if saved is not None and saved.exists():
            calibration = same_deployment(ServerCalibration.load(saved), spec, launch, saved, flag)
            if flag == "--calibration":
                console.print(f"calibration: {escape(str(path))} (no calibration launches)")
            return calibration
    runs = {r["name"]: r for r in state.data.setdefault("calibration_runs", [])}
    lock = threading.Lock()

    def launch_design(design: cal.Design, backend: Backend) -> None:
        where = f" on {backend.slot}" if getattr(backend, "slot", None) is not None else ""
        console.print(f"calibrating: launching the server for the {design.name} run{where} ...", soft_wrap=True)
        try:
            run = cal.measure_design(backend, spec, design, out / "calibration" / design.name / "launch.log")
        except LaunchError as exc:  # nothing to calibrate on: the tune cannot go on (unless a signal stopped it)
            check_not_stopping()
            raise StudyFailed(
                f"calibration: the server for the {design.name} run never became healthy: {exc}"
            ) from None
        if not run["ttft_ms"]:
            raise UserError(f"calibration: the {design.name} run completed no request on the launched server")
        if cal.primer_outran_burst(run):
            console.print(
                f"[yellow]warning:[/] the {design.name} run's primer got its token before the burst was "
                "sent: the server's first step may have caught only part of the burst; this run may "
                "fit worse",
                soft_wrap=True,
            )
        if not run["warmed_up"]:
            console.print(
                f"[yellow]warning:[/] the server refused part of the {design.name} run's untimed warm-up "
                "(a budget-sized prompt among decodes): its first steps are measured cold, and simulated "
                "without a warm-up; this run may fit worse",
                soft_wrap=True,
            )
        if where:
            run["slot"] = str(backend.slot)
        with lock:  # recorded the moment it finishes: a killed tune does not launch it again
            state.data["calibration_runs"].append(run)
            state.save()
            runs[design.name] = run

    todo = [d for d in cal.designs(spec) if d.name not in runs]  # the others launched before this process
    SlotRun(slot_backends(launch)).map([functools.partial(launch_design, d) for d in todo])
    check_not_stopping()  # the runs above were cut short: the resumed tune launches what did not finish
    console.print("calibrating: fitting the simulator to those runs ...")
    calibration = cal.fit(
        [runs[d.name] for d in cal.designs(spec)],
        spec,
        device,
        getattr(launch, "launch", ""),
        spec.engine_overrides.get("num_blocks"),
    )
    calibration.save(out / "calibration.json")
    if path is not None:
        calibration.save(path)
    return calibration


def same_deployment(
    calibration: ServerCalibration, spec: TuneSpec, launch: Backend, path: Path, flag: str
) -> ServerCalibration:
    """A saved calibration (`flag`: --calibration FILE, or --out's from a tune run before) describes the server
    it was fitted on: another model is refused (its constants would scale the wrong shapes), another --launch
    template is warned about in one line (it may differ only in a port, or be another deployment)."""
    again = "give --calibration a new path" if flag == "--calibration" else "use another --out"
    if calibration.model and calibration.model != spec.model:
        raise UserError(
            f"{flag}: {path} was fitted to a server of {calibration.model}, not {spec.model}: "
            f"{again} to calibrate again"
        )
    server = getattr(launch, "launch", "")
    if calibration.server and server and calibration.server != server:
        console.print(
            f"[yellow]warning:[/] {escape(str(path))} was fitted on a server launched as "
            f"`{escape(calibration.server)}`; this tune launches `{escape(server)}`: if that is another "
            f"deployment, {again} to calibrate again",
            soft_wrap=True,
        )
    return calibration


def check_drift(spec: TuneSpec, launch: Backend, state: State, calibration: ServerCalibration) -> dict | None:
    """server.drift_check, once per tune, after the verifications: the calibration's decode run launched once
    more, recorded in presearch.json (a resumed tune does not repeat it)."""
    calibrated = next((r for r in calibration.runs if r.get("name") == "decode"), None)
    if calibrated is not None and "drift" not in state.data:
        console.print("checking the server's speed against the calibration (its decode run again) ...")
        state.data["drift"] = cal.drift_check(launch, spec, calibrated)
        state.save()
    return state.data.get("drift")


@stopping_wins()
def presearch_tune(
    spec: TuneSpec,
    name: str,
    storage_url: str | None,
    out: Path,
    verify: int,
    launch: Backend,
    calibration_path: Path | None = None,
    device: str = "cpu",
    progress: bool = True,
    command: str = "chunkbench tune",
    repeats: int = VERIFY_REPEATS,
) -> Path:
    """Calibrate, search in simulation, verify by launching (module docstring); each verified configuration
    runs `repeats` times on its launch, and the drift check, the calibration's decode run on a launch of its own,
    comes last.

    A calibration whose fit error exceeds FIT_TOLERANCE_PCT (sim/server_calibration.py) says so in one line and
    the tune launches every trial instead (launch_every_trial): recommending from a simulator that does not
    describe the server would be worse than slow. Finished launches (calibration runs, verifications; a
    fallback's re-measurements in `verified.json`) are recorded in `presearch.json` in the study folder as they
    finish, so a killed tune resumes without repeating them; the simulated trials resume as any study does
    (Optuna keeps complete trials)."""
    if not get(spec.objective).one_winner:
        raise UserError(f"--presearch sim picks one winner on measured figures: use --objective {one_winner_names()}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out.mkdir(parents=True, exist_ok=True)
    state = State(out / STATE_FILE)
    started = time.monotonic()
    calibration = calibration_for(spec, launch, out, state, calibration_path, device)
    console.print(f"calibration: {calibration.label()} (max error {calibration.max_error_pct:.1f}%)")
    if not calibration.fits:
        return launch_every_trial(
            spec, name, storage_url, out, verify, launch, state, calibration, progress, command, repeats
        )
    state.data["mode"] = "presearch sim"
    state.save()
    sim_spec = dataclasses.replace(spec, backend=SimBackend(server_calibration=calibration))
    study = search_in_simulation(sim_spec, name, storage_url, out)
    verified = verify_top(spec, study, launch, state, spread_over_ties(spec, study, verify), repeats)
    check_not_stopping()  # an interrupted verification recommends nothing: the resumed tune finishes it
    again = Remeasured({r["trial"]: r["metrics"] for r in verified}, verified, against="simulated")
    drift = check_drift(spec, launch, state, calibration)
    check_not_stopping()
    notes = [*drift_lines(drift), *simulated_gap(verified)]
    notes.append(f"calibrate-search-verify took {time.monotonic() - started:.0f} s")
    section = functools.partial(write_presearch_outputs, out, calibration, verified, drift)
    finish(sim_spec, study, out, again, None, command, section=section, notes=notes)
    check_not_stopping()  # a signal while the outputs were written: they are whole, and the exit says it came
    return out


def launch_every_trial(
    spec: TuneSpec,
    name: str,
    storage_url: str | None,
    out: Path,
    verify: int,
    launch: Backend,
    state: State,
    calibration: ServerCalibration,
    progress: bool,
    command: str,
    repeats: int,
) -> Path:
    """A calibration that does not fit: said in one line, and the tune launches every trial instead (then
    re-measures the best, as such a tune does); presearch.json records the mode."""
    error = (
        f"{calibration.judged_error_pct:.1f}%"
        if calibration.workload_error_pct is None
        else f"{calibration.workload_error_pct:.1f}% on the tune's workload, {calibration.fit_error_pct:.1f}% "
        "over all runs"
    )
    limit = f"{FIT_TOLERANCE_PCT:g}%" + (
        "" if calibration.workload_error_pct is None else f" (all runs: {2 * FIT_TOLERANCE_PCT:g}%)"
    )
    console.print(
        f"calibration fit error {error} exceeds {limit}: the simulator does not describe this "
        "server; launching every trial instead",
        soft_wrap=True,
    )
    state.data["mode"] = "launch every trial"
    state.save()
    result = tune_and_report(
        dataclasses.replace(spec, backend=launch),
        name,
        storage_url,
        out,
        verify,
        progress=progress,
        command=command,
        repeats=repeats,
    )
    write_presearch_outputs(out, calibration, [])
    check_not_stopping()
    return result


def search_in_simulation(sim_spec: TuneSpec, name: str, storage_url: str | None, out: Path) -> optuna.Study:
    """Every trial of the study on the calibrated simulator (the study folder's SQLite unless --storage)."""
    storage_url = storage_url or f"sqlite:///{out / 'study.db'}"
    storage = open_storage(storage_url)
    study = create_study(sim_spec, name, storage)
    search_started = time.monotonic()
    run_study(sim_spec, study, storage, storage_url)
    console.print(f"searched {sim_spec.n_trials} trials in simulation in {time.monotonic() - search_started:.0f} s")
    return study


def drift_lines(drift: dict | None) -> list[str]:
    """check_drift's result in a line; a warning when the server's speed moved beyond cal.DRIFT_TOLERANCE."""
    if not drift:
        return []
    if abs(drift["ratio"] - 1) <= cal.DRIFT_TOLERANCE:
        return [drift_text(drift)]
    return [
        f"[yellow]warning:[/] {drift_text(drift)}; the host or device changed speed since: simulated and measured "
        "figures cannot agree closer than that; calibrate again when it is steady"
    ]


def simulated_gap(verified: list[dict]) -> list[str]:
    """A warning when simulated and measured figures of the verified configurations differ beyond the fit
    tolerance: the calibration runs fitted, but this workload is not like them."""
    worst = max(
        (
            abs(s - m) / m
            for r in verified
            for s, m in ((r["searched"].get(k), r["metrics"].get(k)) for k, _ in compared(verified))
            if s is not None and m
        ),
        default=0.0,
    )
    if worst <= FIT_TOLERANCE_PCT / 100:
        return []
    return [
        f"warning: on the verified configurations simulated and measured figures differ by up to "
        f"{100 * worst:.0f}%: the simulated ranking may be wrong; verify more (--verify-top) or "
        "launch every trial (--presearch none)"
    ]
