"""Finding one's way in the CLI: help for every option of every command, the command list
``atoll --help`` gives without importing the commands, ``atoll models``, and ``--fleet`` on
``catalog`` and ``perf table`` (``--version``: test_cli_version.py)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from atoll.control.cli import COMMANDS, build_parser, main


def _parsers(parser: argparse.ArgumentParser, prog: str = "atoll"
             ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield prog, parser
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its actions there
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prog} {name}")


def test_every_option_of_every_command_has_help() -> None:
    missing = [f"{prog} {'/'.join(a.option_strings) or a.dest}"
               for prog, parser in _parsers(build_parser())
               for a in parser._actions  # noqa: SLF001
               if not isinstance(a, argparse._SubParsersAction)  # noqa: SLF001
               and not (a.help and a.help.strip()) and a.help != argparse.SUPPRESS]
    assert missing == []


def test_the_command_list_is_the_commands_own() -> None:
    """``atoll --help`` lists the commands from a table, without importing them: the table
    says what each command's own parser says."""
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
    real = {c.dest: c.help for c in sub._choices_actions}  # noqa: SLF001
    assert real == {name: help_ for name, (_, help_) in COMMANDS.items()}
    assert list(sub.choices) == list(COMMANDS)


def test_help_and_version_load_no_command() -> None:
    code = ("import sys; from atoll.control.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'mlflow', 'ray', 'stable_baselines3', 'numpy', 'atoll.envs')\n"
            "         if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out and all(name in out for name in COMMANDS)


def test_models_lists_the_catalog_and_a_fleets_own(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = [m["name"] for m in doc["models"]]
    assert names[:6] == ["Phi-4-14B", "GPT-OSS-20B", "Qwen3-32B", "Llama-3-70B", "GPT-OSS-120B",
                         "Qwen3-235B-A22B"]
    assert {m["role"] for m in doc["models"]} == {"serving", "calibration"}
    assert main(["models", "--fleet", "core", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(m["name"], m["ttft_ms"], m["tpot_ms"]) for m in doc["models"]] == [
        ("Phi-4-14B", 1200, 60), ("GPT-OSS-20B", 900, 30), ("Qwen3-32B", 1600, 100)]


def test_catalog_and_perf_table_take_a_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--fleet", "core", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["regions"] == ["aws:us-east-2", "aws:ap-northeast-2"]
    assert {o["config"].split("x", 1)[1] for o in doc["offers"]} == {"L4", "A10G", "L40S"}
    assert {o["market"] for o in doc["offers"]} == {"spot"}
    assert main(["perf", "table", "--fleet", "core", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["model"] for r in rows} == {"Phi-4-14B", "GPT-OSS-20B", "Qwen3-32B"}
    assert {r["config"].split("x", 1)[1] for r in rows} == {"L4", "A10G", "L40S"}
