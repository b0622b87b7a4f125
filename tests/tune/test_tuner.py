"""The tuner: SLA parsing, search quality against an exhaustive optimum, outputs, resumption, bad input."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from chunkbench.backends.sim import SimBackend
from chunkbench.bench.slo import SLO, parse_slas
from chunkbench.errors import UserError
from chunkbench.tune.objectives import evaluate
from chunkbench.tune.space import SearchSpace, chunk_schedule, engine_kwargs
from chunkbench.tune.spec import TuneSpec
from chunkbench.tune.study import create_study, feasible_trials, open_storage, run_study
from chunkbench.workloads.spec import WorkloadSpec, build_workload
from tests.conftest import REPO, run_cli

H100 = SimBackend("h100-sxm")


def test_sla_strings():
    slos = parse_slas({"ttft": "300ms", "tbt": "p90:0.1s", "tpot": None, "e2el": "5s"}, 99)
    assert slos == [SLO("ttft", 99, 300.0), SLO("tbt", 90, 100.0), SLO("e2el", 99, 5000.0)]
    assert slos[1].summary_key == "p90_itl_ms" and str(slos[0]) == "p99 TTFT <= 300 ms"
    for bad, message in [
        ("abc", "not a duration"),
        ("-5ms", "must be positive"),
        ("0ms", "must be positive"),
        ("300", "not a duration"),
        ("p101:3ms", "percentile"),
    ]:
        with pytest.raises(UserError, match=f"--sla-ttft: .*{message}"):
            parse_slas({"ttft": bad})


def test_schedules_and_knobs():
    assert chunk_schedule("decreasing", 2048) == (2048, 1024, 512)
    assert chunk_schedule("linear", 1024) == (1024, 768, 512, 256)
    assert chunk_schedule("fixed", 512) == ()
    assert engine_kwargs({"policy": "continuous", "max_num_batched_tokens": 512, "max_num_seqs": 8}, 8192) == {
        "policy": "continuous",
        "max_num_seqs": 8,
        "max_num_batched_tokens": 8192,
    }


def small_space() -> SearchSpace:
    """150 points: 6 budgets x 5 chunk caps x 5 seat limits."""
    return SearchSpace(
        {
            "policy": ["chunked"],
            "max_num_batched_tokens": [128, 256, 512, 1024, 2048, 4096],
            "chunk_size": [0, 64, 128, 256, 1024],
            "max_num_seqs": [2, 4, 8, 16, 64],
        }
    )


def test_search_finds_the_exhaustive_optimum_with_a_fifth_of_the_trials(tmp_path):
    space = small_space()
    points = space.points()
    assert len(points) == 150
    workload_spec = WorkloadSpec(name="rag-mix", num_requests=120, rate=6.0, seed=1)
    spec = TuneSpec(
        model="llama-3-8b",
        slos=parse_slas({"ttft": "2s", "tbt": "100ms"}),
        space=space,
        workload=workload_spec,
        backend=H100,
        n_trials=30,
        seed=0,
    )
    workload = build_workload(workload_spec, 8192)
    exhaustive = []
    for point in points:
        outcome = evaluate(spec, engine_kwargs(point, 8192), workload)
        if outcome.feasible:
            exhaustive.append(outcome.values[0])
    optimum = max(exhaustive)
    assert len(exhaustive) < len(points), "the SLA should rule some points out"
    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = open_storage(url)
    study = create_study(spec, "quality", storage)
    run_study(spec, study, storage, url)
    best = feasible_trials(study)[0].values[0]
    assert len(study.trials) == 30 <= len(points) / 5
    assert best >= 0.98 * optimum, f"tuner {best:.3f} vs exhaustive {optimum:.3f}"


# Medians of short answers: the long runs that settle a capacity stay short (130 requests where the server fills
# in time; a p99's are thousands, rag-mix's 5-s requests take 2,000), and what these tests check (the outputs,
# the trial count, a resume) is the same at any percentile and on any workload.
TUNE = [
    "tune",
    "--model",
    "llama-3-8b",
    "--workload",
    "random",
    "--random-input-len",
    "512",
    "--random-output-len",
    "32",
    "--sla-ttft",
    "300ms",
    "--sla-tbt",
    "100ms",
    "--sla-percentile",
    "50",
    "--num-requests",
    "60",
    "--no-progress",
]


def test_capacity_early_stop_and_warm_start_find_the_same_capacity():
    """Probes stopped once an SLA is certainly missed, and brackets started from another trial's capacity,
    change the work done, not the capacity found."""
    import dataclasses

    workload_spec = WorkloadSpec(name="rag-mix", num_requests=80, rate=4.0, seed=2)
    spec = TuneSpec(
        model="llama-3-8b",
        slos=parse_slas({"ttft": "300ms", "e2el": "20s"}),
        space=small_space(),
        workload=workload_spec,
        backend=H100,
        objective="capacity",
    )
    workload = build_workload(workload_spec, 8192)
    for knobs in ({"max_num_batched_tokens": 512, "max_num_seqs": 8}, {"max_num_batched_tokens": 2048}):
        kwargs = engine_kwargs({"policy": "chunked", "max_num_seqs": 256, **knobs}, 8192)
        full = evaluate(dataclasses.replace(spec, early_stop=False), kwargs, workload)
        assert full.values[0] > 0
        for hint in (None, 1.0, 300.0, full.values[0]):
            fast = evaluate(spec, kwargs, workload, capacity_hint=hint)
            assert fast.values == full.values and fast.constraints == full.constraints, (knobs, hint)


@pytest.mark.slow
@pytest.mark.usefixtures("settle_one")
def test_jobs_run_trials_in_parallel_processes_with_the_exact_count(tmp_path, capsys):
    out = tmp_path / "j"
    # Trials long enough (400 requests, a capacity search each) that this process cannot finish all eight
    # before the spawned one has started (an interpreter and its imports, 1-2 s): with 30 requests the
    # simulator got fast enough that it sometimes did, and the second process found the study full.
    code, _, err = run_cli(
        [*TUNE[:-3], "--num-requests", "400", "--n-trials", "8", "--jobs", "2", "--out", str(out), "--no-progress"],
        capsys,
    )
    assert code == 0, err
    trials = _study(out / "study.db").get_trials()
    assert len(trials) == 8 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert len({t.user_attrs.get("worker") for t in trials}) == 2, "both processes ran trials"


def test_nothing_feasible_names_the_closest_trial(tmp_path, capsys):
    code, stdout, _ = run_cli(
        [
            *TUNE[:3],
            "--sla-ttft",
            "1ms",
            "--n-trials",
            "4",
            "--out",
            str(tmp_path / "x"),
            "--num-requests",
            "30",
            "--no-progress",
        ],
        capsys,
    )
    assert code == 0
    assert "No trial met p99 TTFT <= 1 ms" in stdout and "Closest: trial" in stdout and "missed by" in stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sla-ttft", "abc"], "--sla-ttft: 'abc' is not a duration"),
        (["--sla-tbt", "-100ms"], "--sla-tbt: must be positive"),
        (["--objective", "speed"], "--objective must be one of"),
        (["--space", "/no/such.toml"], "--space: cannot read"),
        (["--storage", "postgresql://nobody:x@127.0.0.1:1/none"], "--storage: cannot open"),
    ],
)
def test_tune_bad_input_writes_nothing(args, message, tmp_path, capsys):
    out = tmp_path / "never"
    code, _, err = run_cli(["tune", "--model", "llama-3-8b", "--out", str(out), "--no-progress", *args], capsys)
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not out.exists()


@pytest.mark.parametrize(
    "toml, message",
    [
        ("[space]\n", "the [space] table is empty"),
        ("[space]\nmax_num_batched_tokens = []\n", "must be a non-empty list"),
        ("[space]\npolicy = ['fifo']\n", "unknown policy 'fifo'"),
        ("[space]\nmax_num_batched_tokens = [128, 256]\ntile = [512]\n", "contradictory"),
        ("[space]\nbudget = [1]\n", "unknown knob"),
        ("[space\n", "not valid TOML"),
    ],
)
def test_bad_spaces(toml, message, tmp_path):
    path = tmp_path / "space.toml"
    path.write_text(toml)
    with pytest.raises(UserError, match=re.escape(message)):
        SearchSpace.load(path)


def test_builtin_spaces_load():
    for name in ("default", "latency", "throughput"):
        space = SearchSpace.load(name)
        assert space.points() and space.workload


def test_open_storage_retries_the_table_creation_race(tmp_path, monkeypatch):
    """Two processes opening a new database at once: the loser of Optuna's table creation retries (this made
    CI's kill -9 test flaky: its reader raced the tuner)."""
    real, calls = optuna.storages.RDBStorage, []

    def racing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("(sqlite3.OperationalError) table studies already exists")
        return real(*args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", racing)
    assert open_storage(f"sqlite:///{tmp_path / 'study.db'}") is not None and len(calls) == 2
    with pytest.raises(UserError, match="--storage: cannot open"):
        open_storage(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}")


@pytest.mark.slow
def test_kill_minus_nine_then_rerun_keeps_finished_trials_and_writes_every_output(tmp_path):
    out = tmp_path / "study"
    command = [
        sys.executable,
        "-m",
        "chunkbench.cli",
        *TUNE,
        "--n-trials",
        "12",
        "--out",
        str(out),
        "--num-requests",
        "100",
    ]
    log = tmp_path / "first.log"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(command, cwd=REPO, stdout=stderr, stderr=stderr, start_new_session=True)
    db = out / "study.db"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # kill as soon as a few trials are in
        time.sleep(0.5)
        if db.exists() and _complete(db) >= 3:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = _complete(db)
    assert 3 <= kept < 12, log.read_text()[-3000:]
    first_numbers = _complete_numbers(db)
    rerun = subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True, timeout=300)
    assert _complete(db) == 12
    assert set(first_numbers) <= set(_complete_numbers(db))
    outputs_written(out, rerun.stdout)  # the resumed tune is a whole one


def test_a_trial_orphaned_before_its_first_heartbeat_is_replaced(tmp_path, monkeypatch):
    """A process killed between `ask` and its first heartbeat leaves a RUNNING trial Optuna never calls stale;
    the study must still reach n_trials (this hung CI once)."""
    from chunkbench.tune import study as tuner

    spec = TuneSpec(
        model="llama-3-8b",
        slos=parse_slas({"ttft": "2s"}),
        space=small_space(),
        workload=WorkloadSpec(name="chat", num_requests=20, rate=4.0, seed=1),
        backend=H100,
        n_trials=3,
        timeout_s=60,
    )
    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = open_storage(url)
    monkeypatch.setattr(tuner, "GRACE_S", 0)  # after opening: Optuna's own grace period must be positive
    study = create_study(spec, "orphan", storage)
    with pytest.warns(UserWarning, match="Heartbeat"):
        orphan = study.ask()  # never heartbeats, never told
    time.sleep(0.01)
    run_study(spec, study, storage, url)
    states = {t.number: t.state for t in study.get_trials()}
    assert states[orphan.number] == optuna.trial.TrialState.FAIL
    assert list(states.values()).count(optuna.trial.TrialState.COMPLETE) == 3


def outputs_written(out: Path, stdout: str) -> None:
    """Every output of a simulated capacity tune (with an SLA the default objective is capacity), its settled
    margin over the runner-up in the printout and the report."""
    for name in (
        "recommended.toml",
        "vllm.yaml",
        "vllm_flags.txt",
        "sglang.txt",
        "trials.csv",
        "search.png",
        "knobs.png",
        "report.html",
        "study.db",
    ):
        assert (out / name).exists(), name
    said = " ".join(stdout.split())  # as printed on an 80-column console, lines wrapped
    assert re.search(r"trials (\(\d+ failed\) )?\(capacity, simulated", said)  # a killed trial is a failed one
    assert re.search(r"Margin: (the winner's capacity is .* ahead of|none: the winner ties with) the runner-up", said)
    page = (out / "report.html").read_text()
    assert "How each knob moves" in page and "What was not verified, and why" in page and "Margin:" in page
    config = yaml.safe_load((out / "vllm.yaml").read_text())
    assert config["model"] == "meta-llama/Meta-Llama-3-8B-Instruct"
    real_vllm_options = {
        "max-num-batched-tokens",
        "max-num-seqs",
        "max-model-len",
        "enable-chunked-prefill",
        "block-size",
        "gpu-memory-utilization",
        "enable-prefix-caching",
        "long-prefill-token-threshold",
        "max-num-partial-prefills",
        "model",
        "tensor-parallel-size",
        "kv-cache-dtype",
        "prefill-schedule-interval",  # vLLM 0.33+: the default target is the newest release
    }
    assert set(config) <= real_vllm_options and config["max-num-batched-tokens"] >= 256
    assert "--chunked-prefill-size" in (out / "sglang.txt").read_text()
    assert "SIMULATED" in stdout


def _study(db: Path) -> optuna.Study:
    name = optuna.get_all_study_names(f"sqlite:///{db}")[0]
    return optuna.load_study(study_name=name, storage=f"sqlite:///{db}")


def _complete(db: Path) -> int:
    try:
        return len(_complete_numbers(db))
    except Exception:  # the database may not hold a study yet
        return 0


def _complete_numbers(db: Path) -> list[int]:
    return [t.number for t in _study(db).get_trials(states=(optuna.trial.TrialState.COMPLETE,))]


POSTGRES = os.environ.get("CHUNKBENCH_TEST_POSTGRES_URL")


@pytest.mark.skipif(
    not POSTGRES, reason="set CHUNKBENCH_TEST_POSTGRES_URL (scripts/postgres.sh starts a server; .ci/run does it)"
)
def test_two_processes_share_one_postgres_study(tmp_path):
    import uuid

    name = f"distributed-{uuid.uuid4().hex[:8]}"
    command = [
        sys.executable,
        "-m",
        "chunkbench.cli",
        *TUNE,
        "--n-trials",
        "16",
        "--storage",
        POSTGRES,
        "--study",
        name,
    ]
    procs = [
        subprocess.Popen(
            [*command, "--out", str(tmp_path / f"w{i}"), "--seed", str(i)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for i in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-2000:]
    trials = optuna.load_study(study_name=name, storage=POSTGRES).get_trials()
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 16 and len(trials) == 16, [t.state for t in trials]
    assert sorted(t.number for t in trials) == list(range(16))  # none lost, none twice
    workers = {t.user_attrs.get("worker") for t in trials}
    assert len(workers) == 2, "both processes ran trials"


def test_a_resumed_studys_trial_count_is_its_complete_trials():
    """An interrupted trial (left RUNNING, then replaced on resume) and a failed one are not 'trials' of the
    search: the header counts the complete ones and names the failed apart."""
    from chunkbench.tune.report_text import trials_text

    study = optuna.create_study()
    for value in (1.0, 2.0, 3.0):
        study.add_trial(optuna.trial.create_trial(value=value))
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING))
    assert trials_text(study) == "3 trials (1 failed)"
    assert trials_text(optuna.create_study()) == "0 trials"
