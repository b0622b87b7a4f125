"""`tune --backend launch --slots N`: trials in parallel, one launched server per slot on its own port; a port
held by a server the tune did not start never yields a COMPLETE trial; SIGKILL, SIGTERM and SIGINT of a tune
leave no server of it behind, and the same command resumes with every finished trial kept once.

The launched server is tests/tune/slow_server.py (a fake OpenAI server that takes --startup seconds to come up)
or a real `chunkbench serve --model tiny`."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from chunkbench.backends.launched import LaunchBackend
from chunkbench.errors import UserError
from chunkbench.launch.node import plan_slots
from chunkbench.launch.process import LaunchError, check_owner, start_server
from tests.conftest import REPO, free_ports, run_cli

SLOW_SERVER = Path(__file__).with_name("slow_server.py")
CHUNKBENCH = [sys.executable, "-m", "chunkbench.cli"]


def tune_args(out: Path, launch: str, *extra: str, n_trials: int = 4, rate: float = 8, verify: int = 0) -> list[str]:
    return [
        "tune",
        "--model",
        "tiny",
        "--backend",
        "launch",
        "--launch",
        launch,
        "--objective",
        "goodput",
        "--workload",
        "chat",
        "--num-requests",
        "4",
        "--rate",
        str(rate),
        "--n-trials",
        str(n_trials),
        "--verify-top",
        str(verify),
        "--out",
        str(out),
        "--no-progress",
        "--launch-timeout",
        "60",
        *extra,
        # a port of its own (the default 8000 is another test process's too); the slots' tests pass theirs
        *(() if "--port-base" in extra else ("--port-base", str(free_ports(8)))),
    ]


def slow(events: Path, startup: float, token_ms: float = 2.0) -> str:
    return (
        f"{sys.executable} {SLOW_SERVER} --port {{port}} --startup {startup} --token-ms {token_ms} "
        f"--events {events} --cpus={{cpus}}"
    )


def study_trials(out: Path) -> list[optuna.trial.FrozenTrial]:
    url = f"sqlite:///{out / 'study.db'}"
    return optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url).trials


def intervals(events: Path) -> dict[int, list[tuple[float, float]]]:
    """Per port, (start, stop) of each server that listened on it."""
    started, spans = {}, collections.defaultdict(list)
    for line in events.read_text().splitlines():
        what, port, pid, at = line.split()
        if what == "start":
            started[pid] = float(at)
        else:
            spans[int(port)].append((started.pop(pid), float(at)))
    assert not started, f"servers never stopped: {started}"
    return spans


@pytest.mark.slow
@pytest.mark.timing  # a ratio of two wall times: another test beside it would slow one of them
def test_four_slots_run_eight_trials_in_under_0_4_of_one_slots_time(tmp_path, capsys):
    """Servers that take 3 s to come up: 8 trials on one slot pay 8 starts in a row (>= 24 s), on four slots
    2 rounds (~12 s with each trial's ~2.5 s of launching, warming up and measuring). 0.4 leaves room for this
    2-core machine's noise (measured: 46.6 s and 14.0 s, 0.30; with 12 trials at 5 s starts, 0.28)."""
    walls = {}
    for slots in (1, 4):
        base, events = free_ports(4), tmp_path / f"events{slots}"
        started = time.monotonic()
        code, stdout, err = run_cli(
            tune_args(
                tmp_path / f"s{slots}",
                slow(events, 3.0, 0.2),
                "--slots",
                str(slots),
                "--port-base",
                str(base),
                n_trials=8,
                rate=40,
            ),
            capsys,
        )
        walls[slots] = time.monotonic() - started
        assert code == 0, err
        spans = intervals(events)
        assert set(spans) == {base + i for i in range(slots)}  # each slot's launches on its own port
        for port, runs in spans.items():  # never two live servers on one port
            runs.sort()
            assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:])), (port, runs)
        trials = study_trials(tmp_path / f"s{slots}")
        assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials) == 8
        assert {t.user_attrs["slot"].split(" (")[0] for t in trials} == {f"slot {i}" for i in range(slots)}
    print("wall times by slots", walls)
    assert walls[4] <= 0.4 * walls[1], walls


def test_a_port_held_by_another_server_never_yields_a_complete_trial(tmp_path, capsys):
    base, events = free_ports(1), tmp_path / "events"
    stale = subprocess.Popen([sys.executable, str(SLOW_SERVER), "--port", str(base), "--events", str(events)])
    try:
        while not events.exists():
            time.sleep(0.05)
        code, _, err = run_cli(tune_args(tmp_path / "out", slow(events, 0), "--port-base", str(base)), capsys)
    finally:
        stale.terminate()
        stale.wait()
    assert code == 1 and f"port {base} (slot 0) is already in use, held by pid {stale.pid}" in err, err
    trials = study_trials(tmp_path / "out")
    assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL] * 3
    assert len(events.read_text().splitlines()) == 2  # the stale server's start and stop: the tune launched none


def test_a_launch_that_dies_while_another_server_answers_is_a_failed_trial(tmp_path, capsys, monkeypatch):
    """Past the port check (as if the stale server bound the port just after it): the launched command exits at
    once, the stale server answers /health, and the trial still fails."""
    base, events = free_ports(1), tmp_path / "events"
    stale = subprocess.Popen([sys.executable, str(SLOW_SERVER), "--port", str(base), "--events", str(events)])
    monkeypatch.setattr("chunkbench.backends.launched.port_busy", lambda host, port: False)
    try:
        while not events.exists():
            time.sleep(0.05)
        code, _, err = run_cli(
            tune_args(tmp_path / "out", "sh -c 'sleep 0.3; exit 3' {port}", "--port-base", str(base)), capsys
        )
    finally:
        stale.terminate()
        stale.wait()
    assert code == 1, err
    errors = [t.user_attrs["error"] for t in study_trials(tmp_path / "out")]
    assert len(errors) == 3 and all("LaunchError" in e for e in errors), errors


def test_the_server_on_the_port_must_be_the_launched_one(tmp_path):
    """check_owner: a live launch whose port is held by another process is not trusted."""
    port, events = free_ports(1), tmp_path / "events"
    stale = subprocess.Popen([sys.executable, str(SLOW_SERVER), "--port", str(port), "--events", str(events)])
    server = start_server("sleep 30", tmp_path / "launch.log", {}, port)
    try:
        while not events.exists():
            time.sleep(0.05)
        with pytest.raises(LaunchError, match=f"port {port} is served by pid {stale.pid}"):
            check_owner(server, port)
    finally:
        stale.terminate()
        stale.wait()
        server.stop()


def test_slot_placeholders_and_refusals(tmp_path, capsys):
    node = plan_slots(None, 9000, gpus="0-3", gpus_per_trial=2)
    assert [(s.port, s.gpus) for s in node] == [(9000, (0, 1)), (9001, (2, 3))]
    assert [s.cpus for s in plan_slots(2, 9000, cpus="4,5")] == [(4,), (5,)]
    with pytest.raises(UserError, match="--slots 3 needs 6 of --gpus .* and --gpus names 2"):
        plan_slots(3, 9000, gpus="0,1", gpus_per_trial=2)
    backend = LaunchBackend("x --port {port}", "http://127.0.0.1:{port}/v1", node=tuple(node), slot=node[0])
    assert [b.url for b in backend.slots] == ["http://127.0.0.1:9000/v1", "http://127.0.0.1:9001/v1"]
    fixed = tune_args(
        tmp_path, "chunkbench serve --model tiny --port 8123", "--endpoint", "http://127.0.0.1:8123/v1", "--slots", "2"
    )
    code, _, err = run_cli(fixed, capsys)
    assert code == 2 and "--launch names one fixed port, and 2 slots" in err, err
    code, _, err = run_cli(tune_args(tmp_path, "x --port {port}", "--jobs", "2"), capsys)
    assert code == 2 and "launched servers run in --slots" in err, err
    assert not list(tmp_path.glob("**/launch.log"))  # refused before any launch


def our_servers(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (the tune's unique port), other than this one."""
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in command and state != "Z" and pid != os.getpid():
            found.append(pid)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL])  # SIGINT and SIGTERM, in every phase: test_interrupts.py
def test_a_killed_tune_leaves_no_server_and_resumes(tmp_path, signum):
    port = free_ports(1)
    launch = (
        f"{sys.executable} -m chunkbench.cli serve --model tiny --port {{port}} --max-model-len 1024 "
        "{chunkbench_flags}"
    )
    args = [*CHUNKBENCH, *tune_args(tmp_path, launch, "--port-base", str(port), n_trials=2)]
    tune = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "trials" / "1" / "launch.log"  # mid-trial: the second trial's server is up
    deadline = time.monotonic() + 120
    while not (log.exists() and "healthy" in log.read_text()):
        assert tune.poll() is None and time.monotonic() < deadline, tune.stderr.read()
        time.sleep(0.1)
    tune.send_signal(signum)
    stopped = time.monotonic()
    tune.wait(timeout=30)
    while our_servers(f"--port {port}") and time.monotonic() - stopped < 10:
        time.sleep(0.2)
    assert not our_servers(f"--port {port}"), "a server of the killed tune is still alive 10 s after"
    assert tune.returncode == {signal.SIGKILL: -9, signal.SIGTERM: 143, signal.SIGINT: 130}[signum]
    before = {t.number: t.values for t in study_trials(tmp_path) if t.state == optuna.trial.TrialState.COMPLETE}
    assert before  # trial 0 finished
    again = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    complete = [t for t in study_trials(tmp_path) if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 2 and all(before[n] == t.values for t in complete if (n := t.number) in before)
    assert set(before) <= {t.number for t in complete}
    assert not our_servers(f"--port {port}")


class FakeNvml:
    """pynvml's calls that gpu_monitor makes, with fixed readings: 1 GiB used per GPU, 50% busy, 100 W."""

    NVMLError = RuntimeError

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetMemoryInfo(self, handle):
        return type("Memory", (), {"used": 2**30})

    def nvmlDeviceGetUtilizationRates(self, handle):
        return type("Rates", (), {"gpu": 50})

    def nvmlDeviceGetPowerUsage(self, handle):
        return 100_000  # mW


def test_a_node_tune_names_slots_gpus_and_noise(tmp_path, capsys, monkeypatch):
    """Two slots of two GPUs each: each launch sees its slot's CUDA_VISIBLE_DEVICES; the re-measured
    configurations run on both slots, and every run says which; trials.csv holds the runs; the report has the
    per-user/per-GPU front, the knob importances, the GPUs' figures (NVML, faked) and the verdict."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    base, events, out = free_ports(2), tmp_path / "events", tmp_path / "out"
    code, stdout, err = run_cli(
        tune_args(
            out,
            slow(events, 0.2, 0.5),
            "--gpus",
            "0-3",
            "--gpus-per-trial",
            "2",
            "--port-base",
            str(base),
            "--verify-repeats",
            "3",
            n_trials=6,
            verify=2,
        ),
        capsys,
    )
    assert code == 0, err
    logs = {p.read_text().split("CUDA_VISIBLE_DEVICES=")[1].split()[0] for p in out.glob("trials/*/launch.log")}
    assert logs == {"0,1", "2,3"}
    trials = study_trials(out)
    assert all(t.user_attrs["metrics"]["gpu_peak_memory_mib"] == 2048 for t in trials)  # two GPUs of 1 GiB
    import pandas as pd

    frame = pd.read_csv(out / "trials.csv")
    runs = frame[frame.state == "REMEASURED"]
    assert len(runs) == 6 and set(runs.groupby("number").slot.nunique()) == {2}  # each on both slots
    assert "knobs that mattered most (PED-ANOVA importance)" in stdout
    assert ("winner ahead" in stdout) or ("tied within the measured noise" in stdout)
    report = (out / "report.html").read_text()
    for text in (
        "Throughput per user against per GPU",
        "Which knobs mattered",
        "read through NVML",
        "95% CI of the median",
        "slot 0 x",
    ):
        assert text in report, text
    assert (out / "pareto_gpu.png").exists()


def test_the_verdict_is_ahead_only_when_the_intervals_clear():
    from chunkbench.tune.verify_report import verdict

    def row(trial, goodputs):
        return {
            "trial": trial,
            "feasible": True,
            "metrics": {"request_goodput": sorted(goodputs)[1]},
            "repeats": [{"request_goodput": g} for g in goodputs],
        }

    assert verdict([row(1, [5.0, 5.1, 5.2]), row(2, [4.0, 4.1, 4.2])]).startswith("winner ahead of trial 2")
    tied = verdict([row(1, [5.2, 5.3, 4.5]), row(2, [4.9, 5.0, 5.1])])
    assert tied.startswith("tied within the measured noise with trial 2") and "the higher median" in tied


@pytest.mark.parametrize("objective", ["capacity", "goodput"])
def test_a_server_that_dies_mid_run_fails_its_trial(tmp_path, objective):
    """A launched server that exits mid-run (the fake exits on its third request) fails its trial with what
    failed and how many requests; a tune whose every trial failed recommends nothing and exits 1."""
    out = tmp_path / "out"
    launch = f"{sys.executable} {SLOW_SERVER} --port {{port}} --die-after 2"
    args = tune_args(out, launch, "--port-base", str(free_ports(1)), n_trials=2)
    args[args.index("--objective") + 1] = objective
    args += ["--sla-ttft", "5s"] if objective == "capacity" else []
    done = subprocess.run([*CHUNKBENCH, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    # the watchdog may not have reaped it yet: then the port that stopped answering is what is named
    assert "during a run" in done.stderr and "requests failed" in done.stderr, done.stderr
    assert not (out / "recommended.toml").exists()
    trials = study_trials(out)
    assert trials and all(t.state == optuna.trial.TrialState.FAIL for t in trials)
    assert all("during a run" in t.user_attrs["error"] for t in trials)
