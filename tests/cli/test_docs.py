"""The README's and the docs' commands parse with the CLI, the generated CLI reference says what `--help` says, help
renders as paragraphs, warnings reach the user as one line in the tool's voice, and the docs site builds strictly."""

import importlib.util
import re
import shlex
import subprocess
import sys
import warnings

import pytest
import typer.main
import typer.rich_utils
from typer.exceptions import TyperException
from typer.testing import CliRunner

from chunkbench import cli, errors
from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "scripts" / "docs_hooks.py")
docs_hooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(docs_hooks)


def fenced_commands(markdown: str) -> list[str]:
    """Every `chunkbench ...` line inside a fenced block, with backslash continuations joined."""
    commands = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", markdown, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("chunkbench "):
                commands.append(line.split("  #")[0].strip())
    return commands


def parse(line: str):
    """Parse a command line the way `chunkbench` does (options, types, subcommands), without running it."""
    command, name, parent, args = typer.main.get_command(cli.app), "chunkbench", None, shlex.split(line)[1:]
    while True:
        ctx = command.make_context(name, list(args), parent=parent)
        if not hasattr(command, "list_commands"):
            return ctx
        rest = [*getattr(ctx, "_protected_args", getattr(ctx, "protected_args", [])), *ctx.args]
        name, command, args = command.resolve_command(ctx, rest)
        parent = ctx


README_COMMANDS = fenced_commands((REPO / "README.md").read_text())


def test_the_readme_shows_the_three_card_commands():
    assert {line.split()[1] for line in README_COMMANDS} >= {"tune", "compare", "gate"}


@pytest.mark.parametrize("line", README_COMMANDS)
def test_each_readme_command_parses(line):
    ctx = parse(line)
    assert ctx.command.name == line.split()[1]


PLACEHOLDERS = {"M": "small", "N": "1", "URL": "http://127.0.0.1:8000/v1"}


def docs_commands() -> list[tuple[str, str]]:
    """(page, command line) for the docs' fenced `chunkbench ...` lines, shell syntax and placeholders resolved:
    a trailing `&` dropped, an optional `[--flag]` taken, M/N/URL given a value."""
    found = []
    for page in sorted((REPO / "docs").rglob("*.md")):
        for line in fenced_commands(page.read_text()):
            line = re.sub(r"\[(--[^\]]+)\]", r"\1", line.removesuffix("&").strip())
            found.append(
                (str(page.relative_to(REPO)), shlex.join(PLACEHOLDERS.get(word, word) for word in shlex.split(line)))
            )
    return found


@pytest.mark.parametrize("page,line", docs_commands())
def test_each_docs_command_parses(page, line):
    assert parse(line).command.name == line.split()[1]


@pytest.mark.parametrize(
    "line",
    [
        "chunkbench tune --model llama-3-8b --sla-ttfx 300ms",
        "chunkbench compare continuous --num-requests twelve",
        "chunkbench tunes",
    ],
)
def test_a_wrong_command_fails_to_parse(line):
    with pytest.raises(TyperException):
        parse(line)


def rendered_help(args: list[str], monkeypatch) -> str:
    """`chunkbench ARGS --help` as typer renders it, wide enough that nothing wraps, box lines removed and
    whitespace collapsed."""
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 20_000)
    monkeypatch.setattr(typer.rich_utils, "COLOR_SYSTEM", None)
    result = CliRunner().invoke(cli.app, [*args, "--help"])
    assert result.exit_code == 0, result.output
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())


def test_the_cli_reference_is_what_help_says(monkeypatch):
    commands = docs_hooks._commands()
    assert {name for name, _ in commands} >= {
        f"chunkbench {c}" for c in ("run", "compare", "tune", "gate", "serve", "bench", "kernels check")
    }
    for name, command in commands:
        text = rendered_help(name.split()[1:], monkeypatch)
        assert " ".join(command.help.split()) in text, name
        for flags, _, help_text in docs_hooks.option_rows(command):
            assert flags.split(",")[0] in text, (name, flags)
            assert " ".join(help_text.split()) in text, (name, flags)
    reference = docs_hooks.expand("<!-- generated: cli-reference -->")
    assert "## `chunkbench tune`" in reference and "`--sla-ttft`" in reference


def test_help_text_is_paragraphs_not_source_lines():
    assert (
        cli.reflow("one line\n    wrapped here\n\nsecond paragraph\nwrapped")
        == "one line wrapped here\n\nsecond paragraph wrapped"
    )
    assert cli.reflow("\b\nkept\nas is") == "\b\nkept\nas is"
    for name, command in docs_hooks._commands():
        assert all("\n" not in p for p in command.help.split("\n\n")), name
        assert all("\n" not in (param.help or "") for param in command.params), name


def test_a_warning_is_one_line_in_the_tools_voice(capsys):
    saved = warnings.showwarning
    try:
        with pytest.raises(SystemExit):
            cli.main(["--help"])
        capsys.readouterr()
        errors._warned.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            for _ in range(2):
                warnings.warn("1 of 12 requests were clipped\nto max_model_len (2048)", UserWarning, stacklevel=1)
        err = capsys.readouterr().err
    finally:
        warnings.showwarning = saved
    assert err == "chunkbench: warning: 1 of 12 requests were clipped to max_model_len (2048)\n"


def test_the_docs_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "chunkbench tune" in (tmp_path / "reference" / "cli" / "index.html").read_text()
