"""--launch templates, --endpoint URLs and slot options are checked before anything is launched or written: any
input either forms a command line and an http(s) URL for every slot, or is refused in one line, exit 2."""

from __future__ import annotations

import shlex
from urllib.parse import urlsplit

import pytest
from chunkbench.engine.config import EngineConfig
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkbench.backends.launched import launch_command
from chunkbench.commands.tune import launch_slots
from chunkbench.errors import UserError
from chunkbench.launch.node import fill_endpoint, plan_slots
from tests.conftest import run_cli

CONFIG = EngineConfig.create("tiny", max_num_batched_tokens=512)
NODE = plan_slots(3, 9000)

TEMPLATE_PARTS = ["{", "}", "{{", "}}", "{port}", "{model}", "{slot}", "{vllm_flags}", "{foo}", "{0}", "{port!r}",
                  "{port:>5}", "'", '"', "\\", " ", "python", "-m", "--port", "serve", "x"]  # fmt: skip
ENDPOINT_PARTS = ["http://", "https://", "127.0.0.1", "localhost", ":", "{port}", "{slot}", "{gpus}", "{foo}", "{",
                  "}", "/v1", "notaurl", "8000", "99999", "0", "ftp://", ""]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.sampled_from(TEMPLATE_PARTS), max_size=8).map("".join),
    st.none() | st.lists(st.sampled_from(ENDPOINT_PARTS), max_size=6).map("".join),
)
def test_every_template_and_endpoint_is_refused_up_front_or_forms_for_every_slot(template, endpoint):
    try:
        url = launch_slots(template, endpoint, 1, NODE, CONFIG)
    except UserError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(("--launch", "--endpoint", "--backend launch")), exc
        return
    for slot in NODE:
        assert shlex.split(launch_command(template, CONFIG, slot))  # a command line, for every slot
        parts = urlsplit(fill_endpoint(url, slot))
        assert parts.scheme in ("http", "https") and parts.hostname and 1 <= parts.port <= 65535
        assert "{" not in parts.netloc


CASES = {
    "unknown endpoint placeholder": (
        ["--launch", "python s.py --port {port}", "--endpoint", "http://127.0.0.1:{foo}/v1"],
        "--endpoint: unknown placeholder {foo}",
    ),
    "unterminated quote": (["--launch", "sh -c 'unterminated {port}"], "(no closing quotation); check its quotes"),
    "endpoint not a URL": (
        ["--launch", "python s.py {port}", "--endpoint", "notaurl{port}"],
        "--endpoint: 'notaurl8000' is not an http(s) URL",
    ),
    "unbalanced brace": (["--launch", "python s.py {port"], "has a '{' without its '}'"),
    "stray closing brace": (["--launch", "python s.py {port}}"], "has a '}' without its '{'"),
    "port base 0": (["--launch", "s {port}", "--port-base", "0"], "--port-base must be a port from 1 to 65535"),
    "too few cpus": (
        ["--launch", "s {port}", "--cpus", "0-1", "--slots", "4"],
        "--slots 4 needs 4 of --cpus (1 per slot: --cpus-per-trial), and --cpus names 2",
    ),
    "no endpoint and no port": (["--launch", "python s.py --port 8000"], "needs --endpoint URL"),
    "no port in the endpoint": (
        ["--launch", "s {port}", "--endpoint", "http://{port}/v1"],
        "--endpoint: 'http://8000/v1' has no valid port (1-65535)",
    ),
    "{port} not the endpoint's port": (
        ["--launch", "s {port}", "--endpoint", "http://127.0.0.1:9999/v1?p={port}"],
        "--endpoint: 'http://127.0.0.1:9999/v1?p=8000' is not on slot 0's port 8000: put {port} where the port goes",
    ),
    "a port past 65535": (
        ["--launch", "s {port}", "--endpoint", "http://127.0.0.1:99999/v1"],
        "has no valid port (1-65535)",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_bad_launch_option_is_one_line_and_launches_nothing(case, tmp_path, capsys):
    args, message = CASES[case]
    out = tmp_path / "out"
    code, stdout, err = run_cli(["tune", "--model", "tiny", "--backend", "launch", *args, "--out", str(out)], capsys)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()
