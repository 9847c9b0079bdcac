"""The documented examples run and say what they print: the README's three commands and the
user-file example of the docs' "GPUs, prices and models" page."""

from __future__ import annotations

import json
import re
import shlex
import statistics
from pathlib import Path

import pytest

from atoll.control.cli import build_parser, main
from atoll.solvers.perf import load_factors

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CATALOG_PAGE = ROOT / "docs" / "guide" / "catalog.md"


def _console_blocks() -> list[tuple[str, list[str]]]:
    """(command, output lines) of every ``console`` block under the README's "Three commands"."""
    text = README.read_text()
    at = text.index("## Three commands")
    section = text[at:text.index("\n## ", at + 1)]
    blocks = []
    for body in re.findall(r"```console\n(.*?)```", section, re.S):
        first, *rest = body.rstrip("\n").split("\n")
        assert first.startswith("$ atoll "), f"README: a console block starts with {first!r}"
        blocks.append((first[2:], rest))
    return blocks


def _block(prefix: str) -> tuple[list[str], list[str]]:
    for command, output in _console_blocks():
        if command.startswith(prefix):
            return shlex.split(command)[1:], output
    raise AssertionError(f"README: no console block runs {prefix!r}")


def test_readme_shows_three_commands_that_the_cli_accepts() -> None:
    blocks = _console_blocks()
    assert len(blocks) == 3
    parser = build_parser()
    for command, output in blocks:
        args = parser.parse_args(shlex.split(command)[1:])
        assert callable(args.handler)
        assert output, f"README: {command!r} shows no output"


def test_readme_perf_table_output_is_what_the_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    argv, shown = _block("atoll perf table")
    assert main(argv) == 0
    printed = [line.rstrip() for line in capsys.readouterr().out.rstrip("\n").split("\n")]
    assert printed == [line.rstrip() for line in shown]


def test_readme_solve_summary_is_the_plan_the_solver_finds(capsys: pytest.CaptureFixture[str]) -> None:
    argv, shown = _block("atoll solve")
    summary = next(line for line in shown if line.startswith("status "))
    match = re.match(r"status (\S+)\s+cost \$([0-9.]+)/h", summary)
    assert match, f"README: the solve summary line changed: {summary!r}"
    status, cost = match.groups()
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == status
    assert f"{doc['cost_per_hour']:.2f}" == cost


def _user_file_example() -> str:
    text = CATALOG_PAGE.read_text()
    at = text.index("## Your own GPUs and models")
    match = re.search(r"```yaml\n(.*?)```", text[at:], re.S)
    assert match, "docs/guide/catalog.md: the user-file example is gone"
    return match.group(1)


def test_docs_mi300x_user_file_runs_perf_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    user = tmp_path / "fleet.yaml"
    user.write_text(_user_file_example())
    code = main(["perf", "table", "--user-file", str(user), "--gpus", "MI300X,H100",
                 "--model", "My-8B,Phi-4-14B", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    rows = doc["rows"]
    assert doc["borrowed_factors"] == ["MI300X"] and "MI300X: no fitted efficiency factors" in err
    assert {r["config"] for r in rows} >= {"1xMI300X", "8xMI300X"}
    mi = [r for r in rows if r["config"] == "1xMI300X" and r["model"] == "My-8B"]
    assert mi and mi[0]["decode_tokens_per_s"] > 0


def test_a_gpu_without_fitted_factors_borrows_the_median() -> None:
    f = load_factors()
    assert f.borrowed("MI300X") and not f.borrowed("H100")
    expected = f.eta_c["default"] if "default" in f.eta_c else statistics.median(f.eta_c.values())
    assert f.compute_eff("MI300X") == expected
    assert f.memory_eff("MI300X") == (f.eta_m["default"] if "default" in f.eta_m
                                      else statistics.median(f.eta_m.values()))
