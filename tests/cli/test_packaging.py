"""A non-editable install works outside the checkout: the built-in search spaces, suites and traces are
package data, not files found next to the source."""

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from tests.conftest import REPO



@pytest.mark.slow
def test_a_wheel_installed_in_a_fresh_venv_tunes_from_another_directory(tmp_path):
    dist, venv, elsewhere = tmp_path / "dist", tmp_path / "venv", tmp_path / "elsewhere"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(REPO)], check=True, timeout=300)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    *map(str, dist.glob("chunkbench-*.whl"))], check=True, timeout=300)
    # The dependencies (torch, optuna, ...) come from this test's environment, appended after the new venv's
    # own packages by a path file: no network, and chunkbench itself resolves to the installed wheel.
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "chunkbench_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    elsewhere.mkdir()
    where = subprocess.run([str(python), "-c", "import chunkbench; print(chunkbench.__file__)"], cwd=elsewhere,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site)), where
    done = subprocess.run([str(venv / "bin" / "chunkbench"), "tune", "--model", "llama-3-8b", "--sla-ttft", "300ms",
                           "--n-trials", "5", "--no-progress"], cwd=elsewhere, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    (out,) = (elsewhere / "results" / "tune").iterdir()  # the study's folder, named after model and workload
    assert (out / "vllm.yaml").exists() and (out / "report.html").exists()
