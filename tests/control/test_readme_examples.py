"""The README's own examples run: the MI300X / My-8B user file through `atoll perf table`."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from atoll.control.cli import main
from atoll.solvers.perf import load_factors

README = Path(__file__).resolve().parents[2] / "README.md"


def _user_file_example() -> str:
    text = README.read_text()
    at = text.index("### Your own GPUs and models")
    match = re.search(r"```yaml\n(.*?)```", text[at:], re.S)
    assert match, "README: the user-file example is gone"
    return match.group(1)


def test_readme_mi300x_user_file_runs_perf_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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
