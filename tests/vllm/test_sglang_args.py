"""chunkbench's SGLang flags against SGLang 0.5.23's own parser: each config's flags (chunkbench/servers/sglang.py,
the {sglang_flags} of a --launch template) and its whole `python -m sglang.launch_server` command are parsed by
`prepare_server_args` (what launch_server parses with) in .venv-sglang (scripts/sglang_env.sh), and the parsed
ServerArgs must carry the intended values. The fake SGLang server's parser (tests/tune/fake_sglang.py) must read
them the same and know only flags SGLang has. Skipped in one line without .venv-sglang."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from chunkbench.engine.config import EngineConfig

from chunkbench import servers
from tests.conftest import REPO
from tests.tune.fake_sglang import build_parser

SGLANG_VENV = Path(os.environ.get("SGLANG_VENV", REPO / ".venv-sglang"))
SGLANG_PYTHON = SGLANG_VENV / "bin" / "python"
pytestmark = pytest.mark.skipif(
    not (SGLANG_VENV / ".installed-0.5.23").exists(),
    reason=f"needs {SGLANG_VENV} with SGLang 0.5.23's parser: run `make test-vllm` (scripts/sglang_env.sh)",
)

FIELDS = [
    "model_path",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "max_running_requests",
    "context_length",
    "mem_fraction_static",
    "tp_size",
    "kv_cache_dtype",
    "enable_mixed_chunk",
    "disable_radix_cache",
]
# SGLang's defaults for FIELDS but the context length, which every config carries (small's max_model_len, 8192),
# and what each config changes: the intended values, known in advance.
DEFAULTS = dict(zip(FIELDS, ["m", None, 16384, None, 8192, None, 1, "auto", False, False]))
CONFIGS = {  # name -> (EngineConfig.create keywords on "small", what the parsed ServerArgs must differ in)
    "chunked": (
        dict(policy="chunked", max_num_batched_tokens=2048, chunk_size=512, max_num_seqs=64),
        dict(chunked_prefill_size=512, max_prefill_tokens=2048, max_running_requests=64, enable_mixed_chunk=True),
    ),
    "chunked, budget only": (
        dict(policy="chunked", max_num_batched_tokens=1024),
        dict(chunked_prefill_size=1024, max_prefill_tokens=1024, enable_mixed_chunk=True),
    ),
    "progressive schedule": (
        dict(policy="chunked", max_num_batched_tokens=1024, chunk_schedule=(512, 256)),
        dict(chunked_prefill_size=512, max_prefill_tokens=1024, enable_mixed_chunk=True),
    ),
    "continuous": (
        dict(policy="continuous", max_num_batched_tokens=8192, max_num_seqs=32),
        dict(chunked_prefill_size=-1, max_prefill_tokens=8192, max_running_requests=32),
    ),
    "prefix caching off": (
        dict(max_num_batched_tokens=256, enable_prefix_caching=False),
        dict(chunked_prefill_size=256, max_prefill_tokens=256, disable_radix_cache=True),
    ),
    "fp8 cache, tensor parallel 2": (
        dict(kv_cache_dtype="fp8", tensor_parallel_size=2),
        dict(kv_cache_dtype="fp8_e4m3", tp_size=2),
    ),
    "max model len": (dict(max_model_len=4096), dict(context_length=4096)),
    "memory fraction": (dict(gpu_memory_utilization=0.8), dict(mem_fraction_static=0.8)),
}
# Flags SGLang has not got: a typo, and vLLM's name for --max-running-requests.
UNKNOWN = {"typo": ["--chunked-prefil-size", "512"], "vllm's name": ["--max-num-seqs", "8"]}

PARSE = """
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs, prepare_server_args
job = json.load(sys.stdin)
out = {"parsed": {}, "exit": {}, "options": {}}
for name, argv in job["parse"].items():
    args = prepare_server_args(argv)
    out["parsed"][name] = {f: getattr(args, f) for f in job["fields"]}
for name, argv in job["refuse"].items():
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            prepare_server_args(argv)
            out["exit"][name] = 0
        except SystemExit as exc:
            out["exit"][name] = exc.code
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
for flag, action in parser._option_string_actions.items():
    out["options"][flag] = {"dest": action.dest, "default": action.default, "choices": action.choices,
                            "takes_value": action.nargs != 0}
json.dump(out, sys.stdout, default=lambda value: sorted(value) if isinstance(value, set) else str(value))
"""


def flags_of(create: dict) -> list[str]:
    return [
        "--model-path",
        "m",
        *shlex.split(servers.get("sglang").option_flags(EngineConfig.create("small", **create))),
    ]


@pytest.fixture(scope="module")
def sglang() -> dict:
    """SGLang's own parse of every config's flags and command, its exit on the unknown flags, and its options."""
    parse = {name: flags_of(create) for name, (create, _) in CONFIGS.items()}
    command = servers.get("sglang").command(EngineConfig.create("llama-3-8b", **CONFIGS["chunked"][0]))
    parse["command"] = shlex.split(command.removeprefix("python -m sglang.launch_server"))
    refuse = {name: ["--model-path", "m", *flags] for name, flags in UNKNOWN.items()}
    job = json.dumps({"parse": parse, "refuse": refuse, "fields": FIELDS})
    done = subprocess.run([str(SGLANG_PYTHON), "-c", PARSE], input=job, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", CONFIGS)
def test_sglang_parses_chunkbench_s_flags_to_the_intended_values(sglang, name):
    assert sglang["parsed"][name] == DEFAULTS | CONFIGS[name][1], flags_of(CONFIGS[name][0])


def test_sglang_parses_the_whole_command_a_report_prints(sglang):
    """sglang.txt's command: the model's Hugging Face id as --model-path, the same flags."""
    assert sglang["parsed"]["command"] == DEFAULTS | CONFIGS["chunked"][1] | {
        "model_path": "meta-llama/Meta-Llama-3-8B-Instruct",
        "context_length": 8192,
    }


@pytest.mark.parametrize("name", CONFIGS)
def test_the_fake_server_reads_the_flags_as_sglang_does(sglang, name):
    args = vars(build_parser().parse_args(flags_of(CONFIGS[name][0])))
    assert {f: args[f] for f in FIELDS} == sglang["parsed"][name]


def test_an_unknown_flag_exits_2_in_sglang_and_in_the_fake(sglang, capsys):
    assert sglang["exit"] == {name: 2 for name in UNKNOWN}
    for flags in UNKNOWN.values():
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args(["--model-path", "m", *flags])
        assert exit_info.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_every_flag_of_the_fake_is_sglang_s_with_its_dest_default_and_choices(sglang):
    options = sglang["options"]
    for action in build_parser()._actions:
        for flag in action.option_strings:
            if flag in ("-h", "--help") or flag.startswith("--fake-"):
                continue
            assert flag in options, f"{flag}: SGLang 0.5.23 has no such flag"
            real = options[flag]
            assert (action.dest, action.nargs != 0) == (real["dest"], real["takes_value"]), flag
            assert json.loads(json.dumps(action.default)) == real["default"], flag
            if action.choices:
                assert sorted(action.choices) == sorted(real["choices"]), flag
