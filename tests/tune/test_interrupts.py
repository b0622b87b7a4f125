"""SIGINT and SIGTERM end every phase of the long commands cleanly: a launched tune's search and verification,
a `--presearch sim` tune's calibration launches, fit, simulated search, verification and drift check, a
simulated tune's settling; compare's capacity probes; bench's run. Each exits 130 (SIGINT) or 143 (SIGTERM)
at once, leaves no server or watchdog of its own, writes no result from unfinished work (no recommendation,
no verdict, no summary), and a tune resumed with the same command finishes with exactly --n-trials complete
trials, what finished before kept.

The launched servers are tests/tune/slow_server.py; a --presearch sim tune runs under tests/tune/fixed_fit.py
(the real fit takes a minute on that server's runs and does not fit them)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest

from chunkbench.errors import Interrupted
from chunkbench.launch.process import STOPPING, stop_everything
from tests.conftest import REPO, free_ports
from tests.tune.test_slots import CHUNKBENCH, SLOW_SERVER, intervals, our_servers, slow, study_trials, tune_args

FIXED_FIT = [sys.executable, str(Path(__file__).with_name("fixed_fit.py"))]
CODE = {signal.SIGINT: 130, signal.SIGTERM: 143}
RESULTS = ("recommended.toml", "vllm.yaml", "report.html", "trials.csv")
PROMPT_S = 10.0  # from the signal to the exit: a server's stop and a run's end, never the rest of a phase


class Watched:
    """A command run in the background, its output read as it comes."""

    def __init__(self, args: list[str]) -> None:
        self.process = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self.reader.start()

    @property
    def said(self) -> str:
        return "".join(self.lines)

    def wait_for(self, ready, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready(self):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()  # its watchdogs then stop its servers
                pytest.fail(f"never ready; it said: {self.said}")
            time.sleep(0.05)

    def interrupt(self, signum: int) -> float:
        """Send `signum`; the seconds until the command exited (killed after 60)."""
        self.process.send_signal(signum)
        sent = time.monotonic()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.reader.join(timeout=5)
        return time.monotonic() - sent


def said(text: str, then_s: float = 0.0):
    """Ready once the command has printed `text`, and `then_s` seconds after."""
    seen: list[float] = []

    def ready(run: Watched) -> bool:
        if not seen and text in run.said:
            seen.append(time.monotonic())
        return bool(seen) and time.monotonic() - seen[0] >= then_s

    return ready


def trials_complete(out: Path):
    """Ready once the study holds a complete trial (not a fixed time after the fit: beside another test process
    the first simulated trial once took longer than a second)."""

    def ready(run: Watched) -> bool:
        try:
            return bool(complete(out))
        except Exception:  # no study yet, or the tune holds the database this instant
            return False

    return ready


def started(events: Path, count: int):
    """Ready once `count` servers have bound their ports (slow_server's events)."""
    return lambda run: events.exists() and events.read_text().count("start ") >= count


def complete(out: Path) -> dict[int, tuple]:
    return {t.number: tuple(t.values) for t in study_trials(out) if t.state == optuna.trial.TrialState.COMPLETE}


def launched_tune(tmp_path: Path, presearch: bool, n_trials: int, startup: float) -> tuple[list[str], int, Path, Path]:
    """A launched tune's command line on slow_server (one token a millisecond), its port, events file and --out;
    --presearch sim under fixed_fit.py."""
    port, events, out = free_ports(1), tmp_path / "events", tmp_path / "out"
    extra = ["--port-base", str(port), "--verify-repeats", "1" if presearch else "3"]
    extra += ["--presearch", "sim", "--num-blocks", "256"] if presearch else []
    launch = slow(events, startup, token_ms=1.0)
    args = [*(FIXED_FIT if presearch else CHUNKBENCH), *tune_args(out, launch, *extra, n_trials=n_trials, verify=1)]
    args[args.index("--rate") + 1] = "40"  # the calibration's workload run: its 32 requests in about a second
    return args, port, events, out


def interrupt(args: list[str], when, signum: int, not_yet: str, port: int, events: Path, out: Path) -> str:
    """Run the tune, send `signum` once `when` is ready and before it printed `not_yet` (the next phase): it
    exits 128 + the signal within PROMPT_S, with no server or watchdog of it alive, every server it started
    stopped, and no result written. Returns what it printed."""
    tune = Watched(args)
    tune.wait_for(when)
    took = tune.interrupt(signum)
    assert tune.process.returncode == CODE[signum], tune.said
    assert not_yet not in tune.said, f"the signal came too late: {tune.said}"
    assert took < PROMPT_S, f"{took:.1f} s from the signal to the exit"
    time.sleep(0.3)
    assert not our_servers(f"--port {port}"), "a server or watchdog of the tune is alive after it exited"
    intervals(events)  # every server that started was stopped
    assert not [name for name in RESULTS if (out / name).exists()], "a result written by an interrupted tune"
    return tune.said


def resumed(args: list[str], out: Path, before: dict[int, tuple], n_trials: int, events: Path) -> None:
    """The same command again: exit 0, exactly n_trials complete trials (those from before unchanged), and a
    recommendation."""
    again = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    after = complete(out)
    assert len(after) == n_trials and all(after[n] == values for n, values in before.items())
    assert (out / "recommended.toml").exists()
    intervals(events)


# phase -> (--presearch sim, --n-trials, server startup s, when to signal, what the next phase prints first)
PHASES = {
    "search": (False, 3, 0.3, lambda events: started(events, 2), "re-measuring"),  # in trial 1's run
    "verification": (False, 2, 2.0, lambda events: said("re-measuring trial", 0.5), "wrote"),  # its server starting
    "calibration": (True, 3, 1.0, lambda events: said("launching the server for the decode run", 0.3), "fitting"),
}
# One signal per phase, both signals over the phases: they reach one handler (launch/process.py), and each
# phase's cases cost a launched tune and its resume (~25 s).
CASES = [("search", signal.SIGINT), ("verification", signal.SIGTERM), ("calibration", signal.SIGINT)]


@pytest.mark.slow
@pytest.mark.parametrize(("phase", "signum"), CASES, ids=[f"{p}-{s.name}" for p, s in CASES])
def test_a_tune_interrupted_in_a_phase_stops_cleanly_and_resumes(tmp_path, phase, signum):
    """The hostile probe's case among them: interrupted while the winner's server was starting for its
    re-measurement, a tune warned that it "could not be re-measured", recommended and exited 0."""
    presearch, n_trials, startup, when, not_yet = PHASES[phase]
    args, port, events, out = launched_tune(tmp_path, presearch, n_trials, startup)
    interrupt(args, when(events), signum, not_yet, port, events, out)
    before = complete(out) if (out / "study.db").exists() else {}
    if phase == "search":
        assert 0 < len(before) < n_trials, before  # the trials finished before the signal, and no more
    if phase == "calibration":  # the finished calibration run kept, no fit
        assert calibration_runs(out) == ["prefill"] and not (out / "calibration.json").exists()
    launches = events.read_text().count("start ")
    resumed(args, out, before, n_trials, events)
    if presearch:  # the rest of the calibration, then the verification and the drift check: nothing twice
        assert sorted(calibration_runs(out)) == ["decode", "mixed", "prefill", "workload"]
        assert events.read_text().count("start ") - launches == 3 + 2


@pytest.mark.slow
def test_a_presearch_tune_interrupted_in_each_later_phase_resumes_each_time(tmp_path):
    """--presearch sim past its calibration: interrupted in the simulated search (SIGTERM), then resumed and
    interrupted in the verification (SIGINT, its server starting), then in the drift check (SIGTERM), then
    resumed to the end. Each resume keeps what finished: the simulated trials, the calibration (no launch
    again), the verification."""
    n_trials = 40  # simulated: about 3 s in all
    args, port, events, out = launched_tune(tmp_path, True, n_trials, 1.0)
    interrupt(args, trials_complete(out), signal.SIGTERM, "in simulation", port, events, out)
    before = complete(out)
    assert 0 < len(before) < n_trials, before
    assert (out / "calibration.json").exists() and len(calibration_runs(out)) == 4
    calibrated = events.read_text().count("start ")

    said_ = interrupt(args, said("re-measuring trial", 0.3), signal.SIGINT, "checking", port, events, out)
    assert "calibrating" not in said_ and events.read_text().count("start ") == calibrated  # no launch before it
    assert len(complete(out)) == n_trials and not json.loads((out / "presearch.json").read_text())["verified"]

    interrupt(args, said("checking the server's speed", 0.3), signal.SIGTERM, "took", port, events, out)
    state = json.loads((out / "presearch.json").read_text())
    assert len(state["verified"]) == 1 and "drift" not in state
    launches = events.read_text().count("start ")

    resumed(args, out, before, n_trials, events)
    assert events.read_text().count("start ") - launches == 1  # the drift check alone
    assert "drift" in json.loads((out / "presearch.json").read_text())


def calibration_runs(out: Path) -> list[str]:
    state = json.loads((out / "presearch.json").read_text())
    return [run["name"] for run in state.get("calibration_runs", [])]


@pytest.mark.timing  # within 2 s of the signal: a test beside it would stretch that
@pytest.mark.parametrize("family", ["roofline", "linear"])
def test_a_fit_ends_at_a_signal(family):
    """The fit (a minute of CPU in a real tune, and no server to stop) raises Interrupted within a second of
    SIGINT/SIGTERM, not at its end (this fit alone takes 12-35 s here)."""
    from chunkbench.tune.presearch.server import fit
    from tests.tune.servers import LINEAR_TRUTH, TRUTH, make_spec, truth_runs

    spec = make_spec()
    runs = truth_runs(spec, TRUTH if family == "roofline" else LINEAR_TRUTH)
    timer = threading.Timer(1.0, stop_everything, args=(signal.SIGTERM,))
    timer.start()
    began = time.monotonic()
    try:
        with pytest.raises(Interrupted) as raised:
            fit(runs, spec, "cpu", num_blocks=1024, family=family)
    finally:
        timer.cancel()
        STOPPING.clear()
    assert raised.value.signum == signal.SIGTERM and time.monotonic() - began < 3.0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_compare_draws_no_verdict(tmp_path, signum):
    """compare across load, interrupted during its first policy's capacity probes (the simulator's long runs):
    exit 130/143 within a run, no comparison.json, report or verdict. (Before, the harness kept the cut run as
    a probe's figures and compare went on to write its verdict and exit 0.)"""
    out = tmp_path / "compare"
    args = [*CHUNKBENCH, "compare", "chunked", "continuous", "--backend", "sim", "--model", "llama-3-8b"]
    compare = Watched([*args, "--no-progress", "--num-requests", "40", "--out", str(out)])
    compare.wait_for(said("chunked all at once", 0.5))
    took = compare.interrupt(signum)
    assert compare.process.returncode == CODE[signum], compare.said
    assert took < PROMPT_S, f"{took:.1f} s from the signal to the exit"
    assert "chunked: capacity" not in compare.said and "sustains" not in compare.said  # no capacity, no verdict
    assert not (out / "comparison.json").exists()
    assert not (out / "report.html").exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_bench_writes_nothing(tmp_path, signum):
    """bench against a server that streams a token every 50 ms, interrupted mid-run: exit 130/143, no summary,
    requests file or --json."""
    port, events = free_ports(1), tmp_path / "events"
    server = subprocess.Popen(
        [sys.executable, str(SLOW_SERVER), "--port", str(port), "--token-ms", "50", "--events", str(events)],
        stderr=subprocess.DEVNULL,
    )
    try:
        while not events.exists():
            time.sleep(0.05)
        out, saved = tmp_path / "bench", tmp_path / "bench.json"
        bench = Watched(
            [
                *CHUNKBENCH,
                "bench",
                "--endpoint",
                f"http://127.0.0.1:{port}/v1",
                "--workload",
                "chat",
                "--num-requests",
                "4",
                "--rate",
                "8",
                "--out",
                str(out),
                "--json",
                str(saved),
            ]
        )
        bench.wait_for(said("timing:", 1.0))
        took = bench.interrupt(signum)
    finally:
        server.terminate()
        server.wait()
    assert bench.process.returncode == CODE[signum], bench.said
    assert took < PROMPT_S
    assert not out.exists() and not saved.exists()


def test_a_simulated_tune_interrupted_while_settling_writes_nothing(tmp_path):
    """A simulated capacity tune settles its best on long runs (tens of seconds) before it recommends:
    interrupted there it exits at once, with no recommendation or capacity.json, its trials kept. (Before, the
    harness kept the cut run as a settling run's figures and the tune settled and confirmed on for half a
    minute.) Not resumed here: the settling is not stored, a resumed tune settles again."""
    out, n_trials = tmp_path / "out", 2
    args = [*CHUNKBENCH, "tune", "--model", "tiny", "--backend", "sim", "--objective", "capacity", "--sla-ttft", "2s"]
    args += [
        "--workload",
        "chat",
        "--num-requests",
        "4",
        "--n-trials",
        str(n_trials),
        "--out",
        str(out),
        "--no-progress",
    ]
    tune = Watched(args)
    tune.wait_for(said("settling trial", 1.0))
    took = tune.interrupt(signal.SIGTERM)
    assert tune.process.returncode == 143, tune.said
    assert took < PROMPT_S, f"{took:.1f} s from the signal to the exit"
    assert not [name for name in (*RESULTS, "capacity.json") if (out / name).exists()]
    assert len(complete(out)) == n_trials
