"""``--risk`` on solve (and the simulator's commands): parsed once at the edge, echoed in the
document, refused where it would not apply, and bad specs named."""

from __future__ import annotations

import json

import pytest

from atoll.control.cli import main


def _solve(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:
    code = main(["solve", "--scenario", "core", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def test_solve_with_risk_plans_more_capacity_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, plain = _solve(capsys)
    assert code == 0 and "risk" not in plain
    code, hedged = _solve(capsys, "--risk", "h0.8")
    assert code == 0 and hedged["status"] == "optimal" and hedged["risk"] == "h0.8"
    assert hedged["cost_per_hour"] > plain["cost_per_hour"]
    for svc in hedged["services"]:  # every service planned at 80% utilization
        assert svc["capacity"] >= svc["demand"] / 0.8 * (1 - 1e-6), svc


@pytest.mark.parametrize("spec", ["x0.5", "h", "h1.5", "s0.5,s0.6"])
def test_bad_risk_is_named(capsys: pytest.CaptureFixture[str], spec: str) -> None:
    code, doc = _solve(capsys, "--risk", spec)
    assert code == 2 and "--risk" in doc["error"]["message"]


def test_risk_is_refused_for_the_ladder(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = _solve(capsys, "--risk", "h0.8", "--decompose")
    assert code == 2 and "--decompose" in doc["error"]["message"]
