"""The `chunkbench` command line: registers the commands (chunkbench/commands/, one module per group),
reflows their help into paragraphs, turns user errors into one line on stderr and exit code 2, and Python
warnings into one `chunkbench: warning: ...` line each."""

from __future__ import annotations

import inspect
import signal
import sys
import typing
import warnings

import typer
import typer.models
from typer.exceptions import TyperException

from chunkbench.commands import compare, gate, generate, kernels, profile, run, serve, tune
from chunkbench.errors import ConfigError, Interrupted, StudyFailed, show_warning

app = typer.Typer(
    name="chunkbench",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Measure and tune chunked prefill for LLM serving: token budgets, chunk caps, progressive chunk "
    "schedules and batching policies, against TTFT / inter-token-latency SLAs.",
)
for module in (generate, run, compare, profile, tune, gate, serve, kernels):
    module.register(app)


def reflow(text: str | None) -> str | None:
    """Join the hard-wrapped lines of each paragraph (paragraphs are separated by a blank line), so that rich
    wraps the text to the terminal instead of breaking it where the source line ended. A paragraph that
    starts with click's \\b marker keeps its lines. Idempotent."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(
        p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines()) for p in paragraphs
    )


def _parameter_infos(callback: typing.Callable[..., typing.Any]) -> list[typer.models.ParameterInfo]:
    """The typer.Option/typer.Argument objects of a command: in Annotated metadata or as defaults."""
    hints = typing.get_type_hints(callback, include_extras=True)
    infos = []
    for name, parameter in inspect.signature(callback).parameters.items():
        metadata = getattr(hints.get(name), "__metadata__", ())
        infos += [m for m in metadata if isinstance(m, typer.models.ParameterInfo)]
        if isinstance(parameter.default, typer.models.ParameterInfo):
            infos.append(parameter.default)
    return infos


def _reflow_app(typer_app: typer.Typer) -> None:
    """Reflow every command's and option's help once, here, so no command module has to."""
    for command in typer_app.registered_commands:
        command.help = reflow(command.help or inspect.getdoc(command.callback))
        for info in _parameter_infos(command.callback):
            info.help = reflow(info.help)
    for group in typer_app.registered_groups:
        if isinstance(group.help, str):
            group.help = reflow(group.help)
        if group.typer_instance is not None:
            if isinstance(group.typer_instance.info.help, str):
                group.typer_instance.info.help = reflow(group.typer_instance.info.help)
            _reflow_app(group.typer_instance)


_reflow_app(app)


@app.callback()
def _root() -> None:
    """Measure and tune chunked prefill for LLM serving."""


def _on_signal(signum, frame) -> None:
    """SIGINT and SIGTERM: every server this process launched is stopped at once; a command that launches
    servers then stops where it checks (launch.process.check_not_stopping), any other here."""
    from chunkbench.launch.process import stop_everything

    if not stop_everything(signum):
        raise Interrupted(signum)


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one line on stderr and exit code 2, never a traceback."""
    warnings.showwarning = show_warning
    from chunkbench.launch.process import _LAUNCHED, STOPPING

    STOPPING.clear()
    _LAUNCHED.clear()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal)
    try:
        code = app(args=argv, standalone_mode=False)  # returns the code of a typer.Exit
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _stopped()
    except TyperException as exc:  # usage errors: unknown flag, bad value type
        _error(exc.format_message())
    except ConfigError as exc:
        _error(str(exc))
    except StudyFailed as exc:
        _error(str(exc), code=1)
    if code == 130:  # typer's code for a KeyboardInterrupt (ours: Interrupted, by a signal)
        _stopped()
    sys.exit(code if isinstance(code, int) else 0)


def _stopped() -> None:
    """Exit 128 + the signal (130 for Ctrl-C, 143 for SIGTERM), with one line."""
    from chunkbench.launch.process import stopped_by

    signum = stopped_by()
    print(f"chunkbench: {'terminated' if signum == signal.SIGTERM else 'interrupted'}", file=sys.stderr)
    sys.exit(128 + signum)


def _error(message: str, code: int = 2) -> None:
    """One line, whatever the user's value held (any line break in it is shown as \\n), and an exit code: 2 for
    the user's input, 1 for a study that cannot go on (StudyFailed)."""
    print("chunkbench: error: " + "\\n".join(message.splitlines()), file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    # `python -m` puts the working directory first on sys.path: from a checkout, its kernels/ (installed as
    # chunkbench.kernels) would hide Hugging Face's `kernels`, which transformers imports. Last, it hides nothing.
    sys.path.append(sys.path.pop(0))
    main()
