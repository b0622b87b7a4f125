"""Shared test set-up and helpers. Tests are grouped by layer: engine/, sim/, runs/, tune/, serving/, cli/.

Without CUDA, Triton kernels run under the interpreter; it must be on before triton is imported."""

import os
import socket
import sys
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One test process per core (make test): one thread each, here and in the commands a test starts. OpenMP
    # threads of two processes on one core spin against each other (engine tests ran 9x slower).
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)  # should a plugin have imported torch before the variable was set

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parent.parent
# The checkout goes last on sys.path (pytest's --import-mode=append; `python -m pytest` puts it first): its
# kernels/ (installed as chunkbench.kernels) would hide Hugging Face's `kernels`, which transformers imports.
sys.path[:] = [p for p in sys.path if p not in ("", str(REPO))] + [str(REPO)]
VLLM_TIER = REPO / "tests" / "vllm"


def pytest_collection_modifyitems(config, items):
    """Tests under tests/vllm/ are the vLLM tier: marked `vllm`, and skipped in one line without its venv. The
    `slow` tests go first (a stable sort: the same order in every process): on two processes, a minute-long
    test that starts last keeps one busy while the other idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    venv = Path(os.environ.get("VLLM_VENV", REPO / ".venv-vllm"))
    ready = (venv / "bin" / "vllm").exists()
    skip = pytest.mark.skip(reason=f"the vLLM tier needs {venv} with vLLM 0.32.0: run `make test-vllm`")
    for item in items:
        if VLLM_TIER in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.vllm)
            if not ready:
                item.add_marker(skip)


# A workload of short requests (128 prompt tokens, 8 output): for the checks of a capacity search that hold on any
# workload, whose long runs cost their requests' tokens
SHORT_REQUESTS = ["--workload", "random", "--random-input-len", "128", "--random-output-len", "8"]


@pytest.fixture
def settle_one(monkeypatch):
    """A simulated capacity tune settles its best configuration alone on long runs (tune/settle.py SETTLE_TOP;
    the product settles three): for the tests of what a tune does around a settle (flags, jobs, the figure),
    not of the runner-up's margin, which the killed tune's rerun (tests/tune/test_tuner.py) and the objective
    registry's test keep. The first settle is most of a small tune: it gallops down from a short run's
    flattering capacity."""
    from chunkbench.tune import settle

    monkeypatch.setattr(settle, "SETTLE_TOP", 1)


def run_cli(args, capsys):
    """`chunkbench ARGS` in this process: (exit code, stdout, stderr). An uncaught exception fails the test."""
    from chunkbench.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count: int) -> int:
    """A base port with `count` free ports from it up (launch slots listen on base + i)."""
    while True:
        base = free_port()
        if base + count < 65535 and all(_bindable(base + i) for i in range(count)):
            return base


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@pytest.fixture
def fine_gil_switching():
    """The server's thread and the client share this process's GIL: switch every 0.5 ms (not 5), so a send is
    stamped when it happens. Test modules that time a scripted server (tests/serving/scripted_server.py) use it."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    yield
    sys.setswitchinterval(old)
