"""The `chunkbench` command line: registers the commands (chunkbench/commands/, one module per group) and
turns user errors into one line on stderr and exit code 2."""

from __future__ import annotations

import sys

import typer
from typer.exceptions import TyperException

from chunkbench.commands import gate, generate, kernels, profile, run, serve, tune
from chunkbench.engine.config import ConfigError
from chunkbench.errors import StudyFailed

app = typer.Typer(
    name="chunkbench", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Measure and tune chunked prefill for LLM serving: token budgets, chunk caps, progressive chunk "
         "schedules and batching policies, against TTFT / inter-token-latency SLAs.")
for module in (generate, run, profile, tune, gate, serve, kernels):
    module.register(app)


@app.callback()
def _root() -> None:
    """Measure and tune chunked prefill for LLM serving."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one line on stderr and exit code 2, never a traceback."""
    try:
        code = app(args=argv, standalone_mode=False)  # returns the code of a typer.Exit
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("chunkbench: interrupted", file=sys.stderr)
        sys.exit(130)
    except TyperException as exc:  # usage errors: unknown flag, bad value type
        _error(exc.format_message())
    except ConfigError as exc:
        _error(str(exc))
    except StudyFailed as exc:
        _error(str(exc), code=1)
    sys.exit(code if isinstance(code, int) else 0)


def _error(message: str, code: int = 2) -> None:
    """One line, whatever the user's value held (any line break in it is shown as \\n), and an exit code: 2 for
    the user's input, 1 for a study that cannot go on (StudyFailed)."""
    print("chunkbench: error: " + "\\n".join(message.splitlines()), file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
