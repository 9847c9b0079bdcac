"""``atoll control`` as a newcomer first runs it: ``--once`` plans and delivers on its first run
(two samples, a short gap apart), fails loudly when delivery fails, ``--dry-run`` shows what it
would deliver, loop mode writes one JSON line per tick, and bundled fleets are taken by name."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from control_helpers import tiny_series

from atoll.control.replay import ReplayExporter
from atoll.control.state import STATE_FILE, load_state

CORE = ("Phi-4-14B", "GPT-OSS-20B", "Qwen3-32B")


def _main(argv: list[str]) -> tuple[int, str, str]:
    """The command in its own process (a solver another test left in a bad state must not decide
    this one's outcome)."""
    proc = subprocess.run([sys.executable, "-m", "atoll.control.cli", *argv], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[3], timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def replay() -> Iterator[ReplayExporter]:
    series = [tiny_series(f"w{i}", [2.0 + i] * 600, input_tokens=500, output_tokens=50) for i in range(3)]
    with ReplayExporter(series, list(CORE), speedup=60.0) as exporter:
        yield exporter


def _argv(replay: ReplayExporter, tmp_path: Path, sink: str, *extra: str, fleet: str = "") -> list[str]:
    where = ["--fleet", fleet] if fleet else ["--scenario", "core"]  # the scenario: the vLLM runtime
    return ["control", "--scrape", replay.url, *where, "--policy", "fixed:1",
            "--state", str(tmp_path / "state"), "--sink", sink, "--interval", "60s", "--time-scale", "60",
            "--first-gap", "1s", *extra]


def test_a_first_once_plans_and_delivers(replay: ReplayExporter, tmp_path: Path) -> None:
    code, out, err = _main(_argv(replay, tmp_path, f"json:{tmp_path / 'plans'}", "--once", "--json"))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["plan_changed"] and doc["sink_result"]["ok"], (err[-300:], doc["solve"])
    assert (tmp_path / "plans" / "latest.json").exists()
    assert "first sample taken" in err
    assert doc["wall_time"] and doc["wall_time"].endswith("+00:00") and doc["time_s"] > 0
    assert load_state(tmp_path / "state").tick == 2  # type: ignore[union-attr]


def test_a_failed_delivery_exits_non_zero(replay: ReplayExporter, tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the sink wants a folder")
    code, out, err = _main(_argv(replay, tmp_path, f"json:{blocked}", "--once", "--json"))
    assert code == 3, err
    doc = json.loads(out)
    assert doc["sink_result"]["ok"] is False and doc["pending"] is True
    assert "not delivered" in err


def test_dry_run_renders_what_it_would_deliver_and_keeps_nothing(replay: ReplayExporter,
                                                                 tmp_path: Path) -> None:
    code, out, err = _main(_argv(replay, tmp_path, f"k8s:{tmp_path / 'manifests'}", "--once", "--dry-run",
                                 "--json"))
    assert code == 0, err
    doc = json.loads(out)
    kinds = {m["kind"] for d in doc["dry_run"] for m in d["manifests"]}
    assert "Deployment" in kinds or "LeaderWorkerSet" in kinds
    assert not (tmp_path / "manifests").exists()
    assert not (tmp_path / "state" / STATE_FILE).exists()
    # without --json the manifests are printed as YAML
    code, out, _ = _main(_argv(replay, tmp_path, f"k8s:{tmp_path / 'manifests'}", "--once", "--dry-run"))
    assert code == 0 and any(d and d.get("kind") for d in yaml.safe_load_all(out.split("\n", 1)[1]))


def test_loop_mode_writes_one_json_line_per_tick(replay: ReplayExporter, tmp_path: Path) -> None:
    code, out, err = _main(_argv(replay, tmp_path, f"json:{tmp_path / 'plans'}", "--ticks", "3", "--interval",
                                 "1s", "--time-scale", "1", "--json"))
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["tick"] for line in lines[:-1]] == [0, 1, 2]
    assert all(line["wall_time"] for line in lines[:-1])
    assert lines[-1]["summary"]["ticks"] == 3


def test_a_bundled_fleet_is_taken_by_name() -> None:
    from atoll.control.live_fleet import load_fleet_file

    fleet = load_fleet_file("core")
    assert fleet.models == CORE and fleet.templates
