"""Writing results: every file atomically (a temporary file in the same folder, then a rename), so a run
killed mid-write leaves the previous file or none, never half of one; JSON without NaN or Infinity."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from chunkbench.errors import UserError


def write_bytes(data: bytes, path: Path) -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text(text: str, path: Path) -> None:
    write_bytes(text.encode(), path)


def json_safe(value):
    """NaN and infinities become null (most JSON parsers reject them), numpy scalars Python ones;
    containers are walked."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_json(payload, path: Path) -> None:
    write_text(json.dumps(json_safe(payload), indent=2, allow_nan=False) + "\n", path)


def write_parquet(frame, path: Path) -> None:
    import io

    buffer = io.BytesIO()
    frame.to_parquet(buffer)
    write_bytes(buffer.getvalue(), path)


def check_writable(path: Path | None, flag: str, folder: bool = False) -> None:
    """Fail before any work starts when an output location cannot be written: a file where a folder is
    needed (or the reverse), or a parent that cannot be created."""
    if path is None:
        return
    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        raise UserError(f"{flag}: {path} is a file, not a folder")
    if not folder and path.is_dir():
        raise UserError(f"{flag}: {path} is a folder, not a file")
    parent = path if folder else path.parent
    existing = next((p for p in [parent, *parent.parents] if p.exists()), None)
    if existing is not None and (not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK)):
        raise UserError(f"{flag}: cannot write under {existing}")


def write_figure(fig, path: Path, dpi: int = 110) -> None:
    """A matplotlib figure as PNG."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    write_bytes(buffer.getvalue(), path)
