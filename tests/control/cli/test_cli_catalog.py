"""CLI: --json prints one document on stdout; bad names exit 2 with a clear message."""

from __future__ import annotations

import json

import pytest

from atoll.control.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_catalog_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "catalog", "--json")
    doc = json.loads(out)
    assert code == 0 and {g["name"] for g in doc["gpus"]} >= {"H100", "L40S"}
    assert {o["region"] for o in doc["offers"]} == set(doc["regions"])


def test_perf_table_json_all_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "perf", "table", "--json")
    doc = json.loads(out)
    assert code == 0 and len(doc["rows"]) == 6 * 20
    assert "Node profiles" in err
    phi_h100 = next(r for r in doc["rows"] if r["model"] == "Phi-4-14B" and r["config"] == "8xH100")
    assert phi_h100["decode_tokens_per_s"] > 0


def test_unknown_model_and_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "perf", "table", "--model", "gpt-9")
    assert code == 2 and out == "" and "unknown model 'gpt-9'" in err and "Phi-4-14B" in err
    code, _, err = run(capsys, "perf", "table", "--gpus", "B300")
    assert code == 2 and "unknown GPU type 'B300'" in err
