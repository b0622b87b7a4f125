"""Issue "hardening", the CLI side: bad input is one line and exit 2 before any work, never a traceback, a
hang or a silently wrong result; outputs are atomic; study names cannot escape or inject."""

import json
import os
import time

import optuna
import pytest
import yaml
from chunkbench.engine.engine import CpuClock

from chunkbench import files as outputs
from tests.conftest import SHORT_REQUESTS, run_cli

SIM = ["--backend", "sim", "--model", "llama-3-8b", "--no-progress"]


def fails_cleanly(args, capsys, message):
    code, _, err = run_cli(args, capsys)
    assert code == 2, err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


# ---- 3 and 9: NaN and out-of-range numbers are refused before any work ----


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--rate", "nan"], "--rate must be a finite number"),
        (["--burstiness", "nan", "--arrival", "gamma"], "--burstiness must be a finite number"),
        (["--time-scale", "nan", "--workload", "azure-conv"], "--time-scale must be a finite number"),
        (["--workload", "synthetic", "--prompt-len", "fixed:0"], "lengths below 1"),
        (["--workload", "synthetic", "--prompt-len", "fixed:inf"], "finite number"),
        (["--workload", "synthetic", "--prompt-len", "fixed:1e30"], "must be <="),
        (["--workload", "synthetic", "--output-len", "normal:10:-1"], "must be >= 0"),
        (["--max-model-len", "0"], "--max-model-len must be at least 2"),
        (["--max-model-len", "1"], "--max-model-len must be at least 2"),  # no room for a prompt and a token
        (["--max-num-batched-tokens", "9999999999999999999999"], "--max-num-batched-tokens must be at most"),
        (["--max-num-seqs", "9999999999999999999999"], "--max-num-seqs must be at most"),
        (["--rate", "1e-15", "--arrival", "constant"], "s; at most 1e+09 s (times are seconds in floating point"),
        (["--prompt-len", "fixed:40"], "--prompt-len shapes synthetic workloads"),  # not silently ignored
        (["--goodput", "ttft:nan"], "--goodput"),
        (["--seed", "-1"], "--seed"),
        (["--num-requests", "0"], "--num-requests"),
        (["--num-requests", "1203605602304"], "--num-requests must be <= 1e+07"),  # hypothesis: 8.8 TiB of lengths
        (["--warmup-steps", "-1"], "--warmup-steps"),
    ],
)
def test_bad_numbers_fail_before_any_work(flags, message, capsys, tmp_path):
    start = time.monotonic()
    fails_cleanly(["run", *SIM, "--out", str(tmp_path / "o"), *flags], capsys, message)
    assert time.monotonic() - start < 30 and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--rate", "nan"], "--rate must be a finite number"),
        (["--timeout", "-1"], "--timeout must be > 0"),
        (["--n-trials", "0"], "--n-trials"),
        (["--num-requests", "1203605602304"], "--num-requests must be <= 1e+07"),
        (["--max-sched-delay", "nan"], "--max-sched-delay"),
    ],
)
def test_bad_tune_numbers(flags, message, capsys, tmp_path):
    fails_cleanly(["tune", *SIM, "--sla-ttft", "1s", "--out", str(tmp_path / "t"), *flags], capsys, message)
    assert not (tmp_path / "t" / "report.html").exists()


# ---- 8: files and output locations ----


def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("header.csv", "prompt_len,output_len\n", "has no rows"),
        ("inf.csv", "prompt_len,output_len,arrival_time\n10,5,0\n12,5,inf\n", "not finite"),
        ("huge.csv", "prompt_len,output_len\n1e30,5\n", "absurd"),
        ("turns.json", json.dumps([{"conversations": "not a list"}]), "must be a list of turns"),
        ("empty.json", "", "--workload"),
    ],
)
def test_bad_workload_files(name, content, message, capsys, tmp_path):
    fails_cleanly(
        ["run", *SIM, "--workload", write(tmp_path, name, content), "--out", str(tmp_path / "o")], capsys, message
    )


def test_output_locations_are_checked_before_the_work(capsys, tmp_path):
    a_file = write(tmp_path, "file", "x")
    fails_cleanly(["run", *SIM, "--out", a_file], capsys, "is a file, not a folder")
    fails_cleanly(["run", *SIM, "--json", str(tmp_path)], capsys, "is a folder, not a file")
    fails_cleanly(["compare", "chunked", *SIM, "--json", a_file + "/x.json"], capsys, "cannot write under")
    fails_cleanly(["gate", "--suite", "ci", "--junit", a_file + "/j.xml"], capsys, "cannot write under")


SUITE = """[[case]]
name = "c"
policy = "chunked"
rate = {rate}
guard = [{{ metric = "p99_itl_ms", direction = "lower" }}]
"""


@pytest.mark.parametrize(
    "suite, baseline, message",
    [
        (SUITE.format(rate='"fast"'), None, "rate must be float or int"),
        (b"\xff\xfe\x00binary", None, "is not text"),
        (SUITE.format(rate=4.0), "not json", "is not a chunkbench gate baseline"),
        (SUITE.format(rate=4.0), json.dumps({"cases": {"c": {"p99_itl_ms": {"value": "x"}}}}), "not a chunkbench"),
        (SUITE.format(rate=4.0).replace("policy", "repeats = 0\npolicy"), None, "repeats must be >= 1"),
    ],
)
def test_corrupt_gate_suites_and_baselines(suite, baseline, message, capsys, tmp_path):
    base = write(tmp_path, "base.json", baseline) if baseline is not None else str(tmp_path / "none.json")
    fails_cleanly(["gate", "--suite", write(tmp_path, "s.toml", suite), "--baseline", base], capsys, message)


@pytest.mark.parametrize(
    "profile, message",
    [
        ("{not json", "--cost-model"),
        (json.dumps({"kind": "fitted"}), "--cost-model"),
    ],
)
def test_corrupt_profiles(profile, message, capsys, tmp_path):
    fails_cleanly(
        [
            "run",
            "--backend",
            "sim",
            "--model",
            "small",
            "--no-progress",
            "--cost-model",
            write(tmp_path, "p.json", profile),
            "--out",
            str(tmp_path / "o"),
        ],
        capsys,
        message,
    )


def test_profiles_with_nan_or_negative_coefficients_are_refused(capsys, tmp_path):
    from chunkbench.sim.fitted import FEATURE_NAMES, FittedCostModel

    good = FittedCostModel(tuple(1e-4 for _ in FEATURE_NAMES), "small", "cpu", 100)
    for bad in (float("nan"), -1e-3):
        path = tmp_path / f"{bad}.json"
        FittedCostModel(good.coefficients[:-1] + (bad,), "small", "cpu", 100).save(path)
        fails_cleanly(
            [
                "run",
                "--backend",
                "sim",
                "--model",
                "small",
                "--no-progress",
                "--cost-model",
                str(path),
                "--out",
                str(tmp_path / "o"),
            ],
            capsys,
            "cannot use",
        )


def test_other_bad_flags(capsys, tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"hidden_size": 64}))
    fails_cleanly(["generate", "--model", str(tmp_path / "hf")], capsys, "has no 'num_attention_heads'")
    fails_cleanly(
        ["bench", "--endpoint", "http://127.0.0.1:9/v1", "--max-concurrency", "-1"], capsys, "--max-concurrency"
    )
    fails_cleanly(["profile", "--max-chunk", "0"], capsys, "--max-chunk")
    fails_cleanly(["serve", "--port", "70000"], capsys, "--port")


# ---- 2: capacity without a feasible trial, or at another percentile ----


@pytest.mark.slow
@pytest.mark.usefixtures("settle_one")
@pytest.mark.parametrize("sla", ["1ms", "p90:50ms"])  # not 5 s: met by a burst of these requests at any rate
def test_capacity_reports_whatever_the_trials_found(sla, capsys, tmp_path):
    code, out, err = run_cli(
        [
            "tune",
            *SIM,
            "--objective",
            "capacity",
            "--sla-ttft",
            sla,
            "--n-trials",
            "2",
            "--num-requests",
            "20",
            *SHORT_REQUESTS,
            "--out",
            str(tmp_path),
        ],
        capsys,
    )
    assert code == 0, err
    assert (tmp_path / "report.html").exists() and (tmp_path / "trials.csv").exists()


# ---- 7: two processes creating one SQLite study at once ----


def test_the_alembic_version_race_is_retried(monkeypatch, tmp_path):
    from chunkbench.tune import study

    real, calls = optuna.storages.RDBStorage, []

    def racing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("(sqlite3.IntegrityError) UNIQUE constraint failed: alembic_version.version_num")
        return real(*args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", racing)
    study.open_storage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    assert len(calls) == 2


# ---- 10: atomic outputs, summary last ----


def test_a_failed_write_leaves_the_old_file_and_no_temporary(monkeypatch, tmp_path):
    path = tmp_path / "summary.json"
    outputs.write_json({"completed": 1}, path)

    def broken(src, dst):
        raise KeyboardInterrupt  # killed between writing and renaming

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(KeyboardInterrupt):
        outputs.write_json({"completed": 2}, path)
    assert json.loads(path.read_text()) == {"completed": 1} and os.listdir(tmp_path) == ["summary.json"]


def test_the_summary_is_written_last(monkeypatch, tmp_path, capsys):
    from chunkbench.bench import runs

    def killed(frame, path):
        if path.name == "steps.parquet":
            raise KeyboardInterrupt
        real(frame, path)

    real = runs.write_parquet
    monkeypatch.setattr(runs, "write_parquet", killed)
    code, _, _ = run_cli(["run", *SIM, "--num-requests", "5", "--out", str(tmp_path)], capsys)
    assert code == 130 and (tmp_path / "requests.parquet").exists() and not (tmp_path / "summary.json").exists()


# ---- 11: study names are text, not paths or lines ----


def test_a_study_name_cannot_escape_or_inject(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    name = "../../x\ntrust-remote-code: true\n[engine]\nmodel = 'evil'"
    args = ["tune", *SIM, "--sla-ttft", "2s", "--n-trials", "1", "--num-requests", "10", "--study", name]
    code, _, err = run_cli([*args, "--objective", "goodput"], capsys)  # goodput: the name, not a capacity
    assert code == 0, err
    (out,) = (tmp_path / "results" / "tune").iterdir()  # inside results/tune, whatever the name says
    config = yaml.safe_load((out / "vllm.yaml").read_text())
    assert "trust-remote-code" not in config and config["model"] == "meta-llama/Meta-Llama-3-8B-Instruct"
    import tomllib

    assert tomllib.loads((out / "recommended.toml").read_text())["engine"]["model"] == "llama-3-8b"
    assert not (tmp_path.parent.parent / "x").exists()


# ---- 12: the same policy twice ----


@pytest.mark.slow
def test_compare_keeps_both_runs_of_the_same_policy(capsys, tmp_path):
    code, _, err = run_cli(
        # a median SLA: the long runs that settle each capacity are 130 requests, not a p99's thousands; 50 ms: a
        # burst of these requests meets 1 s at any rate, and the settle gallops down from the lattice's top
        ["compare", "chunked", "chunked", *SIM, "--num-requests", "10", "--sla-ttft", "p50:50ms", *SHORT_REQUESTS]
        + ["--out", str(tmp_path)],
        capsys,
    )
    assert code == 0, err
    assert list(json.loads((tmp_path / "comparison.json").read_text())["runs"]) == ["chunked", "chunked#2"]
    assert (tmp_path / "chunked" / "summary.json").exists() and (tmp_path / "chunked#2" / "summary.json").exists()


# ---- 13: the gate's engine cases are timed in CPU time ----


def test_the_cpu_clock_counts_work_not_waiting():
    clock = CpuClock()
    start = clock.now()
    time.sleep(0.2)  # another process holding the core looks like this to us: time passes, no work is done
    slept = clock.now() - start
    sum(i * i for i in range(300_000))
    worked = clock.now() - start - slept
    clock.wait(5.0)  # idle until the next arrival: skipped, not slept
    assert slept < 0.05 and worked > 0.005 and clock.now() - start >= 5.0


def test_profiled_shapes_fit_the_kv_cache():
    """The profile's and the quick calibration's step shapes hold blocks of their own (step_output): every
    block they name must exist, or the step writes past the cache (found: --num-blocks 8 gave an IndexError)."""
    from chunkbench.backends.device_defaults import quick_grid
    from chunkbench.calibration.profile import profile_grid, step_output

    for num_blocks in (8, 16, 40, 64, 1024):
        for step in profile_grid(4096, 2048, num_blocks, 16) + quick_grid(4096, num_blocks, 16):
            used = [b for chunk in step_output(step, 16).chunks for b in chunk.block_table]
            assert max(used) < num_blocks, (num_blocks, step)
    assert len(quick_grid(4096, 1024, 16)) == 22 and len(profile_grid(4096, 2048, 10**6, 16)) == 59  # all of them


def test_a_kv_cache_too_small_to_calibrate_on_is_a_user_error(capsys, tmp_path):
    common = [
        "--model",
        "tiny",
        "--backend",
        "engine",
        "--num-blocks",
        "8",
        "--workload",
        "synthetic",
        "--prompt-len",
        "fixed:40",
        "--output-len",
        "fixed:4",
        "--no-progress",
    ]
    code, _, err = run_cli(["run", *common, "--num-requests", "3", "--out", str(tmp_path / "a")], capsys)
    assert code == 2 and "too small for the quick calibration" in err  # chunked's CPU step target needs it
    # Nothing to size: no cost model, the run goes ahead on 8 blocks
    code, _, _ = run_cli(
        ["run", *common, "--num-requests", "3", "--max-num-batched-tokens", "64", "--out", str(tmp_path / "b")], capsys
    )
    assert code == 0 and json.loads((tmp_path / "b" / "summary.json").read_text())["completed"] == 3
    code, _, err = run_cli(
        ["profile", "--model", "tiny", "--num-blocks", "8", "--out", str(tmp_path / "p.json")], capsys
    )
    assert code == 2 and "holds only 5 of the 55 step shapes the profile times: give --num-blocks" in err


def test_a_real_clock_run_does_not_wait_weeks_for_its_arrivals(capsys, tmp_path):
    fails_cleanly(
        [
            "run",
            "--model",
            "tiny",
            "--backend",
            "engine",
            "--no-progress",
            "--workload",
            "synthetic",
            "--num-requests",
            "3",
            "--rate",
            "1e-6",
            "--arrival",
            "constant",
            "--max-num-batched-tokens",
            "64",
            "--prompt-len",
            "fixed:40",
            "--output-len",
            "fixed:4",
            "--out",
            str(tmp_path / "o"),
        ],
        capsys,
        "of waiting on the engine; at most 7 days",
    )


def test_a_kv_cache_larger_than_free_memory_is_refused(monkeypatch):
    import torch
    from chunkbench.engine import executor
    from chunkbench.engine.config import EngineConfig

    from chunkbench.errors import ConfigError

    config = EngineConfig.create("tiny", num_blocks=1000)  # 1000 x 16 tokens x 4 layers x K and V x 512 B
    per_block = config.cache.kv_bytes_per_block(config.model, 4)
    monkeypatch.setattr(executor, "available_bytes", lambda device: 999 * per_block)
    with pytest.raises(ConfigError, match="--num-blocks 1,000 needs .* GiB of KV cache"):
        executor.kv_cache_blocks(config, torch.device("cpu"), torch.float32)
    monkeypatch.setattr(executor, "available_bytes", lambda device: 1000 * per_block)
    assert executor.kv_cache_blocks(config, torch.device("cpu"), torch.float32) == 1000


def test_a_cpu_kv_cache_sized_from_memory_fits_the_free_memory(monkeypatch):
    """Without --num-blocks the CPU cache takes at most --cpu-kv-cache-gib, and at most 90% of what is free
    (a container's limit included): 1 GiB of blocks in a container with 100 blocks' room would be killed."""
    import torch
    from chunkbench.engine import executor
    from chunkbench.engine.config import EngineConfig

    from chunkbench.errors import ConfigError

    config = EngineConfig.create("tiny", max_num_seqs=1024, max_model_len=2048)  # wants 1024 x 128 blocks
    per_block = config.cache.kv_bytes_per_block(config.model, 4)
    assert 2**30 // per_block < 1024 * 128  # so the 1 GiB below is the bound, not what the requests want
    cpu = torch.device("cpu")
    monkeypatch.setattr(executor, "available_bytes", lambda device: 100 * per_block)
    assert executor.kv_cache_blocks(config, cpu, torch.float32) == 90
    monkeypatch.setattr(executor, "available_bytes", lambda device: None)  # unknown: the flag's 1 GiB
    assert executor.kv_cache_blocks(config, cpu, torch.float32) == 2**30 // per_block
    half = EngineConfig.create("tiny", max_num_seqs=1024, max_model_len=2048, cpu_kv_cache_gib=0.5)
    assert executor.kv_cache_blocks(half, cpu, torch.float32) == 2**29 // per_block
    crumb = EngineConfig.create("tiny", cpu_kv_cache_gib=1e-9)
    with pytest.raises(ConfigError, match="single KV block .* raise --cpu-kv-cache-gib"):
        executor.kv_cache_blocks(crumb, cpu, torch.float32)


def test_a_containers_memory_limit_bounds_the_free_memory(tmp_path, monkeypatch):
    """A container sees the host's MemAvailable; the room under the tightest cgroup limit on its path is what it
    may allocate."""
    import torch
    from chunkbench.engine import executor

    def cgroup(folder, **files):
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name.replace("_", ".", 1)).write_text(text)

    # cgroup v2: the process's cgroup /job/step has no limit, its parent /job has one; the root has none
    root, membership = tmp_path / "v2", tmp_path / "v2-self"
    membership.write_text("0::/job/step\n")
    cgroup(root, memory_max="max\n", memory_current="1\n")
    cgroup(
        root / "job",
        memory_max="1000000\n",
        memory_current="700000\n",
        memory_stat="anon 500000\ninactive_file 200000\nactive_file 0\n",
    )
    cgroup(root / "job" / "step", memory_max="max\n", memory_current="600000\n")
    assert executor.cgroup_free_bytes(str(root), str(membership)) == 1000000 - (700000 - 200000)
    cgroup(root / "job" / "step", memory_max="300000\n", memory_current="600000\n")  # over its limit: no room
    assert executor.cgroup_free_bytes(str(root), str(membership)) == 0
    cgroup(root / "job", memory_max="max\n")
    cgroup(root / "job" / "step", memory_max="max\n")
    assert executor.cgroup_free_bytes(str(root), str(membership)) is None
    # cgroup v1's memory controller: hierarchical usage less total_inactive_file (not the cgroup's own inactive_file)
    root, membership = tmp_path / "v1", tmp_path / "v1-self"
    membership.write_text("5:cpu,cpuacct:/x\n4:memory:/docker/abc\n1:name=systemd:/x\n0::/\n")
    cgroup(
        root / "memory" / "docker" / "abc",
        memory_limit_in_bytes="4096000\n",
        memory_usage_in_bytes="96000\n",
        memory_stat="inactive_file 1000\ntotal_inactive_file 6000\n",
    )
    assert executor.cgroup_free_bytes(str(root), str(membership)) == 4096000 - (96000 - 6000)
    for unlimited in ("9223372036854771712", "9223372036854710272"):  # 4 KiB and 64 KiB pages
        cgroup(root / "memory" / "docker" / "abc", memory_limit_in_bytes=unlimited)
        assert executor.cgroup_free_bytes(str(root), str(membership)) is None
    # no membership file: the mounts' roots; nothing there at all: None
    cgroup(root / "memory", memory_limit_in_bytes="5000\n", memory_usage_in_bytes="1000\n")
    assert executor.cgroup_free_bytes(str(root), str(tmp_path / "missing")) == 4000
    assert executor.cgroup_free_bytes(str(tmp_path / "none"), str(tmp_path / "missing")) is None
    # the host's MemAvailable, unless the container's limit leaves less
    cpu = torch.device("cpu")
    monkeypatch.setattr(executor, "host_available_bytes", lambda: 50000)
    for limit, free in ((12345, 12345), (None, 50000), (10**9, 50000)):
        monkeypatch.setattr(executor, "cgroup_free_bytes", lambda limit=limit: limit)
        assert executor.available_bytes(cpu) == free
    monkeypatch.setattr(executor, "host_available_bytes", lambda: None)
    assert executor.available_bytes(cpu) == 10**9
    monkeypatch.setattr(executor, "cgroup_free_bytes", lambda: None)
    assert executor.available_bytes(cpu) is None


def test_lost_requests_are_said_on_the_terminal(capsys, tmp_path):
    code, out, _ = run_cli(
        [
            "run",
            "--model",
            "tiny",
            "--backend",
            "engine",
            "--no-progress",
            "--workload",
            "synthetic",
            "--num-requests",
            "5",
            "--prompt-len",
            "uniform:10:100",
            "--output-len",
            "fixed:4",
            "--max-num-batched-tokens",
            "64",
            "--num-blocks",
            "3",
            "--out",
            str(tmp_path / "o"),
        ],
        capsys,
    )
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert code == 0 and summary["failed"] > 0
    assert f"{summary['failed']} of 5 requests failed, e.g. request" in out and "the cache has 3" in out


def test_odd_profile_and_kernel_sizes_are_user_errors(capsys, tmp_path):
    fails_cleanly(
        [
            "profile",
            "--model",
            "tiny",
            "--max-model-len",
            "8",
            "--max-chunk",
            "64",
            "--no-progress",
            "--out",
            str(tmp_path / "p.json"),
        ],
        capsys,
        "no step shape of the profile fits --max-model-len 8",
    )
    fails_cleanly(["kernels", "check", "--device", "tpu"], capsys, "--device must be auto, cpu or cuda[:N]")
    space = write(tmp_path, "space.toml", "[space]\nmax_num_batched_tokens = [9999999999999999999999]\n")
    fails_cleanly(
        ["tune", *SIM, "--sla-ttft", "1s", "--space", space, "--out", str(tmp_path / "t")],
        capsys,
        "'max_num_batched_tokens' values must be at most",
    )
    space = write(
        tmp_path,
        "workload.toml",
        '[workload]\nname = "synthetic"\nprompt_len = "lognormal:abc"\n'
        "rate = 2.0\n[space]\nmax_num_batched_tokens = [512]\n",
    )
    fails_cleanly(
        ["tune", *SIM, "--sla-ttft", "1s", "--space", space, "--out", str(tmp_path / "t")],
        capsys,
        f"(set by [workload] prompt_len in --space {space})",
    )
    fails_cleanly(
        ["tune", *SIM, "--sla-ttft", "1s", "--rate", "-1", "--out", str(tmp_path / "t")],
        capsys,
        "--rate must be > 0, got -1.0",
    )  # a flag's own error blames no file
    space = write(tmp_path, "typed.toml", "[workload]\nprompt_len = 256\n[space]\nmax_num_batched_tokens = [512]\n")
    fails_cleanly(
        ["tune", *SIM, "--sla-ttft", "1s", "--space", space, "--out", str(tmp_path / "t")],
        capsys,
        "[workload] 'prompt_len' must be a string, got 256",
    )
