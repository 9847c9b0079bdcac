"""The scale-down window: a service shrinks only to the most instances the solver wanted for it
over the window (HPA's scale-down stabilization), so a dip the demand takes back within it
removes nothing; a lasting drop still scales down once the window has passed; the window's
wishes survive a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from live_harness import Harness

from atoll.control.controller import ControllerSettings
from atoll.control.live_fleet import LiveFleet
from atoll.control.state import load_state

HIGH, LOW = 40.0, 4.0  # Phi-4-14B requests/s: about six prefill instances, and one


def _run(fleet: LiveFleet, tmp: Path, window_s: float, ticks: int, low: range) -> tuple[list[int], Harness]:
    h = Harness(fleet, tmp, {"Phi-4-14B": HIGH, "GPT-OSS-20B": 5.0}, scale_down_window_s=window_s)
    counts = []
    for i in range(ticks):
        h.source.rates["Phi-4-14B"] = LOW if i in low else HIGH
        h.tick()
        counts.append(h.per_service("Phi-4-14B")[0])
    return counts, h


def test_a_dip_within_the_window_removes_nothing(fleet: LiveFleet, tmp_path: Path) -> None:
    dip = range(8, 14)  # half an hour at 5-minute ticks
    plain, h0 = _run(fleet, tmp_path / "plain", 0.0, 22, dip)
    held, h1 = _run(fleet, tmp_path / "held", 3600.0, 22, dip)
    top = max(plain)
    assert min(plain[9:16]) < top  # without the window the dip scales the service down ...
    assert held[4:] == [top] * len(held[4:])  # ... with it the service keeps its instances
    churn = [sum(a + r for _, a, r in h.controller.state.churn) for h in (h0, h1)]
    assert churn[1] < churn[0]
    saved = load_state(h1.dir)
    assert saved is not None and {s for _, s, _ in saved.desired} >= {"Phi-4-14B/prefill"}


def test_a_lasting_drop_scales_down_after_the_window(fleet: LiveFleet, tmp_path: Path) -> None:
    counts, h = _run(fleet, tmp_path, 1800.0, 26, range(8, 26))  # 90 minutes low
    top = max(counts)
    assert counts[8:12] == [top] * 4  # held while the high wishes are inside the window
    assert counts[-1] < top  # then the wishes of the low demand win
    held = [t for t in range(8, 26) if counts[t] == top]
    assert len(held) <= 1800 / 300 + 3  # the window (six ticks) and the forecast's own lag


def test_the_window_survives_a_restart(fleet: LiveFleet, tmp_path: Path) -> None:
    h = Harness(fleet, tmp_path, {"Phi-4-14B": HIGH, "GPT-OSS-20B": 5.0}, scale_down_window_s=3600.0)
    for _ in range(8):
        h.tick()
    top = h.per_service("Phi-4-14B")[0]
    h.controller = h.new()  # a restart on the same state folder
    h.source.rates["Phi-4-14B"] = LOW
    for _ in range(6):
        h.tick()
        assert h.per_service("Phi-4-14B")[0] == top


def test_the_window_is_checked() -> None:
    with pytest.raises(ValueError, match="scale_down_window_s"):
        ControllerSettings(scale_down_window_s=-1.0)
    with pytest.raises(ValueError, match="scale_down_window_s"):
        ControllerSettings(scale_down_window_s=float("nan"))
