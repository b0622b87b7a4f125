"""Server kinds (chunkbench/servers/): a registered kind is launched, searched within what it can express and
written for; vLLM's configs and flags name only the targeted release's options; a search leaves out what the
targeted release has not got."""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
import pytest
import yaml
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.knobs import Knob

from chunkbench import servers
from chunkbench.backends.launched import launch_command
from chunkbench.errors import UserError
from chunkbench.servers.kind import ServerKind
from chunkbench.servers.vllm import VLLM
from chunkbench.tune.space import SearchSpace
from tests.conftest import run_cli
from tests.tune.test_slots import tune_args

SLOW_SERVER = Path(__file__).with_name("slow_server.py")


class ToyKind(ServerKind):
    """A server with two knobs, passed as one word: --label budget=512,seqs=64."""

    def expresses(self, knob: Knob, version: str = "") -> bool:
        return knob.name in ("max_num_batched_tokens", "max_num_seqs")

    def option_flags(self, config: EngineConfig, version: str = "") -> str:
        s = config.scheduler
        return f"budget={s.max_num_batched_tokens},seqs={s.max_num_seqs}"

    def command(self, config: EngineConfig, version: str = "") -> str:
        return f"toy-server --label {self.option_flags(config)}"


TOY = ToyKind(name="toy", title="Toy", pattern=r"slow_server\.py", versions=("1.0",), overhead_s=1e-3)


@pytest.fixture
def toy():
    servers.register(TOY)
    yield TOY
    servers.unregister(TOY.name)


def test_a_registered_kind_runs_a_launched_tune_end_to_end(toy, tmp_path, capsys):
    out = tmp_path / "toy"
    launch = f"{sys.executable} {SLOW_SERVER} --port {{port}} --token-ms 1 --label {{toy_flags}}"
    code, stdout, err = run_cli(tune_args(out, launch, n_trials=3), capsys)
    assert code == 0, err
    flat = " ".join(stdout.split())
    assert "launching Toy 1.0" in flat
    assert "Toy 1.0 has no option for chunk_size, chunk_schedule, tile, max_partial_prefills" in flat
    url = f"sqlite:///{out / 'study.db'}"
    study = optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    for trial in study.trials:  # each server got the trial's knobs through {toy_flags}, and only those searched
        knobs = trial.user_attrs["knobs"]
        assert {k for k, v in knobs.items() if v not in (None, 0, (), [])} == {
            "policy",
            "max_num_batched_tokens",
            "max_num_seqs",
        }
        log = (out / "trials" / str(trial.number) / "launch.log").read_text()
        assert f"label=budget={knobs['max_num_batched_tokens']},seqs={knobs['max_num_seqs']}" in log
    assert (out / "toy.txt").read_text().startswith("toy-server --label budget=")
    assert "toy: toy-server --label" in flat


def test_the_launched_kind_is_recognised_by_its_command_or_its_placeholder():
    assert servers.recognise("vllm serve {model} {vllm_flags}") is VLLM
    assert servers.recognise("/opt/venv/bin/vllm serve m --port {port}") is VLLM
    assert servers.recognise("python -m vllm.entrypoints.openai.api_server --model m") is VLLM
    assert servers.recognise("python -m sglang.launch_server --model-path {model} {sglang_flags}").name == "sglang"
    assert servers.recognise("my-server {sglang_flags}").name == "sglang"
    assert servers.recognise("chunkbench serve --model small {chunkbench_flags}").name == "chunkbench"
    assert servers.recognise("./my-own-server --port {port}") is None


def config_with(**knobs) -> EngineConfig:
    return EngineConfig.create("llama-3-8b", max_num_batched_tokens=1024, **knobs)


def test_vllms_config_names_only_the_targeted_releases_options():
    config = config_with(prefill_schedule_interval=2, enable_prefix_caching=False, cache_aware_admission_window=8)
    new = yaml.safe_load(VLLM.yaml(config, [], "0.34.0"))
    assert new["prefill-schedule-interval"] == 2 and new["cache-aware-admission-window"] == 8
    assert "--disable-prefix-caching" in VLLM.command(config, "0.34.0")  # 0.33 pairs --enable-X with --disable-X
    mid = VLLM.yaml(config, [], "0.33.0")
    assert yaml.safe_load(mid)["prefill-schedule-interval"] == 2 and "cache-aware-admission-window" not in (
        yaml.safe_load(mid)
    )
    assert (
        "cache_aware_admission_window 8: vLLM 0.33.0 has no cache-aware-admission-window (it came in vLLM 0.34.0)"
        in mid
    )
    old = VLLM.yaml(config, [], "0.32.0")
    assert "prefill-schedule-interval" not in yaml.safe_load(old) and "for vLLM 0.32.0" in old
    assert "prefill_schedule_interval 2: vLLM 0.32.0 has no prefill-schedule-interval (it came in vLLM 0.33.0)" in old
    assert "--no-enable-prefix-caching" in VLLM.command(config, "0.32.0")
    assert "prefill-schedule-interval" not in VLLM.command(config, "0.32.0")
    # the launch placeholder carries the targeted release's flags
    assert "--prefill-schedule-interval 2" in launch_command("vllm serve {model} {vllm_flags}", config)
    assert "--prefill-schedule-interval" not in launch_command(
        "vllm serve {model} {vllm_flags}", config, versions={"vllm": "0.32.0"}
    )


def test_a_release_chunkbench_does_not_target_is_refused_and_a_patch_level_is_its_release():
    with pytest.raises(UserError, match="vLLM 0.31.0: chunkbench targets vLLM 0.32.0, 0.33.0, 0.34.0"):
        VLLM.target("0.31.0")
    assert VLLM.target("0.34.1") == "0.34.0" and VLLM.target("0.32.0+cpu") == "0.32.0" and VLLM.target(None) == "0.34.0"


def test_a_search_leaves_out_what_the_targeted_release_has_not_got(tmp_path):
    default = SearchSpace.load("default")
    assert "prefill_schedule_interval" in default.for_server(VLLM, "0.34.0", launched=False)[0].values
    space, note = default.for_server(VLLM, "0.32.0", launched=False)
    assert "prefill_schedule_interval" not in space.values and "tile" in space.values  # the simulator has tile
    assert note == "vLLM 0.32.0 has no option for prefill_schedule_interval: left out of the search"
    prefix = SearchSpace.load("prefix")
    assert "cache_aware_admission_window" not in prefix.for_server(VLLM, "0.33.0", launched=False)[0].values
    own = tmp_path / "space.toml"
    own.write_text("[space]\nmax_num_batched_tokens = [512]\nprefill_schedule_interval = [1, 2]\n")
    with pytest.raises(UserError, match="vLLM 0.32.0 has no option for prefill_schedule_interval; leave it out"):
        SearchSpace.load(own).for_server(VLLM, "0.32.0", launched=False)


def test_cache_aware_admission_is_searched_only_with_the_prefix_cache_on():
    points = SearchSpace.load("prefix").points()
    assert {p.get("cache_aware_admission_window") for p in points if p["enable_prefix_caching"]} == {0, 8}
    assert all("cache_aware_admission_window" not in p for p in points if not p["enable_prefix_caching"])


def test_a_tune_for_an_unknown_vllm_release_is_refused_in_one_line(tmp_path, capsys):
    code, stdout, err = run_cli(["tune", "--vllm-version", "0.29.0", "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and "--vllm-version must be one of 0.32.0" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


FAKE_SGLANG = Path(__file__).with_name("fake_sglang.py")


def test_a_launched_tune_of_sglang_completes_with_its_flags(tmp_path, capsys):
    """The fake SGLang (tests/tune/fake_sglang.py: SGLang 0.5.23's flags, health and streams) launched per trial
    with {sglang_flags}; it exits 2 on a flag SGLang has not got, so every complete trial parsed its flags."""
    out = tmp_path / "sglang"
    launch = f"{sys.executable} {FAKE_SGLANG} --model-path {{model}} {{sglang_flags}} --port {{port}} --enable-metrics"
    code, stdout, err = run_cli(tune_args(out, launch, n_trials=3), capsys)
    assert code == 0, err
    flat = " ".join(stdout.split())
    assert "launching SGLang 0.5.23" in flat and "SGLang 0.5.23 has no option for" in flat
    url = f"sqlite:///{out / 'study.db'}"
    study = optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    for trial in study.trials:
        log = (out / "trials" / str(trial.number) / "launch.log").read_text()
        budget = trial.user_attrs["knobs"]["max_num_batched_tokens"]
        assert f"'max_prefill_tokens': {budget}" in log  # the server ran with the trial's budget
        assert trial.user_attrs["metrics"].get("server_metrics") == "sglang"  # its /metrics were read
    assert (out / "sglang.txt").read_text().startswith("python -m sglang.launch_server --model-path ")
