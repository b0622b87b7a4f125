"""vllm bench serve's command line, read by `chunkbench bench`: its names for the server, the API and the
dataset, and the options it has that change nothing here, accepted so that its command lines run unchanged."""

from __future__ import annotations

from typing import Annotated

import typer

from chunkbench.errors import UserError, check_number
from chunkbench.workloads.vllm_datasets import DATASETS

Text = str | None
VLLM_FLAGS = {  # bench's keyword -> (annotated type, default)
    "dataset_name": (
        Annotated[
            Text,
            typer.Option(
                help="vllm bench serve's name for --workload: "
                + ", ".join(DATASETS)
                + " (with --dataset-path for a file)."
            ),
        ],
        None,
    ),
    "dataset_path": (
        Annotated[Text, typer.Option(help="The file (hf: folder or cached name) of --dataset-name.")],
        None,
    ),
    "base_url": (
        Annotated[
            Text,
            typer.Option(
                help="vllm bench serve's server URL without /v1, e.g. http://127.0.0.1:8000; with its --endpoint path."
            ),
        ],
        None,
    ),
    "host": (
        Annotated[
            Text, typer.Option(help="Server host, when no --endpoint URL or --base-url (vLLM's; default 127.0.0.1).")
        ],
        None,
    ),
    "port": (Annotated[int | None, typer.Option(help="Server port with --host (vLLM's; default 8000).")], None),
    "vllm_backend": (
        Annotated[
            Text,
            typer.Option(
                "--backend",
                help="vllm bench serve's client: vllm or openai (--api completions), openai-chat (--api chat).",
            ),
        ],
        None,
    ),
    "served_model_name": (Annotated[Text, typer.Option(help="Model name to send (vLLM's; wins over --model).")], None),
}
IGNORED = {  # vllm bench serve's options that change nothing here, and why
    "trust_remote_code": "no remote code is run",
    "disable_tqdm": "bench shows no bar",
    "disable_shuffle": "file rows are taken in order unless --shuffle",
    "no_oversample": "a file gives at most its rows",
    "skip_chat_template": "no chat template is applied to count tokens",
    "ignore_eos": "ignore_eos is always sent",
}
VLLM_FLAGS |= {
    name: (
        Annotated[bool, typer.Option("--" + name.replace("_", "-"), help=f"vLLM's; accepted and ignored: {why}.")],
        False,
    )
    for name, why in IGNORED.items()
}
VLLM_FLAGS["no_self_timed"] = (
    Annotated[bool, typer.Option(help="timed_trace: send on --request-rate's schedule, not the timestamps (vLLM's).")],
    False,
)
API_PATHS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
BACKENDS = {"vllm": "completions", "openai": "completions", "openai-chat": "chat"}


def server_url(
    endpoint: str | None, base_url: str | None, host: str | None, port: int | None, backend: str | None, api: str
) -> tuple[str, str]:
    """(the /v1 base URL, the API) from chunkbench's --endpoint URL or vLLM's --base-url/--host/--port, whose
    --endpoint is an API path (/v1/completions) and --backend the client kind."""
    if port is not None:
        check_number("--port", port, low=1, high=65535, integer=True)
    if backend is not None:
        if backend not in BACKENDS:
            raise UserError(
                f"--backend must be one of {', '.join(BACKENDS)} (vllm bench serve's clients that "
                f"chunkbench speaks), got '{backend}'"
            )
        api = BACKENDS[backend]
    if endpoint is not None and endpoint.startswith("/"):
        if endpoint not in API_PATHS:
            raise UserError(f"--endpoint {endpoint}: an API path must be one of {', '.join(API_PATHS)}")
        api, endpoint = API_PATHS[endpoint], None
    if endpoint is not None:
        return endpoint, api
    if base_url is None:
        base_url = f"http://{host or '127.0.0.1'}:{port or 8000}"
    return base_url.rstrip("/").removesuffix("/v1") + "/v1", api


def dataset_workload(name: str, path: str | None) -> str:
    """--dataset-name and --dataset-path as a --workload."""
    if name not in DATASETS:
        raise UserError(f"--dataset-name: chunkbench reads {', '.join(DATASETS)}, got '{name}'")
    if DATASETS[name].takes_path:
        if path is None:
            raise UserError(f"--dataset-name {name} needs --dataset-path")
        return f"{name}:{path}"
    return name
