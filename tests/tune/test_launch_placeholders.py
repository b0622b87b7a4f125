"""`--launch` templates: the flag-list placeholders give the launched server exactly the trial's config."""

import shlex

import pytest
import typer
from chunkbench.engine.config import EngineConfig

from chunkbench.backends.launched import launch_command
from chunkbench.cli import app
from chunkbench.commands.options import ENGINE_OPTIONS, pick

CONFIGS = [
    dict(),  # every knob at its default: only the computed ones are passed
    dict(policy="chunked", max_num_batched_tokens=512, chunk_size=128, tile=64, max_partial_prefills=2),
    dict(policy="chunked", max_num_batched_tokens=1024, chunk_schedule=(512, 256), enable_prefix_caching=True),
    dict(policy="continuous", max_num_seqs=32),
    dict(policy="chunked", step_time_target_ms=50.0, num_chunks=4),
]


@pytest.mark.parametrize("knobs", CONFIGS)
def test_chunkbench_flags_rebuild_the_trial_config(knobs):
    config = EngineConfig.create("small", **knobs)
    command = shlex.split(launch_command("chunkbench serve --model {model} {chunkbench_flags}", config))
    assert "0" not in command  # an unset knob is left out, never passed as 0
    serve = typer.main.get_command(app).commands["serve"]
    params = serve.make_context("serve", command[2:]).params
    assert EngineConfig.create(params["model"], **pick(params, ENGINE_OPTIONS)) == config


def test_vllm_flags_leave_unset_caps_out():
    config = EngineConfig.create("small", policy="chunked", max_num_batched_tokens=512)
    command = launch_command("vllm serve {model} {vllm_flags}", config)
    assert "--max-num-batched-tokens 512" in command and "--enable-chunked-prefill" in command
    assert "long-prefill-token-threshold" not in command and "partial-prefills" not in command
    # the per-knob placeholders keep vLLM's convention: 0 means no cap
    assert launch_command("{long_prefill_token_threshold} {max_partial_prefills}", config) == "0 0"
