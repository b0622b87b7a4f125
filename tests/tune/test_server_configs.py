"""Emitted server configs set only what was chosen plus the deployment, with names the targeted release has;
a launched server that never comes up is quoted, kept in the trial's folder, and three in a row end the study."""

import sys

import pytest
import yaml
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.knobs import KNOBS, VLLM_VERSION

from chunkbench.errors import UserError
from chunkbench.servers.sglang import SGLANG
from chunkbench.servers.vllm import VLLM
from chunkbench.tune.space import SearchSpace
from tests.conftest import free_port, run_cli


def options(config):
    text = VLLM.yaml(config, ["header"])
    return yaml.safe_load(text), text


def test_a_vllm_config_sets_only_the_chosen_knobs_and_the_deployment():
    config = EngineConfig.create(
        "llama-3-8b",
        policy="chunked",
        max_num_batched_tokens=512,
        max_num_seqs=64,
        chunk_size=None,
        max_partial_prefills=2,
        seed=0,
        tensor_parallel_size=1,
        kv_cache_dtype="auto",
    )
    got, text = options(config)
    assert got == {
        "model": "meta-llama/Meta-Llama-3-8B-Instruct",
        "enable-chunked-prefill": True,
        "max-num-batched-tokens": 512,
        "max-num-seqs": 64,
        "max-model-len": 8192,
    }
    # chunkbench's defaults (block 16, prefix caching off, 0.9 of the memory) are never pinned on vLLM
    assert "block-size" not in text and "prefix-caching" not in text and "gpu-memory-utilization" not in text
    assert f"for vLLM {VLLM_VERSION}" in text
    assert "max_partial_prefills 2 is chunkbench-only" in text and "max-num-partial-prefills" not in got


def test_a_chosen_knob_is_set_even_at_chunkbench_default():
    off = EngineConfig.create("small", max_num_batched_tokens=256, enable_prefix_caching=False)
    assert options(off)[0]["enable-prefix-caching"] is False  # chosen: vLLM's own default is on
    assert "--disable-radix-cache" in SGLANG.command(off)
    assert "--disable-radix-cache" not in SGLANG.command(EngineConfig.create("small", max_num_batched_tokens=256))
    big = EngineConfig.create("llama-3-70b", tensor_parallel_size=4, kv_cache_dtype="fp8", block_size=32)
    got = options(big)[0]
    assert got["tensor-parallel-size"] == 4 and got["kv-cache-dtype"] == "fp8" and got["block-size"] == 32
    assert "--mem-fraction-static" not in SGLANG.command(big) and "--tp-size 4" in SGLANG.command(big)


def test_every_knob_with_a_vllm_option_names_it_in_dashes():
    for knob in KNOBS.values():
        assert knob.vllm is None or (knob.vllm == knob.vllm.lower() and "_" not in knob.vllm), knob.name


def test_the_built_in_space_leaves_chunkbench_only_knobs_out_for_vllm():
    space, note = SearchSpace.load("default").for_server(VLLM)
    assert set(space.values) == {
        "policy",
        "max_num_batched_tokens",
        "chunk_size",
        "max_num_seqs",
        "prefill_schedule_interval",
    }
    assert "max_partial_prefills" in note and "tile" in note and VLLM_VERSION in note
    with_vllm_options = {k for k, v in KNOBS.items() if v.vllm} | {"policy"}
    assert SearchSpace.load("latency").for_server(VLLM)[0].values.keys() <= with_vllm_options


def test_a_users_space_with_a_chunkbench_only_knob_is_refused_for_vllm(tmp_path):
    path = tmp_path / "space.toml"
    path.write_text("[space]\nmax_num_batched_tokens = [256, 512]\ntile = [0, 64]\n")
    with pytest.raises(UserError, match=r"vLLM 0.34.0 has no option for tile; leave it out"):
        SearchSpace.load(path).for_server(VLLM)
    path.write_text("[space]\nmax_num_batched_tokens = [256, 512]\ntile = [0]\n")  # 'off' alone changes nothing
    assert SearchSpace.load(path).for_server(VLLM)[1] is None


FAILING_SERVER = (
    f"{sys.executable} -c \"import sys; print('loading'); "
    "print('vllm: error: unrecognized arguments: --no-such-flag', file=sys.stderr); sys.exit(2)\" "
    "{model} {vllm_flags}"
)


def test_failed_launches_are_quoted_kept_and_end_the_study(tmp_path, capsys):
    out = tmp_path / "tune"
    code, stdout, stderr = run_cli(
        [
            "tune",
            "--model",
            "tiny",
            "--backend",
            "launch",
            "--launch",
            FAILING_SERVER,
            "--endpoint",
            f"http://127.0.0.1:{free_port()}/v1",
            "--n-trials",
            "5",
            "--num-requests",
            "4",
            "--out",
            str(out),
            "--no-progress",
        ],
        capsys,
    )
    assert code == 1, stderr
    line = stderr.strip()
    assert "\n" not in line and "3 launched servers in a row never became healthy" in line
    assert "vllm: error: unrecognized arguments: --no-such-flag" in line  # the server's own words
    logs = sorted(out.glob("trials/*/launch.log"))
    assert len(logs) == 3  # three launches, not an endless refill
    assert "unrecognized arguments" in logs[0].read_text() and logs[0].read_text().startswith("$ ")


def test_a_study_whose_trials_all_failed_ends_with_exit_1_not_an_empty_table():
    import optuna

    from chunkbench.errors import StudyFailed
    from chunkbench.tune.run import no_trial_completed

    study = optuna.create_study()
    trial = study.ask()
    trial.set_user_attr("error", "LaunchError: vllm: error: unrecognized arguments: --x")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    with pytest.raises(StudyFailed, match=r"no trial completed \(1 failed\); the last, trial 0: .*--x"):
        no_trial_completed(study)
    study.add_trial(optuna.trial.create_trial(value=1.0))
    no_trial_completed(study)  # one complete trial: something to recommend
