"""A non-editable install works outside the checkout: the built-in search spaces, suites and traces are
package data, not files found next to the source; and a plain `pip install chunkbench` (no extras) serves a
Hugging Face directory: what that needs (safetensors, transformers, jinja2) is a runtime dependency."""

import contextlib
import os
import signal
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, free_port

SERVING_NEEDS = ("safetensors", "transformers", "jinja2")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv with the wheel built from this checkout: (its bin folder, the wheel)."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    dist, venv = tmp_path / "dist", tmp_path / "venv"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(REPO),
        ],
        check=True,
        timeout=300,
    )
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    (wheel,) = dist.glob("chunkbench-*.whl")
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)], check=True, timeout=300
    )
    # The dependencies (torch, optuna, ...) come from this test's environment, appended after the new venv's
    # own packages by a path file: no network, and chunkbench itself resolves to the installed wheel.
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "chunkbench_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin", wheel, site


@pytest.mark.slow
def test_a_wheel_installed_in_a_fresh_venv_tunes_from_another_directory(installed, tmp_path):
    bin_dir, _, site = installed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run(  # engine/ and kernels/ sit at the checkout's top; the wheel has them inside chunkbench/
        [
            str(bin_dir / "python"),
            "-c",
            "import chunkbench, chunkbench.engine.engine, chunkbench.kernels.reference as k; "
            "print(chunkbench.__file__, chunkbench.engine.engine.__file__, k.__file__)",
        ],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert where == [
        str(site / "chunkbench" / "__init__.py"),
        str(site / "chunkbench" / "engine" / "engine.py"),
        str(site / "chunkbench" / "kernels" / "reference.py"),
    ], where
    done = subprocess.run(
        [
            str(bin_dir / "chunkbench"),
            "tune",
            "--model",
            "llama-3-8b",
            "--workload",  # a median of short answers: the long runs that settle it stay a few hundred requests
            "random",
            "--random-output-len",
            "32",
            "--sla-ttft",
            "p50:300ms",
            "--n-trials",
            "5",
            "--no-progress",
        ],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    (out,) = (elsewhere / "results" / "tune").iterdir()  # the study's folder, named after model and workload
    assert (out / "vllm.yaml").exists() and (out / "report.html").exists()


def test_requires_python_is_the_version_the_code_needs():
    """vermin reads what each module uses (tomllib and asyncio.timeout are 3.11's): the least Python it names is
    the one pyproject.toml requires and the README states."""
    import tomllib

    needed = subprocess.run(
        [Path(sys.executable).parent / "vermin", "--no-tips", "--no-parse-comments", "chunkbench", "engine", "kernels"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    least = needed.split("Minimum required versions:", 1)[1].split()[0]
    required = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert required == f">={least}"
    assert f"Python {least}+" in (REPO / "README.md").read_text()


def requirements(wheel: Path) -> dict[str, str]:
    """The wheel's Requires-Dist lines, by distribution name (lower case)."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    out = {}
    for line in lines:
        if line.startswith("Requires-Dist:"):
            spec = line.removeprefix("Requires-Dist:").strip()
            name = spec.replace(">", " ").replace("<", " ").replace("=", " ").replace(";", " ").replace("[", " ")
            out.setdefault(name.split()[0].lower(), spec)
    return out


@pytest.mark.slow
def test_a_wheel_without_extras_serves_a_hugging_face_directory(installed, tmp_path):
    bin_dir, wheel, _ = installed
    required = requirements(wheel)
    for name in SERVING_NEEDS:  # required by the wheel itself, not behind an extra
        assert name in required and "extra ==" not in required[name], required.get(name)
    model = tmp_path / "tiny-llama"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "tiny_llama.py"), str(model)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [
                str(bin_dir / "chunkbench"),
                "serve",
                "--model",
                str(model),
                "--port",
                str(port),
                "--max-model-len",
                "256",
            ],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.3)
        assert process.poll() is None, log.read_text()[-3000:]
        done = httpx.post(base + "/v1/completions", json={"prompt": "the city", "max_tokens": 4}, timeout=60)
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 4, done.text
        chat = httpx.post(
            base + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            timeout=60,
        )
        assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 3, chat.text
        assert "Traceback" not in log.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
