"""mkdocs hook: the pages that describe the code are generated from it at build time, never copied by hand.

A page holds a marker comment, `<!-- generated: NAME -->`, and the build replaces it with
GENERATORS[NAME](): the CLI reference from the typer app (the same click objects `--help` renders) and the
knob table from engine/knobs.py. tests/cli/test_docs.py checks the CLI reference against `--help`.
Run by mkdocs (mkdocs.yml `hooks:`); `python scripts/docs_hooks.py NAME` prints one generated block."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

import typer
import typer.core
import typer.main

MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")


def _cell(text: str) -> str:
    """Table-cell safe: one line; pipes, HTML brackets (`<str>`, `<model>`) and asterisks escaped."""
    text = " ".join(str(text).split())
    for char, escaped in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("*", "\\*")):
        text = text.replace(char, escaped)
    return text


def _commands() -> list[tuple[str, typer.core.TyperCommand]]:
    """Every leaf command as (full name, click command), in --help order."""
    from chunkbench.cli import app  # the app reflows its help at import (chunkbench/cli.py)

    root = typer.main.get_command(app)
    found = []

    def walk(name: str, command) -> None:  # typer's own (vendored) click objects: groups have list_commands
        if hasattr(command, "list_commands"):
            ctx = typer.Context(command, info_name=name)
            for sub in command.list_commands(ctx):
                walk(f"{name} {sub}", command.get_command(ctx, sub))
        else:
            found.append((name, command))

    walk("chunkbench", root)
    return found


def option_rows(command) -> list[tuple[str, str, str]]:
    """(flags, type, help) for each option and argument: the help is rendered by typer's own `--help` code
    (rich_utils), its default and range included, then read back as plain text, so the two cannot differ."""
    from rich.console import Console
    from typer import rich_utils

    ctx = typer.Context(command, info_name=command.name)
    console = Console(width=100_000, color_system=None, highlight=False)
    rows = []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        is_option = isinstance(param, typer.core.TyperOption)
        if is_option:
            flags = ", ".join(param.opts + param.secondary_opts)
        else:  # an argument, named as --help names it
            flags = param.display_name_raw + ("..." if param.metavar is None and param.nargs != 1 else "")
        kind = param.display_type_rich(ctx=ctx) or ""
        with console.capture() as captured:
            console.print(rich_utils._get_parameter_help(param=param, ctx=ctx, markup_mode="rich"))
        rows.append((flags, kind, captured.get().strip()))
    return rows


def cli_reference() -> str:
    """One section per command: its help, usage and an option table."""
    out = []
    for name, command in _commands():
        ctx = typer.Context(command, info_name=name)
        usage = " ".join([name, *command.collect_usage_pieces(ctx)])
        paragraphs = "\n\n".join(_cell(p) for p in (command.help or "").split("\n\n"))
        out += [
            f"## `{name}`",
            "",
            paragraphs,
            "",
            "```",
            usage,
            "```",
            "",
            "| option | type | help |",
            "|---|---|---|",
        ]
        out += [f"| `{f}` | {_cell(k)} | {_cell(h)} |" for f, k, h in option_rows(command)]
        out.append("")
    return "\n".join(out)


def knob_table() -> str:
    """engine/knobs.py as a table: chunkbench flag, vLLM option, SGLang flag, searchable, help."""
    from chunkbench.engine.knobs import KNOBS, VLLM_VERSION

    out = [
        f"| knob | chunkbench flag | vLLM {VLLM_VERSION} option | SGLang flag | searchable | help |",
        "|---|---|---|---|---|---|",
    ]
    for knob in KNOBS.values():
        vllm = f"`--{knob.vllm}`" if knob.vllm else "chunkbench only"
        if knob.vllm_before:
            vllm += f" (earlier: {knob.vllm_before})"
        flags = ", ".join(f"`{f}`" for f in knob.cli_flags)
        sglang = f"`{knob.sglang}`" if knob.sglang else "-"
        out.append(
            f"| `{knob.name}` | {_cell(flags)} | {_cell(vllm)} | {_cell(sglang)} | "
            f"{'yes' if knob.searchable else 'no'} | {_cell(knob.help)} |"
        )
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {"cli-reference": cli_reference, "knob-table": knob_table}


def expand(markdown: str) -> str:
    """Replace each marker with its generated block; an unknown name fails the build."""

    def generate(match: re.Match[str]) -> str:
        if match.group(1) not in GENERATORS:
            raise ValueError(f"unknown generated block {match.group(1)!r}; known: {', '.join(GENERATORS)}")
        return GENERATORS[match.group(1)]()

    return MARKER.sub(generate, markdown)


def on_page_markdown(markdown: str, **_: object) -> str:
    """mkdocs event: runs on every page's markdown before it is rendered."""
    return expand(markdown)


if __name__ == "__main__":
    print(GENERATORS[sys.argv[1]]())
