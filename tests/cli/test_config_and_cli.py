"""Invalid configs name their flag; the CLI turns user errors into one stderr line and exit code 2."""

import json
import subprocess
import sys

import pytest
from chunkbench.engine.config import EngineConfig, ModelConfig
from chunkbench.engine.model_config import MODEL_PRESETS

from chunkbench.errors import ConfigError
from tests.conftest import run_cli


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        (dict(policy="fcfs"), "--policy"),
        (dict(max_num_batched_tokens=0), "--max-num-batched-tokens"),
        (dict(policy="continuous", max_num_batched_tokens=512), "--max-num-batched-tokens"),
        (dict(chunk_size=-1), "--chunk-size"),
        (dict(chunk_schedule="256,0"), "--chunk-schedule"),
        (dict(chunk_schedule="big,small"), "--chunk-schedule"),
        (dict(tile=4096, max_num_batched_tokens=512), "--tile"),
        (dict(max_partial_prefills=0), "--max-partial-prefills"),
        (dict(block_size=12), "--block-size"),
        (dict(num_blocks=0), "--num-blocks"),
        (dict(max_model_len=100000), "--max-model-len"),
        (dict(device="tpu"), "--device"),
        (dict(attention_backend="flash"), "--attention-backend"),
        (dict(gpu_memory_utilization=1.5), "--gpu-memory-utilization"),
        (dict(cpu_kv_cache_gib=0.0), "--cpu-kv-cache-gib"),
        (dict(cpu_kv_cache_gib=float("inf")), "--cpu-kv-cache-gib"),
        (dict(cpu_kv_cache_gib=float("nan")), "--cpu-kv-cache-gib"),
        (dict(cpu_kv_cache_gib=1e300), "--cpu-kv-cache-gib"),  # its bytes would overflow to inf
    ],
)
def test_invalid_config_names_the_flag(kwargs, flag):
    with pytest.raises(ConfigError, match=flag):
        EngineConfig.create("tiny", **kwargs)


def test_presets_have_their_published_sizes():
    billions = {name: MODEL_PRESETS[name].num_params / 1e9 for name in MODEL_PRESETS}
    assert 0.001 < billions["tiny"] < 0.01
    assert 0.09 < billions["small"] < 0.15
    assert abs(billions["llama-3.2-1b"] - 1.24) < 0.02
    assert abs(billions["llama-3-8b"] - 8.03) < 0.02
    assert abs(billions["llama-3-70b"] - 70.6) < 0.2
    assert abs(billions["mistral-7b"] - 7.25) < 0.02
    assert abs(billions["qwen2.5-7b"] - 7.62) < 0.02
    assert MODEL_PRESETS["qwen2.5-7b"].qkv_bias
    assert ModelConfig.from_name("llama-3-8b") is MODEL_PRESETS["llama-3-8b"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "--policy", "fcfs"], "--policy must be one of"),
        (["generate", "--max-num-batched-tokens", "-3"], "--max-num-batched-tokens must be > 0"),
        (["generate", "--model", "nope"], "unknown model 'nope'"),
        (["generate", "--bogus"], "No such option: --bogus"),
        (["generate", "--max-tokens", "x"], "--max-tokens"),
        (["generate", "--max-tokens", "0"], "max_tokens must be >= 1"),
        (["generate", "--prompt-lens", "a,b"], "--prompt-lens must be comma-separated integers"),
        (["generate", "--model", "/nonexistent/dir"], "unknown model"),
    ],
)
def test_cli_user_errors_are_one_line_and_exit_2(args, message, capsys):
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("chunkbench: error: ") and message in err
    assert "Traceback" not in err


def test_cli_generate_serves_the_rest_and_reports_the_rejected(tmp_path, capsys):
    out = tmp_path / "out.json"
    code, _, err = run_cli(
        ["generate", "--prompt-lens", "37,3000,5", "--max-tokens", "4", "--num-blocks", "64", "--json", str(out)],
        capsys,
    )
    assert code == 2
    assert err.strip() == (
        "chunkbench: error: request 1 rejected: prompt has 3000 tokens, more than max_model_len (2048)"
    )
    results = json.loads(out.read_text())
    assert [len(r["output_token_ids"]) for r in results] == [4, 0, 4]
    assert [r["finish_reason"] for r in results] == ["length", "rejected", "length"]


def test_cli_generate_matches_the_python_api(tmp_path, capsys):
    from chunkbench import LLM

    out = tmp_path / "out.json"
    code, _, _ = run_cli(
        [
            "generate",
            "--prompt-lens",
            "37,300",
            "--max-tokens",
            "8",
            "--num-blocks",
            "64",
            "--max-num-batched-tokens",
            "64",
            "--json",
            str(out),
        ],
        capsys,
    )
    assert code == 0
    results = json.loads(out.read_text())
    llm = LLM("tiny", policy="static", num_blocks=64)
    assert llm.generate([r["prompt_token_ids"] for r in results], max_tokens=8) == [
        r["output_token_ids"] for r in results
    ]


def test_scheduler_imports_without_torch():
    # A fresh interpreter: importing the scheduler, the engine loop and the simulator must not load torch
    # (the simulator runs where torch is slow to import, and its hot loop must stay plain Python).
    code = (
        "import sys\n"
        "import chunkbench.engine.scheduler, chunkbench.engine.engine, chunkbench.sim.executor, "
        "chunkbench.sim.roofline, chunkbench.sim.fitted\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
