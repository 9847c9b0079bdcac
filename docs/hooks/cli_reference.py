"""MkDocs hooks: the command-line reference generated from the ``atoll`` argparse parsers, and
the source tree mkdocstrings reads the API from.

``docs/reference/cli.md`` holds a marker line; at build time it is replaced by one section per
command (and sub-command): its usage, its description and every option with its help text, as
``atoll.control.cli.build_parser()`` defines them. The reference therefore cannot drift from the
parsers: a new option appears in the next build, a removed one disappears.

The package ``atoll`` is an implicit namespace whose subpackages setuptools maps onto the
repository's top-level folders (``envs/`` is ``atoll.envs``). Static analysis cannot follow that
mapping, so :func:`on_startup` links the folders under ``build/docs-api/atoll/`` (as ``make
typecheck`` does for mypy) and mkdocstrings reads them there (``paths`` in ``mkdocs.yml``).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

MARKER = "<!-- atoll-cli-reference -->"
USAGE_WIDTH = 96
PACKAGES = ("control", "envs", "forecast", "solvers", "training")
REPO = Path(__file__).resolve().parents[2]
API_TREE = REPO / "build" / "docs-api" / "atoll"

# Characters Markdown would read as markup inside help text.
_ESCAPE = re.compile(r"([\\`*_\[\]<>|])")


def _escape(text: str) -> str:
    return _ESCAPE.sub(lambda m: "&lt;" if m.group(1) == "<" else "&gt;" if m.group(1) == ">"
                       else "\\" + m.group(1), text)


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _option_line(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    if action.option_strings:
        if action.nargs == 0:
            name = ", ".join(action.option_strings)
        else:
            metavar = formatter._format_args(action, action.dest.upper())
            name = ", ".join(f"{opt} {metavar}" for opt in action.option_strings)
    else:
        name = formatter._format_args(action, action.dest)
    help_text = formatter._expand_help(action) if action.help else ""
    help_text = " ".join(help_text.split())
    return f"- `{name}`" + (f": {_escape(help_text)}" if help_text else "")


def _render(parser: argparse.ArgumentParser, path: list[str], level: int, out: list[str]) -> None:
    heading = "#" * level
    out.append(f"{heading} `{' '.join(path)}`\n")
    description = parser.description or ""
    if description:
        out.append(_escape(" ".join(description.split())) + "\n")
    # A fixed width, so the page does not depend on the terminal the build ran in.
    formatter = parser._get_formatter()
    formatter._width = USAGE_WIDTH
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    usage = formatter.format_help().strip()
    out.append(f"```text\n{usage}\n```\n")
    options = [a for a in parser._actions
               if not isinstance(a, argparse._SubParsersAction | argparse._HelpAction)
               and a.help != argparse.SUPPRESS]
    if options:
        out.extend(_option_line(parser, a) for a in options)
        out.append("")
    sub = _subparsers(parser)
    if sub is None:
        return
    helps = {a.dest: a.help for a in sub._choices_actions}
    for name, child in sub.choices.items():
        if not child.description and helps.get(name):
            child.description = helps[name]
        _render(child, [*path, name], min(level + 1, 4), out)


def cli_reference() -> str:
    """The Markdown of the whole command line, from the parsers the ``atoll`` command uses."""
    from atoll.control.cli import build_parser

    parser = build_parser()
    out: list[str] = []
    sub = _subparsers(parser)
    assert sub is not None, "atoll's parser has no sub-commands"
    helps = {a.dest: a.help for a in sub._choices_actions}
    for name, child in sub.choices.items():
        if not child.description and helps.get(name):
            child.description = helps[name]
        _render(child, ["atoll", name], 2, out)
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown


def link_api_tree() -> None:
    """``build/docs-api/atoll/<pkg>`` -> ``<pkg>/`` for every subpackage, idempotently."""
    API_TREE.mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        link = API_TREE / name
        target = Path("..", "..", "..", name)
        if link.is_symlink() and Path(link.readlink()) == target:
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target, target_is_directory=True)


def on_startup(**_: Any) -> None:
    # Before any plugin's on_config: mkdocstrings fixes its search paths when it sets up.
    link_api_tree()
