"""Where output goes: results on stdout, progress and errors on stderr, one JSON document with
``--json`` (also for errors), exit code 2 for user errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from atoll.control.cli import main
from atoll.control.cli.output import ProgressLog, results_table
from atoll.solvers.errors import InputError, MissingDataError, UnknownNameError


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_catalog_table_goes_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "catalog")
    assert code == 0 and "GPU types" in out and "H100" in out and err == ""


def test_catalog_redirected_to_a_file_writes_the_unfolded_table(tmp_path: Path) -> None:
    target = tmp_path / "catalog.txt"
    with target.open("w") as fh:
        proc = subprocess.run([sys.executable, "-m", "atoll.control.cli", "catalog"], stdout=fh,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""
    text = target.read_text()
    assert "GPU types" in text and "Offers" in text
    # one offer per line: the widest row is not folded onto a second line
    assert any("aws:us-east-2" in line and "on-demand" not in line and line.count("│") >= 6
               for line in text.splitlines())


def test_unknown_name_exits_2_with_plain_message(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "perf", "table", "--model", "gpt-9")
    assert code == 2 and out == ""
    assert err.startswith("error: unknown model 'gpt-9'")  # no repr quotes around the message
    assert "Traceback" not in err


def test_json_error_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "perf", "table", "--model", "gpt-9", "--json")
    doc = json.loads(out)  # exactly one JSON document
    assert code == 2 and doc["error"]["type"] == "UnknownNameError"
    message = doc["error"]["message"]
    assert message.startswith("unknown model 'gpt-9'") and "Phi-4-14B" in message
    assert "error: unknown model 'gpt-9'" in err


def test_input_error_json_type(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", "--days", "x", "--json")
    assert code == 2 and json.loads(out)["error"] == {"type": "InputError",
                                                      "message": "days 'x' must look like 11-14 or 11"}


def test_argument_errors_exit_2_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "catalog", "--bogus", "--json")
    assert code == 2 and "unrecognized arguments: --bogus" in json.loads(out)["error"]["message"]
    assert "usage:" in err
    code, out, err = run(capsys, "frobnicate")
    assert code == 2 and out == "" and "invalid choice: 'frobnicate'" in err


def test_error_classes_are_builtin_compatible() -> None:
    assert issubclass(InputError, ValueError) and issubclass(UnknownNameError, KeyError)
    assert issubclass(MissingDataError, FileNotFoundError)
    assert str(UnknownNameError("unknown x 'y'")) == "unknown x 'y'"


def test_progress_log_every_tenth_and_every_30_s() -> None:
    lines: list[str] = []
    now = [0.0]
    log = ProgressLog("train", 100, write=lines.append, monotonic=lambda: now[0])
    for _ in range(25):
        log.advance(1)
    assert lines == ["train: 10% (10/100, 0 s)", "train: 20% (20/100, 0 s)"]
    now[0] = 31.0
    log.advance(1)  # 26%: not a new tenth, but 30 s passed
    assert lines[-1] == "train: 26% (26/100, 31 s)"
    log.advance(74)
    assert lines[-1] == "train: 100% (100/100, 31 s)" and len(lines) == 4
    now[0] = 62.0
    log.advance(20)  # the total was an estimate the work outgrew: it grows, never past 100%
    assert lines[-1] == "train: 100% (120/120, 62 s)"


def test_long_command_logs_progress_lines_off_a_terminal(capsys: pytest.CaptureFixture[str],
                                                         shared_data: object) -> None:
    code, out, err = run(capsys, "simulate", "--days", "11", "--policy", "never", "--forecaster", "naive")
    assert code == 0 and "never" in out
    progress = [line for line in err.splitlines() if line.startswith("simulate never:")]
    assert progress[0].startswith("simulate never: 10%") and progress[-1].startswith("simulate never: 100%")


def test_one_results_table_for_totals_and_summaries() -> None:
    from rich.console import Console

    totals = {"cost_usd": 120.0, "goodput_share": 0.9, "slo_attainment": 0.95, "usd_per_mtok": 0.5,
              "reoptimizations": 3.0, "solver_seconds": 1.5}
    summary = {k: {"mean": v, "std": 0.0} for k, v in totals.items()}
    console = Console(width=200, record=True)
    console.print(results_table("t", {"a": totals, "b": summary}))
    text = console.export_text()
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in text.splitlines() if line.startswith("│")}
    assert rows["a"] == ["120", "90.0%", "95.0%", "0.5000", "3", "1.5"]
    assert rows["b"] == ["120 ± 0", "90.0% ± 0.0%", "95.0% ± 0.0%", "0.5000 ± 0.0000", "3 ± 0", "1.5 ± 0.0"]


@pytest.mark.parametrize(("argv", "kind", "message"), [
    (("simulate", "--policy", "sometimes"), "UnknownNameError", "unknown policy 'sometimes'"),
    (("simulate", "--policy", "fixed:0"), "InputError", "bad policy 'fixed:0'"),
    (("catalog", "--regions", "mars:1"), "UnknownNameError", "unknown region 'mars:1'"),
    (("perf", "table", "--input-tokens", "0"), "InputError", "field 'input_tokens' must be >= 1"),
    (("train", "--unserved-usd-per-mtok", "-1"), "InputError", "field 'unserved_usd_per_mtok'"),
])
def test_library_input_errors_keep_their_class(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
                                               kind: str, message: str) -> None:
    code, out, _ = run(capsys, *argv, "--forecaster", "naive", "--json") if argv[0] in ("simulate", "train") \
        else run(capsys, *argv, "--json")
    error = json.loads(out)["error"]
    assert code == 2 and error["type"] == kind and message in error["message"]


def test_templates_build_logs_progress_lines_off_a_terminal(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    code, out, err = run(capsys, "templates", "build", "--models", "Qwen3-32B", "--regions", "aws:us-east-2",
                         "--gpus", "L40S", "--n-max", "3", "--workers", "1", "--cache-dir", str(tmp_path))
    assert code == 0 and "Template library" in out
    assert "templates (multisets placed): 100%" in err
