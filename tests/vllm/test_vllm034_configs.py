"""chunkbench's configs for vLLM 0.34 against 0.34's own argument parser (EngineArgs.add_cli_args, in
.venv-vllm034: the CUDA wheel's Python, which parses on this CPU): every option chunkbench names for 0.34 exists
there, and an emitted vllm.yaml and `vllm serve` flags parse to the values the config meant."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.knobs import KNOBS

from chunkbench.servers.vllm import VLLM
from tests.conftest import REPO

VLLM034_PYTHON = Path(os.environ.get("VLLM034_VENV", REPO / ".venv-vllm034")) / "bin" / "python"
TARGET = "0.34.0"

# Reads a JSON list of argument lists on stdin; prints, per list, its parsed namespace (or the parser's error).
PARSE = """
import contextlib, io, json, sys
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
out = {"options": sorted({s for a in parser._actions for s in a.option_strings}), "parsed": []}
for argv in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = vars(parser.parse_args(argv))
        out["parsed"].append({k: v for k, v in args.items() if isinstance(v, (int, float, str, bool))})
    except SystemExit:
        out["parsed"].append({"error": err.getvalue().strip().splitlines()[-1]})
print(json.dumps(out))
"""

CONFIGS = {
    "chunked": dict(max_num_batched_tokens=1024, max_num_seqs=64, chunk_size=256),
    "cadence": dict(max_num_batched_tokens=2048, prefill_schedule_interval=4),
    "admission": dict(
        max_num_batched_tokens=512, enable_prefix_caching=True, cache_aware_admission_window=8,
        cache_aware_admission_threshold=0.25,
    ),
    "cache-off": dict(max_num_batched_tokens=512, enable_prefix_caching=False),
    "continuous": dict(policy="continuous", max_num_batched_tokens=8192),
    "deployment": dict(max_num_batched_tokens=4096, tensor_parallel_size=2, kv_cache_dtype="fp8"),
    "scheduler-knobs": dict(
        max_num_batched_tokens=512, scheduler_reserve_full_isl=False, long_prefill_token_threshold_adaptive=True,
        max_num_active_seqs=16, watermark=0.05,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict:
    """0.34's parse of each config's vllm.yaml (`--config`) and of its `vllm serve` flags, and its options."""
    if not VLLM034_PYTHON.exists():
        pytest.skip("vLLM 0.34's parser needs .venv-vllm034 (scripts/vllm034_env.sh): run `make test-vllm`")
    folder = tmp_path_factory.mktemp("vllm034")
    jobs = []
    for name, knobs in CONFIGS.items():
        config = EngineConfig.create("llama-3-8b", **knobs)
        path = folder / f"{name}.yaml"
        path.write_text(VLLM.yaml(config, ["header"], TARGET))
        flags = VLLM.option_flags(config, TARGET).split()
        jobs += [["--config", str(path)], ["--model", "m", *flags]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")} | {"VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run(
        [str(VLLM034_PYTHON), "-c", PARSE], input=json.dumps(jobs), capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    results = iter(out["parsed"])
    return {"options": set(out["options"])} | {name: (next(results), next(results)) for name in CONFIGS}


def test_every_option_chunkbench_names_for_034_exists_there(parsed):
    options = parsed["options"]
    assert "--disable-prefix-caching" in options and "--enable-prefix-caching" in options
    for knob in KNOBS.values():
        if knob.in_vllm(TARGET):
            assert f"--{knob.vllm}" in options, f"{knob.name}: vLLM {TARGET} has no --{knob.vllm}"


@pytest.mark.parametrize("name", CONFIGS)
def test_the_yaml_and_the_flags_parse_to_the_configs_values(parsed, name):
    from_yaml, from_flags = parsed[name]
    assert "error" not in from_yaml and "error" not in from_flags, (from_yaml, from_flags)
    config = EngineConfig.create("llama-3-8b", **CONFIGS[name])
    meant = {k.replace("-", "_"): v for k, v in yaml.safe_load(VLLM.yaml(config, [], TARGET)).items() if k != "model"}
    assert meant, name
    for key, value in meant.items():
        assert from_yaml[key] == value, (key, from_yaml[key], value)
        assert from_flags[key] == value, (key, from_flags[key], value)
    knobs = CONFIGS[name]
    for knob in ("prefill_schedule_interval", "cache_aware_admission_window", "enable_prefix_caching"):
        if knob in knobs:
            assert from_yaml[knob] == knobs[knob], knob
